// TensorRT IPluginV3 adapter of fdpp::FlatGemm: translates tensors and attributes, calls fdpp::gemm::run_gemm.
#include "FlatGemmPlugin/FlatGemmPlugin.h"

#include <exception>
#include <stdexcept>
#include <string>

#include "common/fields.h"
#include "common/logger.h"
#include "common/registry.h"
#include "fdpp_contract_constants.h"

namespace fdpp {
namespace {

constexpr const char* kPluginName = contract::kFlatGemmOp;                // = the ONNX op type in domain "fdpp"
constexpr const char* kPluginVersion = contract::kFlatGemmVersionString;  // = the node's plugin_version
constexpr const char* kPluginNamespace = "";                              // the ONNX parser's default plugin_namespace

using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

void log_error(const std::string& message) noexcept { log_plugin_error(kPluginName, message); }

int64_t leading_product(const nvinfer1::Dims& d) {
  int64_t m = 1;
  for (int i = 0; i + 1 < d.nbDims; ++i) m *= d.d[i];
  return m;
}

bool is_supported_type(nvinfer1::DataType t) {
  return t == nvinfer1::DataType::kHALF || t == nvinfer1::DataType::kBF16;
}

gemm::Dtype to_dtype(nvinfer1::DataType t) {
  return t == nvinfer1::DataType::kBF16 ? gemm::Dtype::kBFloat16 : gemm::Dtype::kFloat16;
}

// implb_loader spellings (the contract's choices) and the kernels' codes.
int32_t loader_code(const std::string& loader) {
  if (loader == "tma") return gemm::kLoaderTma;
  if (loader == "rows") return gemm::kLoaderRows;
  if (loader == "rows1") return gemm::kLoaderRows1;
  if (loader == "pair") return gemm::kLoaderPair;
  throw std::invalid_argument("implb_loader '" + loader + "' is not tma, rows, rows1 or pair");
}

const char* loader_name(int32_t code) {
  return code == gemm::kLoaderRows    ? "rows"
         : code == gemm::kLoaderRows1 ? "rows1"
         : code == gemm::kLoaderPair  ? "pair"
                                      : "tma";
}

int32_t implc_code(const std::string& implc) {
  if (implc == "cutlass") return static_cast<int32_t>(gemm::Impl::kCutlass);
  if (implc == "cublaslt" || implc == "cublas") return static_cast<int32_t>(gemm::Impl::kCublasLt);
  throw std::invalid_argument("implc '" + implc + "' is not cutlass, cublaslt or cublas");
}

}  // namespace

FlatGemmAttributes FlatGemmAttributes::parse(const nvinfer1::PluginFieldCollection* fc) {
  FlatGemmAttributes a;  // the contract's defaults for the optional fields
  a.plan.implb = gemm::ImplBConfig{contract::kFlatGemmNTileDefault, contract::kFlatGemmKTileDefault,
                                   contract::kFlatGemmStagesDefault, contract::kFlatGemmSplitKDefault,
                                   loader_code(contract::kFlatGemmLoaderDefault)};
  a.plan.implc = implc_code(a.implc);
  bool have_m1 = false, have_m2 = false;
  for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
    const PluginField& f = fc->fields[i];
    const std::string name = f.name ? f.name : "";
    if (name == "epilogue") {
      a.epilogue = read_string(f);
      if (a.epilogue != "none" && a.epilogue != "silu_mul" && a.epilogue != "residual")
        throw std::invalid_argument("epilogue '" + a.epilogue + "' is not none, silu_mul or residual");
    } else if (name == "has_bias") {
      a.has_bias = static_cast<int32_t>(read_int(f, 0, 1));
    } else if (name == "m1" || name == "m2") {
      const auto m =
          static_cast<int32_t>(read_int(f, contract::kFlatGemmThresholdMin, contract::kFlatGemmThresholdMax));
      (name == "m1" ? a.plan.m1 : a.plan.m2) = m;
      (name == "m1" ? have_m1 : have_m2) = true;
    } else if (name == "implb_n_tile") {
      a.plan.implb.n_tile = static_cast<int32_t>(read_int_choice(f, contract::kFlatGemmNTiles));
    } else if (name == "implb_k_tile") {
      a.plan.implb.k_tile = static_cast<int32_t>(read_int_choice(f, contract::kFlatGemmKTiles));
    } else if (name == "implb_stages") {
      a.plan.implb.stages =
          static_cast<int32_t>(read_int(f, contract::kFlatGemmStagesMin, contract::kFlatGemmStagesMax));
    } else if (name == "implb_split_k") {
      a.plan.implb.split_k =
          static_cast<int32_t>(read_int(f, contract::kFlatGemmSplitKMin, contract::kFlatGemmSplitKMax));
    } else if (name == "implb_loader") {
      a.plan.implb.loader = loader_code(read_string(f));
    } else if (name == "implc") {
      a.implc = read_string(f);
      a.plan.implc = implc_code(a.implc);
    } else if (name == "profile") {
      a.profile = read_string(f);
    } else if (name == "plugin_version" || name == "plugin_namespace") {
      // Routing fields the ONNX parser may pass along.
    } else {
      throw std::invalid_argument("unknown attribute '" + name + "'");
    }
  }
  if (!have_m1 || !have_m2) throw std::invalid_argument("attributes m1 and m2 are required");
  if (const char* why = gemm::plan_problem(a.plan)) throw std::invalid_argument(why);
  return a;
}

// ---- plugin ---------------------------------------------------------------------------------------------------
FlatGemmPlugin::FlatGemmPlugin(FlatGemmAttributes attributes) : attrs_(std::move(attributes)) {}

gemm::Epilogue FlatGemmPlugin::kernel_epilogue() const {
  return attrs_.epilogue == "silu_mul" ? gemm::Epilogue::kSiluMul : gemm::Epilogue::kNone;
}

nvinfer1::IPluginCapability* FlatGemmPlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept {
  try {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
  } catch (...) {
  }
  return nullptr;
}

nvinfer1::IPluginV3* FlatGemmPlugin::clone() noexcept {
  try {
    return new FlatGemmPlugin(attrs_);
  } catch (const std::exception& e) {
    log_error(std::string("clone failed: ") + e.what());
    return nullptr;
  }
}

const char* FlatGemmPlugin::getPluginName() const noexcept { return kPluginName; }
const char* FlatGemmPlugin::getPluginVersion() const noexcept { return kPluginVersion; }
const char* FlatGemmPlugin::getPluginNamespace() const noexcept { return kPluginNamespace; }

int32_t FlatGemmPlugin::getNbOutputs() const noexcept { return 1; }

int32_t FlatGemmPlugin::configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                                        const nvinfer1::DynamicPluginTensorDesc* /*out*/, int32_t nbOutputs) noexcept {
  try {
    if (nbInputs != attrs_.num_inputs() || nbOutputs != 1) {
      log_error("expected " + std::to_string(attrs_.num_inputs()) + " inputs (x, weight" +
                (attrs_.has_bias ? ", bias" : "") + (attrs_.epilogue == "residual" ? ", residual" : "") +
                ") and 1 output, got " + std::to_string(nbInputs) + " and " + std::to_string(nbOutputs));
      return -1;
    }
    const nvinfer1::Dims& x = in[0].desc.dims;
    const nvinfer1::Dims& w = in[1].desc.dims;
    if (w.nbDims != 2 || x.nbDims < 1) {
      log_error("weight must be 2-D [N, K] and x at least 1-D");
      return -1;
    }
    const int64_t n = w.d[0], k = w.d[1];
    if (k >= 0 && x.d[x.nbDims - 1] >= 0 && x.d[x.nbDims - 1] != k) {
      log_error("x's last dimension differs from the weight's K");
      return -1;
    }
    if (k > 0 && k % 8 != 0) {
      log_error("K = " + std::to_string(k) + " is not a multiple of 8 (the kernels load 16 bytes at a time)");
      return -1;
    }
    if (attrs_.epilogue == "silu_mul" && n > 0 && n % 2 != 0) {
      log_error("silu_mul needs an even N (gate rows then up rows)");
      return -1;
    }
    gemm::DeviceInfo dev;
    if (k > 0 && gemm::current_device_info(&dev) == cudaSuccess) {
      if (const char* why = gemm::implb_config_problem(attrs_.plan.implb, k, 1, dev.max_smem_optin, dev.cc_major)) {
        log_error(std::string("ImplB config from the profile cannot run on this GPU: ") + why);
        return -1;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    log_error(std::string("configurePlugin: ") + e.what());
    return -1;
  } catch (...) {
    log_error("configurePlugin: unknown exception");
    return -1;
  }
}

int32_t FlatGemmPlugin::getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                                           const nvinfer1::DataType* inputTypes, int32_t nbInputs) const noexcept {
  try {
    if (nbOutputs != 1 || nbInputs < 1) return -1;
    outputTypes[0] = inputTypes[0];
    return 0;
  } catch (...) {
    return -1;
  }
}

int32_t FlatGemmPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                                        const nvinfer1::DimsExprs* /*shapeInputs*/, int32_t /*nbShapeInputs*/,
                                        nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                                        nvinfer1::IExprBuilder& exprBuilder) noexcept {
  try {
    if (nbInputs < 2 || nbOutputs != 1 || inputs[1].nbDims != 2 || inputs[0].nbDims < 1) return -1;
    outputs[0].nbDims = inputs[0].nbDims;
    for (int i = 0; i + 1 < inputs[0].nbDims; ++i) outputs[0].d[i] = inputs[0].d[i];
    const nvinfer1::IDimensionExpr* n = inputs[1].d[0];
    if (attrs_.epilogue == "silu_mul")
      n = exprBuilder.operation(nvinfer1::DimensionOperation::kFLOOR_DIV, *n, *exprBuilder.constant(2));
    outputs[0].d[inputs[0].nbDims - 1] = n;
    return 0;
  } catch (const std::exception& e) {
    log_error(std::string("getOutputShapes: ") + e.what());
    return -1;
  } catch (...) {
    return -1;
  }
}

bool FlatGemmPlugin::supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* inOut,
                                               int32_t nbInputs, int32_t nbOutputs) noexcept {
  try {
    if (pos < 0 || pos >= nbInputs + nbOutputs) return false;
    const nvinfer1::PluginTensorDesc& d = inOut[pos].desc;
    if (d.format != nvinfer1::TensorFormat::kLINEAR) return false;
    // float32 is in the contract for the CPU reference; these kernels run float16 and bfloat16 only.
    if (pos == 0) return is_supported_type(d.type);
    return d.type == inOut[0].desc.type;
  } catch (...) {
    return false;
  }
}

size_t FlatGemmPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                                        const nvinfer1::DynamicPluginTensorDesc* /*outputs*/,
                                        int32_t /*nbOutputs*/) const noexcept {
  try {
    if (nbInputs < 2) return 0;
    const int64_t max_m = leading_product(inputs[0].max);
    const int64_t n = inputs[1].max.d[0];
    if (max_m <= 0 || n <= 0) return 0;
    return gemm::workspace_bytes(max_m, n, kernel_epilogue(), to_dtype(inputs[0].desc.type), attrs_.plan);
  } catch (...) {
    return 0;
  }
}

int32_t FlatGemmPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                                      const nvinfer1::PluginTensorDesc* /*out*/, int32_t nbOutputs) noexcept {
  try {
    if (nbInputs != attrs_.num_inputs() || nbOutputs != 1) return -1;
    if (!is_supported_type(in[0].type)) {
      log_error("x must be float16 or bfloat16");
      return -1;
    }
    return 0;
  } catch (...) {
    return -1;
  }
}

int32_t FlatGemmPlugin::enqueue(const nvinfer1::PluginTensorDesc* inputDesc,
                                const nvinfer1::PluginTensorDesc* /*outputDesc*/, const void* const* inputs,
                                void* const* outputs, void* workspace, cudaStream_t stream) noexcept {
  try {
    gemm::Problem p;
    p.m = leading_product(inputDesc[0].dims);
    if (p.m == 0) return 0;
    p.n = inputDesc[1].dims.d[0];
    p.k = inputDesc[1].dims.d[1];
    p.x = inputs[0];
    p.w = inputs[1];
    p.bias = attrs_.has_bias ? inputs[2] : nullptr;
    p.residual = attrs_.epilogue == "residual" ? inputs[2 + attrs_.has_bias] : nullptr;
    p.y = outputs[0];
    p.dtype = to_dtype(inputDesc[0].type);
    p.epilogue = kernel_epilogue();
    if (const char* why = gemm::problem_problem(p)) {
      log_error(why);
      return -1;
    }
    // TensorRT allocated getWorkspaceSize() for the largest M; this M needs at most that.
    const size_t ws = gemm::workspace_bytes(p.m, p.n, p.epilogue, p.dtype, attrs_.plan);
    const cudaError_t err = gemm::run_gemm(p, attrs_.plan, gemm::Impl::kAuto, nullptr, 8, workspace, ws, stream);
    if (err != cudaSuccess) {
      const std::string detail = gemm::last_detail();
      log_error(std::string("enqueue: ") + cudaGetErrorString(err) + (detail.empty() ? "" : " (" + detail + ")"));
      return -1;
    }
    return 0;
  } catch (const std::exception& e) {
    log_error(std::string("enqueue: ") + e.what());
    return -1;
  } catch (...) {
    log_error("enqueue: unknown exception");
    return -1;
  }
}

nvinfer1::IPluginV3* FlatGemmPlugin::attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept {
  return clone();
}

const nvinfer1::PluginFieldCollection* FlatGemmPlugin::getFieldsToSerialize() noexcept {
  try {
    ints_ = {attrs_.has_bias,          attrs_.plan.m1,           attrs_.plan.m2,           attrs_.plan.implb.n_tile,
             attrs_.plan.implb.k_tile, attrs_.plan.implb.stages, attrs_.plan.implb.split_k};
    fields_.clear();
    auto text = [&](const char* name, const std::string& value) {
      fields_.emplace_back(name, value.c_str(), PluginFieldType::kCHAR, static_cast<int32_t>(value.size() + 1));
    };
    const char* int_names[] = {"has_bias", "m1", "m2", "implb_n_tile", "implb_k_tile", "implb_stages", "implb_split_k"};
    text("epilogue", attrs_.epilogue);
    for (size_t i = 0; i < ints_.size(); ++i) fields_.emplace_back(int_names[i], &ints_[i], PluginFieldType::kINT32, 1);
    loader_ = loader_name(attrs_.plan.implb.loader);
    text("implb_loader", loader_);
    text("implc", attrs_.implc);
    text("profile", attrs_.profile);
    collection_.nbFields = static_cast<int32_t>(fields_.size());
    collection_.fields = fields_.data();
    return &collection_;
  } catch (const std::exception& e) {
    log_error(std::string("getFieldsToSerialize: ") + e.what());
    return nullptr;
  }
}

// ---- creator --------------------------------------------------------------------------------------------------
FlatGemmPluginCreator::FlatGemmPluginCreator() {
  fields_.emplace_back("epilogue", nullptr, PluginFieldType::kCHAR, 0);
  for (const char* name : {"has_bias", "m1", "m2", "implb_n_tile", "implb_k_tile", "implb_stages", "implb_split_k"})
    fields_.emplace_back(name, nullptr, PluginFieldType::kINT32, 1);
  fields_.emplace_back("implb_loader", nullptr, PluginFieldType::kCHAR, 0);
  fields_.emplace_back("implc", nullptr, PluginFieldType::kCHAR, 0);
  fields_.emplace_back("profile", nullptr, PluginFieldType::kCHAR, 0);
  collection_.nbFields = static_cast<int32_t>(fields_.size());
  collection_.fields = fields_.data();
}

nvinfer1::IPluginV3* FlatGemmPluginCreator::createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                                         nvinfer1::TensorRTPhase /*phase*/) noexcept {
  try {
    return new FlatGemmPlugin(FlatGemmAttributes::parse(fc));
  } catch (const std::exception& e) {
    log_error(std::string("cannot create '") + (name ? name : "") + "': " + e.what());
    return nullptr;
  } catch (...) {
    log_error("createPlugin: unknown exception");
    return nullptr;
  }
}

const nvinfer1::PluginFieldCollection* FlatGemmPluginCreator::getFieldNames() noexcept { return &collection_; }
const char* FlatGemmPluginCreator::getPluginName() const noexcept { return kPluginName; }
const char* FlatGemmPluginCreator::getPluginVersion() const noexcept { return kPluginVersion; }
const char* FlatGemmPluginCreator::getPluginNamespace() const noexcept { return kPluginNamespace; }

nvinfer1::IPluginCreatorInterface* flatGemmPluginCreator() {
  static FlatGemmPluginCreator creator;
  return &creator;
}

}  // namespace fdpp
