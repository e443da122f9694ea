// TensorRT IPluginV3 adapter of fdpp::AsyncSoftmaxAttention: translates tensors and attributes, calls
// fdpp::attention_forward. The key/value inputs are the caches; an engine aliases them to the updated caches.
#include "AsyncSoftmaxAttentionPlugin/AsyncSoftmaxAttentionPlugin.h"

#include <stdexcept>
#include <string>

#include "common/fields.h"
#include "common/registry.h"

namespace fdpp {
namespace {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;
using Spec = AttributeSpec<AttentionAttributes>;

constexpr const char* kMaskModes[] = {"past_len", "bias", "none"};
constexpr const char* kSoftmaxModes[] = {"unified", "synchronized"};

// The contract's attributes (names, ranges, defaults: contract.json through fdpp_contract_constants.h), in the
// contract's order. A new attribute is a new row here and a member of AttentionAttributes.
const Spec kAttributes[] = {
    {"scale", PluginFieldType::kFLOAT32, true,
     [](const PluginField& f, AttentionAttributes& a) {
       a.scale = read_float(f, contract::kAttentionScaleMin, contract::kAttentionScaleMax);
     },
     [](const AttentionAttributes& a) { return float_value(a.scale); }},
    {"phi", PluginFieldType::kFLOAT32, false,
     [](const PluginField& f, AttentionAttributes& a) {
       a.phi = read_float(f, contract::kAttentionPhiMin, contract::kAttentionPhiMax);
     },
     [](const AttentionAttributes& a) { return float_value(a.phi); }},
    {"guard_lo", PluginFieldType::kFLOAT32, false,
     [](const PluginField& f, AttentionAttributes& a) {
       a.guard_lo = read_float(f, contract::kAttentionGuardLoMin, contract::kAttentionGuardLoMax);
     },
     [](const AttentionAttributes& a) { return float_value(a.guard_lo); }},
    {"guard_hi", PluginFieldType::kFLOAT32, false,
     [](const PluginField& f, AttentionAttributes& a) {
       a.guard_hi = read_float(f, contract::kAttentionGuardHiMin, contract::kAttentionGuardHiMax);
     },
     [](const AttentionAttributes& a) { return float_value(a.guard_hi); }},
    {"softmax", PluginFieldType::kCHAR, false,
     [](const PluginField& f, AttentionAttributes& a) { a.softmax = read_string_choice(f, kSoftmaxModes); },
     [](const AttentionAttributes& a) { return text_value(a.softmax); }},
    {"mask_mode", PluginFieldType::kCHAR, false,
     [](const PluginField& f, AttentionAttributes& a) { a.mask_mode = read_string_choice(f, kMaskModes); },
     [](const AttentionAttributes& a) { return text_value(a.mask_mode); }},
    {"num_heads", PluginFieldType::kINT32, true,
     [](const PluginField& f, AttentionAttributes& a) {
       a.num_heads = read_int32(f, contract::kAttentionHeadsMin, contract::kAttentionHeadsMax);
     },
     [](const AttentionAttributes& a) { return int_value(a.num_heads); }},
    {"num_kv_heads", PluginFieldType::kINT32, true,
     [](const PluginField& f, AttentionAttributes& a) {
       a.num_kv_heads = read_int32(f, contract::kAttentionKvHeadsMin, contract::kAttentionKvHeadsMax);
     },
     [](const AttentionAttributes& a) { return int_value(a.num_kv_heads); }},
    {"head_dim", PluginFieldType::kINT32, true,
     [](const PluginField& f, AttentionAttributes& a) {
       a.head_dim = read_int_choice(f, contract::kAttentionHeadDims);
     },
     [](const AttentionAttributes& a) { return int_value(a.head_dim); }},
    {"softcap", PluginFieldType::kFLOAT32, false,
     [](const PluginField& f, AttentionAttributes& a) {
       a.softcap = read_float(f, 0.0, contract::kAttentionSoftcapMax);
     },
     [](const AttentionAttributes& a) { return float_value(a.softcap); }},
    {"window", PluginFieldType::kINT32, false,
     [](const PluginField& f, AttentionAttributes& a) { a.window = read_int32(f, 0, contract::kAttentionWindowMax); },
     [](const AttentionAttributes& a) { return int_value(a.window); }},
};

}  // namespace

AttentionAttributes AttentionAttributes::parse(const nvinfer1::PluginFieldCollection* fc) {
  AttentionAttributes a = parse_attributes(fc, AsyncSoftmaxAttentionPlugin::attributes(), AttentionAttributes{});
  // The contract's constraints.
  if (!(a.guard_lo < a.guard_hi)) throw std::invalid_argument("guard_lo must be below guard_hi");
  if (a.num_heads % a.num_kv_heads != 0) throw std::invalid_argument("num_heads must be a multiple of num_kv_heads");
  return a;
}

MaskMode AttentionAttributes::mode() const {
  return mask_mode == "bias" ? MaskMode::kBias : mask_mode == "none" ? MaskMode::kNone : MaskMode::kPastLen;
}

// ---- plugin ---------------------------------------------------------------------------------------------------
AttributeTable<AttentionAttributes> AsyncSoftmaxAttentionPlugin::attributes() { return kAttributes; }

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
  if (!is_kernel_type(type)) {
    log_error("query must be float16 or bfloat16");
    return false;
  }
  p->dtype = type == DataType::kBF16 ? AttnDtype::kBFloat16 : AttnDtype::kFloat16;
  p->batch = static_cast<int>(q.d[0]), p->num_heads = attrs_.num_heads, p->num_kv_heads = attrs_.num_kv_heads;
  p->seq = static_cast<int>(q.d[2]), p->head_dim = attrs_.head_dim, p->kv_capacity = static_cast<int>(k.d[2]);
  p->max_kv_len = p->kv_capacity;
  p->mask_mode = attrs_.mode();
  p->softmax = attrs_.softmax == "synchronized" ? SoftmaxMode::kSynchronized : SoftmaxMode::kUnified;
  p->scale = attrs_.scale, p->phi = attrs_.phi, p->guard_lo = attrs_.guard_lo, p->guard_hi = attrs_.guard_hi;
  p->softcap = attrs_.softcap, p->window = attrs_.window;
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
  return guarded<AsyncSoftmaxAttentionPlugin>("configurePlugin", -1, [&] {
    if (nbOutputs != 1 || nbInputs != attrs_.num_inputs()) {
      log_error("expected " + std::to_string(attrs_.num_inputs()) + " inputs and 1 output");
      return -1;
    }
    if (in[0].desc.dims.nbDims != 4 || in[1].desc.dims.nbDims != 4) {
      log_error("query and key must be 4-D");
      return -1;
    }
    return 0;
  });
}

int32_t AsyncSoftmaxAttentionPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                                        const DataType* inputTypes, int32_t nbInputs) const noexcept {
  return guarded<AsyncSoftmaxAttentionPlugin>("getOutputDataTypes", -1, [&] {
    if (nbOutputs != 1 || nbInputs < 1) return -1;
    outputTypes[0] = inputTypes[0];
    return 0;
  });
}

int32_t AsyncSoftmaxAttentionPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                                                     const nvinfer1::DimsExprs* /*shapeInputs*/,
                                                     int32_t /*nbShapeInputs*/, nvinfer1::DimsExprs* outputs,
                                                     int32_t nbOutputs, nvinfer1::IExprBuilder& /*builder*/) noexcept {
  return guarded<AsyncSoftmaxAttentionPlugin>("getOutputShapes", -1, [&] {
    // The output is [B, Hq, S, D], the query's shape; the caches are read, never written (RopeAppend writes them).
    if (nbInputs != attrs_.num_inputs() || nbOutputs != 1 || inputs[0].nbDims != 4) return -1;
    outputs[0] = inputs[0];
    return 0;
  });
}

std::optional<DataType> AsyncSoftmaxAttentionPlugin::fixed_type(int32_t pos, int32_t nbInputs) const {
  if (pos == 3 && pos < nbInputs && attrs_.mode() == MaskMode::kPastLen) return DataType::kINT64;
  return std::nullopt;
}

size_t AsyncSoftmaxAttentionPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                                                     const nvinfer1::DynamicPluginTensorDesc* /*outputs*/,
                                                     int32_t /*nbOutputs*/) const noexcept {
  return guarded<AsyncSoftmaxAttentionPlugin>("getWorkspaceSize", size_t{0}, [&]() -> size_t {
    nvinfer1::Dims dims[4];
    for (int i = 0; i < nbInputs && i < 4; ++i) dims[i] = inputs[i].max;
    AttentionParams p;
    if (!make_params(dims, nbInputs, inputs[0].desc.type, &p)) return 0;
    return attention_workspace_bound(p);
  });
}

int32_t AsyncSoftmaxAttentionPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                                                   const nvinfer1::PluginTensorDesc* /*out*/,
                                                   int32_t nbOutputs) noexcept {
  return guarded<AsyncSoftmaxAttentionPlugin>("onShapeChange", -1, [&] {
    if (nbOutputs != 1) return -1;
    nvinfer1::Dims dims[4];
    for (int i = 0; i < nbInputs && i < 4; ++i) dims[i] = in[i].dims;
    AttentionParams p;
    return make_params(dims, nbInputs, in[0].type, &p) ? 0 : -1;
  });
}

int32_t AsyncSoftmaxAttentionPlugin::enqueue(const nvinfer1::PluginTensorDesc* inputDesc,
                                             const nvinfer1::PluginTensorDesc* /*outputDesc*/,
                                             const void* const* inputs, void* const* outputs, void* workspace,
                                             cudaStream_t stream) noexcept {
  return guarded<AsyncSoftmaxAttentionPlugin>("enqueue", -1, [&] {
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
    return cuda_status("enqueue", attention_forward(p, workspace, need, stream));
  });
}

nvinfer1::IPluginCreatorInterface* attentionPluginCreator() { return creator_of<AsyncSoftmaxAttentionPlugin>(); }

}  // namespace fdpp
