// TensorRT IPluginV3 adapter of fdpp::FlatGemm: translates tensors and attributes, calls fdpp::gemm::run_gemm.
#include "FlatGemmPlugin/FlatGemmPlugin.h"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "common/fields.h"
#include "common/registry.h"
#include "fdpp_contract_constants.h"

namespace fdpp {
namespace {

using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;
using Spec = AttributeSpec<FlatGemmAttributes>;

int64_t leading_product(const nvinfer1::Dims& d) {
  int64_t m = 1;
  for (int i = 0; i + 1 < d.nbDims; ++i) m *= d.d[i];
  return m;
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
  if (loader == "wgmma") return gemm::kLoaderWgmma;
  throw std::invalid_argument("implb_loader '" + loader + "' is not tma, rows, rows1, pair or wgmma");
}

const char* loader_name(int32_t code) {
  return code == gemm::kLoaderRows    ? "rows"
         : code == gemm::kLoaderRows1 ? "rows1"
         : code == gemm::kLoaderPair  ? "pair"
         : code == gemm::kLoaderWgmma ? "wgmma"
                                      : "tma";
}

int32_t implc_code(const std::string& implc) {
  if (implc == "cutlass") return static_cast<int32_t>(gemm::Impl::kCutlass);
  if (implc == "cublaslt" || implc == "cublas") return static_cast<int32_t>(gemm::Impl::kCublasLt);
  throw std::invalid_argument("implc '" + implc + "' is not cutlass, cublaslt or cublas");
}

constexpr const char* kEpilogues[] = {"none", "silu_mul", "residual"};

// The contract's attributes (names, ranges, defaults: contract.json through fdpp_contract_constants.h). A new
// attribute is a new row here and a member of FlatGemmAttributes.
const Spec kAttributes[] = {
    {"epilogue", PluginFieldType::kCHAR, false,
     [](const PluginField& f, FlatGemmAttributes& a) { a.epilogue = read_string_choice(f, kEpilogues); },
     [](const FlatGemmAttributes& a) { return text_value(a.epilogue); }},
    {"has_bias", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) { a.has_bias = read_int32(f, 0, 1); },
     [](const FlatGemmAttributes& a) { return int_value(a.has_bias); }},
    {"m1", PluginFieldType::kINT32, true,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.m1 = read_int32(f, contract::kFlatGemmThresholdMin, contract::kFlatGemmThresholdMax);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.m1); }},
    {"m2", PluginFieldType::kINT32, true,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.m2 = read_int32(f, contract::kFlatGemmThresholdMin, contract::kFlatGemmThresholdMax);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.m2); }},
    // 0 (absent) reads as m3 = m2 (parse resolves it), and m3 = m2 is written back as 0: its range stops at 256.
    {"m3", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.m3 = read_int32(f, contract::kFlatGemmM3Min, contract::kFlatGemmM3Max);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.m3 == a.plan.m2 ? 0 : a.plan.m3); }},
    {"implb_n_tile", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.implb.n_tile = read_int_choice(f, contract::kFlatGemmNTiles);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.implb.n_tile); }},
    {"implb_k_tile", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.implb.k_tile = read_int_choice(f, contract::kFlatGemmKTiles);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.implb.k_tile); }},
    {"implb_stages", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.implb.stages = read_int32(f, contract::kFlatGemmStagesMin, contract::kFlatGemmStagesMax);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.implb.stages); }},
    {"implb_split_k", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.implb.split_k = read_int32(f, contract::kFlatGemmSplitKMin, contract::kFlatGemmSplitKMax);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.implb.split_k); }},
    {"implb_loader", PluginFieldType::kCHAR, false,
     [](const PluginField& f, FlatGemmAttributes& a) { a.plan.implb.loader = loader_code(read_string(f)); },
     [](const FlatGemmAttributes& a) { return text_value(loader_name(a.plan.implb.loader)); }},
    {"implb_wgmma_stages", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.wgmma.stages = read_int32(f, contract::kFlatGemmWgmmaStagesMin, contract::kFlatGemmWgmmaStagesMax);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.wgmma.stages); }},
    {"implb_wgmma_split_k", PluginFieldType::kINT32, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.plan.wgmma.split_k = read_int32(f, contract::kFlatGemmWgmmaSplitKMin, contract::kFlatGemmWgmmaSplitKMax);
     },
     [](const FlatGemmAttributes& a) { return int_value(a.plan.wgmma.split_k); }},
    {"implc", PluginFieldType::kCHAR, false,
     [](const PluginField& f, FlatGemmAttributes& a) {
       a.implc = read_string(f);
       a.plan.implc = implc_code(a.implc);
     },
     [](const FlatGemmAttributes& a) { return text_value(a.implc); }},
    {"profile", PluginFieldType::kCHAR, false,
     [](const PluginField& f, FlatGemmAttributes& a) { a.profile = read_string(f); },
     [](const FlatGemmAttributes& a) { return text_value(a.profile); }},
};

}  // namespace

FlatGemmAttributes FlatGemmAttributes::parse(const nvinfer1::PluginFieldCollection* fc) {
  FlatGemmAttributes defaults;  // the contract's defaults for the optional fields
  defaults.plan.implb = gemm::ImplBConfig{contract::kFlatGemmNTileDefault, contract::kFlatGemmKTileDefault,
                                          contract::kFlatGemmStagesDefault, contract::kFlatGemmSplitKDefault,
                                          loader_code(contract::kFlatGemmLoaderDefault)};
  defaults.plan.implc = implc_code(defaults.implc);
  defaults.plan.m3 = contract::kFlatGemmM3Default;
  // The wgmma range's config: its tiling and loader are fixed, its stages and split_k are attributes.
  defaults.plan.wgmma = gemm::ImplBConfig{gemm::kWgmmaRows, gemm::kWgmmaKStep, contract::kFlatGemmWgmmaStagesDefault,
                                          contract::kFlatGemmWgmmaSplitKDefault, gemm::kLoaderWgmma};
  FlatGemmAttributes a = parse_attributes(fc, FlatGemmPlugin::attributes(), defaults);
  if (a.plan.m3 == 0) a.plan.m3 = a.plan.m2;  // the contract: absent or 0 means no wgmma range
  // the constraint m1 <= m2, and m3's (>= m2; a wgmma range up to 256 after an m2 <= 64)
  if (const char* why = gemm::plan_problem(a.plan)) throw std::invalid_argument(why);
  return a;
}

// ---- plugin ---------------------------------------------------------------------------------------------------
FlatGemmPlugin::FlatGemmPlugin(FlatGemmAttributes attributes) : PluginBase(std::move(attributes)), plan_(attrs_.plan) {}

AttributeTable<FlatGemmAttributes> FlatGemmPlugin::attributes() { return kAttributes; }

gemm::Epilogue FlatGemmPlugin::kernel_epilogue() const {
  return attrs_.epilogue == "silu_mul" ? gemm::Epilogue::kSiluMul : gemm::Epilogue::kNone;
}

bool FlatGemmPlugin::prepare_library_gemm(const nvinfer1::PluginTensorDesc* in) const {
  gemm::Problem p;
  p.m = leading_product(in[0].dims);
  p.n = in[1].dims.d[0];
  p.k = in[1].dims.d[1];
  if (p.m <= 0 || gemm::select_impl(p.m, plan_) != gemm::Impl::kCublasLt) return true;
  // cuBLASLt's plan depends on the shape and the pointers' alignment: TensorRT's buffers are 256-byte aligned.
  void* const aligned = reinterpret_cast<void*>(uintptr_t{256});
  p.x = p.w = aligned;
  p.y = aligned;
  p.bias = attrs_.has_bias ? aligned : nullptr;
  p.residual = attrs_.epilogue == "residual" ? aligned : nullptr;
  p.dtype = to_dtype(in[0].type);
  p.epilogue = kernel_epilogue();
  const cudaError_t err = gemm::prepare_implc_cublaslt(p);
  if (err != cudaSuccess) {
    log_error(std::string("cuBLASLt plan for M = ") + std::to_string(p.m) + ": " + cudaGetErrorString(err) + " (" +
              gemm::last_detail() + ")");
    return false;
  }
  return true;
}

bool FlatGemmPlugin::resolve_plan(int64_t n, int64_t k) {
  plan_ = attrs_.plan;
  gemm::DeviceInfo dev;
  if (n <= 0 || k <= 0 || gemm::current_device_info(&dev) != cudaSuccess) return true;  // no GPU: checked at run time
  if (attrs_.profile == contract::kFlatGemmProfileDefault)
    plan_.implb = gemm::default_implb_config(n, k, attrs_.epilogue == "silu_mul", dev.num_sms, dev.cc_major);
  if (const char* why = gemm::implb_config_problem(plan_.implb, k, 1, dev.max_smem_optin, dev.cc_major)) {
    log_error(std::string("ImplB config from the profile cannot run on this GPU: ") + why);
    return false;
  }
  if (plan_.m3 > plan_.m2) {
    if (const char* why = gemm::implb_config_problem(plan_.wgmma, k, 1, dev.max_smem_optin, dev.cc_major)) {
      log_error(std::string("the wgmma range's ImplB config (m3 > m2) cannot run on this GPU: ") + why +
                "; rewrite with a profile made on this GPU");
      return false;
    }
  }
  return true;
}

int32_t FlatGemmPlugin::configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                                        const nvinfer1::DynamicPluginTensorDesc* /*out*/, int32_t nbOutputs) noexcept {
  return guarded<FlatGemmPlugin>("configurePlugin", -1, [&] {
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
    return resolve_plan(n, k) ? 0 : -1;
  });
}

int32_t FlatGemmPlugin::getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                                           const nvinfer1::DataType* inputTypes, int32_t nbInputs) const noexcept {
  return guarded<FlatGemmPlugin>("getOutputDataTypes", -1, [&] {
    if (nbOutputs != 1 || nbInputs < 1) return -1;
    outputTypes[0] = inputTypes[0];
    return 0;
  });
}

int32_t FlatGemmPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                                        const nvinfer1::DimsExprs* /*shapeInputs*/, int32_t /*nbShapeInputs*/,
                                        nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                                        nvinfer1::IExprBuilder& exprBuilder) noexcept {
  return guarded<FlatGemmPlugin>("getOutputShapes", -1, [&] {
    if (nbInputs < 2 || nbOutputs != 1 || inputs[1].nbDims != 2 || inputs[0].nbDims < 1) return -1;
    outputs[0].nbDims = inputs[0].nbDims;
    for (int i = 0; i + 1 < inputs[0].nbDims; ++i) outputs[0].d[i] = inputs[0].d[i];
    const nvinfer1::IDimensionExpr* n = inputs[1].d[0];
    if (attrs_.epilogue == "silu_mul")
      n = exprBuilder.operation(nvinfer1::DimensionOperation::kFLOOR_DIV, *n, *exprBuilder.constant(2));
    outputs[0].d[inputs[0].nbDims - 1] = n;
    return 0;
  });
}

size_t FlatGemmPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                                        const nvinfer1::DynamicPluginTensorDesc* /*outputs*/,
                                        int32_t /*nbOutputs*/) const noexcept {
  return guarded<FlatGemmPlugin>("getWorkspaceSize", size_t{0}, [&]() -> size_t {
    if (nbInputs < 2) return 0;
    const int64_t max_m = leading_product(inputs[0].max);
    const int64_t n = inputs[1].max.d[0];
    if (max_m <= 0 || n <= 0) return 0;
    return gemm::workspace_bytes(max_m, n, kernel_epilogue(), to_dtype(inputs[0].desc.type), plan_);
  });
}

int32_t FlatGemmPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                                      const nvinfer1::PluginTensorDesc* /*out*/, int32_t nbOutputs) noexcept {
  return guarded<FlatGemmPlugin>("onShapeChange", -1, [&] {
    if (nbInputs != attrs_.num_inputs() || nbOutputs != 1) return -1;
    if (!is_kernel_type(in[0].type)) {
      log_error("x must be float16 or bfloat16");
      return -1;
    }
    if (in[1].dims.nbDims != 2) {
      log_error("weight must be 2-D [N, K]");
      return -1;
    }
    if (!resolve_plan(in[1].dims.d[0], in[1].dims.d[1])) return -1;
    return prepare_library_gemm(in) ? 0 : -1;
  });
}

int32_t FlatGemmPlugin::enqueue(const nvinfer1::PluginTensorDesc* inputDesc,
                                const nvinfer1::PluginTensorDesc* /*outputDesc*/, const void* const* inputs,
                                void* const* outputs, void* workspace, cudaStream_t stream) noexcept {
  return guarded<FlatGemmPlugin>("enqueue", -1, [&] {
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
    const size_t ws = gemm::workspace_bytes(p.m, p.n, p.epilogue, p.dtype, plan_);
    const cudaError_t err = gemm::run_gemm(p, plan_, gemm::Impl::kAuto, nullptr, 8, workspace, ws, stream);
    return cuda_status("enqueue", err, gemm::last_detail());
  });
}

nvinfer1::IPluginCreatorInterface* flatGemmPluginCreator() { return creator_of<FlatGemmPlugin>(); }

}  // namespace fdpp
