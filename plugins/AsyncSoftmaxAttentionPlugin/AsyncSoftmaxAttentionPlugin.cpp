// TensorRT IPluginV3 adapter of fdpp::AsyncSoftmaxAttention: translates tensors and attributes, calls
// fdpp::attention_forward. The key/value inputs are the caches; an engine aliases them to the updated caches.
#include "AsyncSoftmaxAttentionPlugin/AsyncSoftmaxAttentionPlugin.h"

#include <exception>
#include <stdexcept>
#include <string>

#include "common/fields.h"
#include "common/logger.h"
#include "common/registry.h"

namespace fdpp {
namespace {

constexpr const char* kPluginName = contract::kAttentionOp;                // = the ONNX op type in domain "fdpp"
constexpr const char* kPluginVersion = contract::kAttentionVersionString;  // = contract.json "version"
constexpr const char* kPluginNamespace = "";

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

void log_error(const std::string& message) noexcept { log_plugin_error(kPluginName, message); }

bool is_supported_type(DataType t) { return t == DataType::kHALF || t == DataType::kBF16; }

}  // namespace

// ---- attributes (names, ranges and defaults: contract.json, through fdpp_contract_constants.h) ----------------
AttentionAttributes AttentionAttributes::parse(const nvinfer1::PluginFieldCollection* fc) {
  AttentionAttributes a;
  bool have_scale = false, have_heads = false, have_kv_heads = false, have_dim = false;
  for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
    const PluginField& f = fc->fields[i];
    const std::string name = f.name ? f.name : "";
    if (name == "scale") {
      a.scale = read_float(f, contract::kAttentionScaleMin, contract::kAttentionScaleMax), have_scale = true;
    } else if (name == "phi") {
      a.phi = read_float(f, contract::kAttentionPhiMin, contract::kAttentionPhiMax);
    } else if (name == "guard_lo") {
      a.guard_lo = read_float(f, contract::kAttentionGuardLoMin, contract::kAttentionGuardLoMax);
    } else if (name == "guard_hi") {
      a.guard_hi = read_float(f, contract::kAttentionGuardHiMin, contract::kAttentionGuardHiMax);
    } else if (name == "mask_mode") {
      a.mask_mode = read_string(f);
      if (a.mask_mode != "past_len" && a.mask_mode != "bias" && a.mask_mode != "none")
        throw std::invalid_argument("mask_mode '" + a.mask_mode + "' is not past_len, bias or none");
    } else if (name == "num_heads") {
      a.num_heads = static_cast<int32_t>(read_int(f, contract::kAttentionHeadsMin, contract::kAttentionHeadsMax));
      have_heads = true;
    } else if (name == "num_kv_heads") {
      a.num_kv_heads =
          static_cast<int32_t>(read_int(f, contract::kAttentionKvHeadsMin, contract::kAttentionKvHeadsMax));
      have_kv_heads = true;
    } else if (name == "head_dim") {
      a.head_dim = static_cast<int32_t>(read_int_choice(f, contract::kAttentionHeadDims)), have_dim = true;
    } else if (name == "plugin_version" || name == "plugin_namespace") {
      // routing fields the ONNX parser may pass along
    } else {
      throw std::invalid_argument("unknown attribute '" + name + "'");
    }
  }
  if (!have_scale || !have_heads || !have_kv_heads || !have_dim)
    throw std::invalid_argument("attributes scale, num_heads, num_kv_heads and head_dim are required");
  if (!(a.guard_lo < a.guard_hi)) throw std::invalid_argument("guard_lo must be below guard_hi");
  if (a.num_heads % a.num_kv_heads != 0) throw std::invalid_argument("num_heads must be a multiple of num_kv_heads");
  return a;
}

MaskMode AttentionAttributes::mode() const {
  return mask_mode == "bias" ? MaskMode::kBias : mask_mode == "none" ? MaskMode::kNone : MaskMode::kPastLen;
}

// ---- plugin ---------------------------------------------------------------------------------------------------
AsyncSoftmaxAttentionPlugin::AsyncSoftmaxAttentionPlugin(AttentionAttributes attributes)
    : attrs_(std::move(attributes)) {}

nvinfer1::IPluginCapability* AsyncSoftmaxAttentionPlugin::getCapabilityInterface(
    nvinfer1::PluginCapabilityType type) noexcept {
  switch (type) {
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
  }
  return nullptr;
}

nvinfer1::IPluginV3* AsyncSoftmaxAttentionPlugin::clone() noexcept {
  try {
    return new AsyncSoftmaxAttentionPlugin(attrs_);
  } catch (const std::exception& e) {
    log_error(std::string("clone failed: ") + e.what());
    return nullptr;
  }
}

const char* AsyncSoftmaxAttentionPlugin::getPluginName() const noexcept { return kPluginName; }
const char* AsyncSoftmaxAttentionPlugin::getPluginVersion() const noexcept { return kPluginVersion; }
const char* AsyncSoftmaxAttentionPlugin::getPluginNamespace() const noexcept { return kPluginNamespace; }
int32_t AsyncSoftmaxAttentionPlugin::getNbOutputs() const noexcept { return 1; }

bool AsyncSoftmaxAttentionPlugin::make_params(const nvinfer1::Dims* dims, int32_t nb_inputs, DataType type,
                                              AttentionParams* p) const {
  if (nb_inputs != attrs_.num_inputs()) {
    log_error("mask_mode " + attrs_.mask_mode + " takes " + std::to_string(attrs_.num_inputs()) + " inputs, got " +
              std::to_string(nb_inputs));
    return false;
  }
  const nvinfer1::Dims &q = dims[0], &k = dims[1], &v = dims[2];
  if (q.nbDims != 4 || k.nbDims != 4 || v.nbDims != 4) {
    log_error("query, key and value must be 4-D ([B, H, S, D] and [B, Hkv, L, D])");
    return false;
  }
  for (int i = 0; i < 4; ++i) {
    if (k.d[i] != v.d[i]) {
      log_error("key and value shapes differ");
      return false;
    }
  }
  if (q.d[1] != attrs_.num_heads || k.d[1] != attrs_.num_kv_heads || q.d[3] != attrs_.head_dim ||
      k.d[3] != attrs_.head_dim || q.d[0] != k.d[0]) {
    log_error("tensor shapes disagree with num_heads / num_kv_heads / head_dim or the batch");
    return false;
  }
  if (!is_supported_type(type)) {
    log_error("query must be float16 or bfloat16");
    return false;
  }
  p->dtype = type == DataType::kBF16 ? AttnDtype::kBFloat16 : AttnDtype::kFloat16;
  p->batch = static_cast<int>(q.d[0]), p->num_heads = attrs_.num_heads, p->num_kv_heads = attrs_.num_kv_heads;
  p->seq = static_cast<int>(q.d[2]), p->head_dim = attrs_.head_dim, p->kv_capacity = static_cast<int>(k.d[2]);
  p->max_kv_len = p->kv_capacity;
  p->mask_mode = attrs_.mode();
  p->softmax = SoftmaxMode::kUnified;
  p->scale = attrs_.scale, p->phi = attrs_.phi, p->guard_lo = attrs_.guard_lo, p->guard_hi = attrs_.guard_hi;
  const int64_t d = attrs_.head_dim;
  p->q_ss = d, p->q_sh = q.d[2] * d, p->q_sb = q.d[1] * q.d[2] * d;
  p->k_ss = d, p->k_sh = k.d[2] * d, p->k_sb = k.d[1] * k.d[2] * d;
  p->v_ss = p->k_ss, p->v_sh = p->k_sh, p->v_sb = p->k_sb;
  p->o_ss = p->q_ss, p->o_sh = p->q_sh, p->o_sb = p->q_sb;
  if (attrs_.mode() == MaskMode::kBias) {
    // Broadcast a [B|1, 1, S|1, L|1] (or lower-rank, right-aligned) bias: stride 0 on size-1 dimensions.
    const nvinfer1::Dims& bias = dims[3];
    int64_t size[4] = {1, 1, 1, 1};
    for (int i = 0; i < bias.nbDims && i < 4; ++i) size[4 - bias.nbDims + i] = bias.d[i];
    if (bias.nbDims > 4 || (size[0] != 1 && size[0] != q.d[0]) || size[1] != 1 || (size[2] != 1 && size[2] != q.d[2]) ||
        (size[3] != 1 && size[3] != k.d[2])) {
      log_error("bias must broadcast to [B, 1, S, L]");
      return false;
    }
    p->bias_sl = size[3] == 1 ? 0 : 1;
    p->bias_ss = size[2] == 1 ? 0 : size[3];
    p->bias_sb = size[0] == 1 ? 0 : size[1] * size[2] * size[3];
  }
  if (const ParamsCheck c = check_attention_params(*p, /*with_tensors=*/false)) {
    log_error(c.message);
    return false;
  }
  return true;
}

int32_t AsyncSoftmaxAttentionPlugin::configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                                                     const nvinfer1::DynamicPluginTensorDesc* /*out*/,
                                                     int32_t nbOutputs) noexcept {
  try {
    if (nbOutputs != 1 || nbInputs != attrs_.num_inputs()) {
      log_error("expected " + std::to_string(attrs_.num_inputs()) + " inputs and 1 output");
      return -1;
    }
    if (in[0].desc.dims.nbDims != 4 || in[1].desc.dims.nbDims != 4) {
      log_error("query and key must be 4-D");
      return -1;
    }
    return 0;
  } catch (...) {
    return -1;
  }
}

int32_t AsyncSoftmaxAttentionPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                                        const DataType* inputTypes, int32_t nbInputs) const noexcept {
  if (nbOutputs != 1 || nbInputs < 1) return -1;
  outputTypes[0] = inputTypes[0];
  return 0;
}

int32_t AsyncSoftmaxAttentionPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                                                     const nvinfer1::DimsExprs* /*shapeInputs*/,
                                                     int32_t /*nbShapeInputs*/, nvinfer1::DimsExprs* outputs,
                                                     int32_t nbOutputs, nvinfer1::IExprBuilder& /*builder*/) noexcept {
  if (nbInputs < 3 || nbOutputs != 1 || inputs[0].nbDims != 4) return -1;
  outputs[0] = inputs[0];
  return 0;
}

bool AsyncSoftmaxAttentionPlugin::supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* inOut,
                                                            int32_t nbInputs, int32_t nbOutputs) noexcept {
  if (pos < 0 || pos >= nbInputs + nbOutputs) return false;
  const nvinfer1::PluginTensorDesc& d = inOut[pos].desc;
  if (d.format != nvinfer1::TensorFormat::kLINEAR) return false;
  if (pos == 0) return is_supported_type(d.type);  // float32 is the CPU reference's; these kernels run fp16/bf16
  if (pos == 3 && pos < nbInputs && attrs_.mode() == MaskMode::kPastLen) return d.type == DataType::kINT64;
  return d.type == inOut[0].desc.type;
}

size_t AsyncSoftmaxAttentionPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                                                     const nvinfer1::DynamicPluginTensorDesc* /*outputs*/,
                                                     int32_t /*nbOutputs*/) const noexcept {
  try {
    nvinfer1::Dims dims[4];
    for (int i = 0; i < nbInputs && i < 4; ++i) dims[i] = inputs[i].max;
    AttentionParams p;
    if (!make_params(dims, nbInputs, inputs[0].desc.type, &p)) return 0;
    return attention_workspace_bound(p);
  } catch (...) {
    return 0;
  }
}

int32_t AsyncSoftmaxAttentionPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                                                   const nvinfer1::PluginTensorDesc* /*out*/,
                                                   int32_t nbOutputs) noexcept {
  try {
    if (nbOutputs != 1) return -1;
    nvinfer1::Dims dims[4];
    for (int i = 0; i < nbInputs && i < 4; ++i) dims[i] = in[i].dims;
    AttentionParams p;
    return make_params(dims, nbInputs, in[0].type, &p) ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

int32_t AsyncSoftmaxAttentionPlugin::enqueue(const nvinfer1::PluginTensorDesc* inputDesc,
                                             const nvinfer1::PluginTensorDesc* /*outputDesc*/,
                                             const void* const* inputs, void* const* outputs, void* workspace,
                                             cudaStream_t stream) noexcept {
  try {
    nvinfer1::Dims dims[4];
    const int32_t n = attrs_.num_inputs();
    for (int i = 0; i < n; ++i) dims[i] = inputDesc[i].dims;
    AttentionParams p;
    if (!make_params(dims, n, inputDesc[0].type, &p)) return -1;
    p.q = inputs[0], p.k = inputs[1], p.v = inputs[2], p.out = outputs[0];
    if (p.mask_mode == MaskMode::kPastLen) p.past_len = static_cast<const int64_t*>(inputs[3]);
    if (p.mask_mode == MaskMode::kBias) p.bias = inputs[3];
    if (const ParamsCheck c = check_attention_params(p, /*with_tensors=*/true)) {
      log_error("enqueue: " + c.message);
      return -1;
    }
    // TensorRT reserved getWorkspaceSize() (the bound over every shape in the profile); this shape needs at most it.
    const size_t need = attention_workspace_bytes(p);
    const cudaError_t err = attention_forward(p, workspace, need, stream);
    if (err != cudaSuccess) {
      log_error(std::string("enqueue: ") + cudaGetErrorString(err));
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

nvinfer1::IPluginV3* AsyncSoftmaxAttentionPlugin::attachToContext(
    nvinfer1::IPluginResourceContext* /*context*/) noexcept {
  return clone();
}

const nvinfer1::PluginFieldCollection* AsyncSoftmaxAttentionPlugin::getFieldsToSerialize() noexcept {
  try {
    floats_ = {attrs_.scale, attrs_.phi, attrs_.guard_lo, attrs_.guard_hi};
    ints_ = {attrs_.num_heads, attrs_.num_kv_heads, attrs_.head_dim};
    fields_.clear();
    const char* float_names[] = {"scale", "phi", "guard_lo", "guard_hi"};
    const char* int_names[] = {"num_heads", "num_kv_heads", "head_dim"};
    for (size_t i = 0; i < floats_.size(); ++i)
      fields_.emplace_back(float_names[i], &floats_[i], PluginFieldType::kFLOAT32, 1);
    for (size_t i = 0; i < ints_.size(); ++i) fields_.emplace_back(int_names[i], &ints_[i], PluginFieldType::kINT32, 1);
    fields_.emplace_back("mask_mode", attrs_.mask_mode.c_str(), PluginFieldType::kCHAR,
                         static_cast<int32_t>(attrs_.mask_mode.size() + 1));
    collection_.nbFields = static_cast<int32_t>(fields_.size());
    collection_.fields = fields_.data();
    return &collection_;
  } catch (const std::exception& e) {
    log_error(std::string("getFieldsToSerialize: ") + e.what());
    return nullptr;
  }
}

// ---- creator --------------------------------------------------------------------------------------------------
AsyncSoftmaxAttentionPluginCreator::AsyncSoftmaxAttentionPluginCreator() {
  for (const char* name : {"scale", "phi", "guard_lo", "guard_hi"})
    fields_.emplace_back(name, nullptr, PluginFieldType::kFLOAT32, 1);
  fields_.emplace_back("mask_mode", nullptr, PluginFieldType::kCHAR, 0);
  for (const char* name : {"num_heads", "num_kv_heads", "head_dim"})
    fields_.emplace_back(name, nullptr, PluginFieldType::kINT32, 1);
  collection_.nbFields = static_cast<int32_t>(fields_.size());
  collection_.fields = fields_.data();
}

nvinfer1::IPluginV3* AsyncSoftmaxAttentionPluginCreator::createPlugin(const char* name,
                                                                      const nvinfer1::PluginFieldCollection* fc,
                                                                      nvinfer1::TensorRTPhase /*phase*/) noexcept {
  try {
    return new AsyncSoftmaxAttentionPlugin(AttentionAttributes::parse(fc));
  } catch (const std::exception& e) {
    log_error(std::string("cannot create '") + (name ? name : "") + "': " + e.what());
    return nullptr;
  } catch (...) {
    log_error("createPlugin: unknown exception");
    return nullptr;
  }
}

const nvinfer1::PluginFieldCollection* AsyncSoftmaxAttentionPluginCreator::getFieldNames() noexcept {
  return &collection_;
}
const char* AsyncSoftmaxAttentionPluginCreator::getPluginName() const noexcept { return kPluginName; }
const char* AsyncSoftmaxAttentionPluginCreator::getPluginVersion() const noexcept { return kPluginVersion; }
const char* AsyncSoftmaxAttentionPluginCreator::getPluginNamespace() const noexcept { return kPluginNamespace; }

nvinfer1::IPluginCreatorInterface* attentionPluginCreator() {
  static AsyncSoftmaxAttentionPluginCreator creator;
  return &creator;
}

}  // namespace fdpp
