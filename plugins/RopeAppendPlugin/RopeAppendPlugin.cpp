// TensorRT IPluginV3 adapter of fdpp::RopeAppend: translates tensors and attributes, calls fdpp::rope_append. Its
// outputs alias its query and cache inputs (getAliasedInput), so the engine binds each pair to one buffer.
#include "RopeAppendPlugin/RopeAppendPlugin.h"

#include <stdexcept>
#include <string>

#include "common/fields.h"
#include "common/registry.h"

namespace fdpp {
namespace {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;
using Spec = AttributeSpec<RopeAppendAttributes>;

// Input positions (the contract's order) and which input each output aliases.
enum Input : int32_t { kQuery, kKNew, kVNew, kKeyCache, kValueCache, kPastLen, kInvFreq };
constexpr int32_t kAliasOf[RopeAppendPlugin::kOutputs] = {kQuery, kKeyCache, kValueCache};

// The contract's attributes (names, ranges, defaults: contract.json through fdpp_contract_constants.h).
const Spec kAttributes[] = {
    {"rope_dim", PluginFieldType::kINT32, false,
     [](const PluginField& f, RopeAppendAttributes& a) {
       a.rope_dim = read_int32(f, contract::kRopeDimMin, contract::kRopeDimMax);
     },
     [](const RopeAppendAttributes& a) { return int_value(a.rope_dim); }},
    {"interleaved", PluginFieldType::kINT32, false,
     [](const PluginField& f, RopeAppendAttributes& a) {
       a.interleaved = read_int32(f, contract::kRopeInterleavedMin, contract::kRopeInterleavedMax);
     },
     [](const RopeAppendAttributes& a) { return int_value(a.interleaved); }},
    {"num_heads", PluginFieldType::kINT32, true,
     [](const PluginField& f, RopeAppendAttributes& a) {
       a.num_heads = read_int32(f, contract::kRopeHeadsMin, contract::kRopeHeadsMax);
     },
     [](const RopeAppendAttributes& a) { return int_value(a.num_heads); }},
    {"num_kv_heads", PluginFieldType::kINT32, true,
     [](const PluginField& f, RopeAppendAttributes& a) {
       a.num_kv_heads = read_int32(f, contract::kRopeKvHeadsMin, contract::kRopeKvHeadsMax);
     },
     [](const RopeAppendAttributes& a) { return int_value(a.num_kv_heads); }},
    {"head_dim", PluginFieldType::kINT32, true,
     [](const PluginField& f, RopeAppendAttributes& a) {
       a.head_dim = read_int32(f, contract::kRopeHeadDimMin, contract::kRopeHeadDimMax);
     },
     [](const RopeAppendAttributes& a) { return int_value(a.head_dim); }},
};

// Contiguous [B, H, S, D] strides in elements.
void strides(const nvinfer1::Dims& d, int64_t* sb, int64_t* sh, int64_t* ss) {
  *ss = d.d[3], *sh = d.d[2] * d.d[3], *sb = d.d[1] * d.d[2] * d.d[3];
}

}  // namespace

RopeAppendAttributes RopeAppendAttributes::parse(const nvinfer1::PluginFieldCollection* fc) {
  RopeAppendAttributes a = parse_attributes(fc, RopeAppendPlugin::attributes(), RopeAppendAttributes{});
  // The contract's constraints.
  if (a.rope_dim > a.head_dim) throw std::invalid_argument("rope_dim must be at most head_dim");
  if (a.num_heads % a.num_kv_heads != 0) throw std::invalid_argument("num_heads must be a multiple of num_kv_heads");
  return a;
}

AttributeTable<RopeAppendAttributes> RopeAppendPlugin::attributes() { return kAttributes; }

bool RopeAppendPlugin::make_params(const nvinfer1::Dims* dims, int32_t nb_inputs, DataType type,
                                   RopeAppendParams* p) const {
  if (nb_inputs != kInputs) {
    log_error("expected 7 inputs (query, k_new, v_new, key_cache, value_cache, past_len, inv_freq), got " +
              std::to_string(nb_inputs));
    return false;
  }
  const nvinfer1::Dims &q = dims[kQuery], &kn = dims[kKNew], &vn = dims[kVNew];
  const nvinfer1::Dims &kc = dims[kKeyCache], &vc = dims[kValueCache];
  for (const nvinfer1::Dims* d : {&q, &kn, &vn, &kc, &vc}) {
    if (d->nbDims != 4) {
      log_error("query, k_new, v_new and the caches must be 4-D ([B, H, S, D], [B, Hkv, S|L, D])");
      return false;
    }
  }
  const int64_t batch = q.d[0], seq = q.d[2];
  const bool new_ok =
      kn.d[0] == batch && kn.d[1] == attrs_.num_kv_heads && kn.d[2] == seq && kn.d[3] == attrs_.head_dim;
  bool same = true;
  for (int i = 0; i < 4; ++i) same = same && kn.d[i] == vn.d[i] && kc.d[i] == vc.d[i];
  if (q.d[1] != attrs_.num_heads || q.d[3] != attrs_.head_dim || !new_ok || !same || kc.d[0] != batch ||
      kc.d[1] != attrs_.num_kv_heads || kc.d[3] != attrs_.head_dim) {
    log_error("tensor shapes disagree with num_heads / num_kv_heads / head_dim, the batch or seq");
    return false;
  }
  if (dims[kPastLen].nbDims != 1 || dims[kPastLen].d[0] != batch) {
    log_error("past_len must be [batch]");
    return false;
  }
  if (dims[kInvFreq].nbDims != 1 || dims[kInvFreq].d[0] != attrs_.rope_dim / 2) {
    log_error("inv_freq must be [rope_dim / 2] = [" + std::to_string(attrs_.rope_dim / 2) + "]");
    return false;
  }
  if (!is_kernel_type(type)) {
    log_error("query must be float16 or bfloat16");
    return false;
  }
  p->dtype = type == DataType::kBF16 ? AttnDtype::kBFloat16 : AttnDtype::kFloat16;
  p->batch = static_cast<int>(batch), p->seq = static_cast<int>(seq), p->kv_capacity = static_cast<int>(kc.d[2]);
  p->num_heads = attrs_.num_heads, p->num_kv_heads = attrs_.num_kv_heads, p->head_dim = attrs_.head_dim;
  p->rope_dim = attrs_.rope_dim, p->rope_interleaved = attrs_.interleaved;
  strides(q, &p->q_sb, &p->q_sh, &p->q_ss);
  strides(kn, &p->kn_sb, &p->kn_sh, &p->kn_ss);
  strides(vn, &p->vn_sb, &p->vn_sh, &p->vn_ss);
  strides(kc, &p->kc_sb, &p->kc_sh, &p->kc_ss);
  strides(vc, &p->vc_sb, &p->vc_sh, &p->vc_ss);
  // Without tensors the check covers shapes and modes; the pointers are checked again in enqueue.
  RopeAppendParams shapes_only = *p;
  shapes_only.batch = 0;
  if (const ParamsCheck c = check_rope_append_params(shapes_only)) {
    log_error(c.message);
    return false;
  }
  return true;
}

int32_t RopeAppendPlugin::configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                                          const nvinfer1::DynamicPluginTensorDesc* /*out*/,
                                          int32_t nbOutputs) noexcept {
  return guarded<RopeAppendPlugin>("configurePlugin", -1, [&] {
    if (nbInputs != kInputs || nbOutputs != kOutputs) {
      log_error("expected 7 inputs and 3 outputs");
      return -1;
    }
    nvinfer1::Dims dims[kInputs];
    for (int i = 0; i < kInputs; ++i) dims[i] = in[i].max;
    RopeAppendParams p;
    return make_params(dims, nbInputs, in[kQuery].desc.type, &p) ? 0 : -1;
  });
}

int32_t RopeAppendPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs, const DataType* inputTypes,
                                             int32_t nbInputs) const noexcept {
  return guarded<RopeAppendPlugin>("getOutputDataTypes", -1, [&] {
    if (nbOutputs != kOutputs || nbInputs != kInputs) return -1;
    for (int32_t i = 0; i < kOutputs; ++i) outputTypes[i] = inputTypes[kAliasOf[i]];
    return 0;
  });
}

int32_t RopeAppendPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                                          const nvinfer1::DimsExprs* /*shapeInputs*/, int32_t /*nbShapeInputs*/,
                                          nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                                          nvinfer1::IExprBuilder& /*builder*/) noexcept {
  return guarded<RopeAppendPlugin>("getOutputShapes", -1, [&] {
    if (nbInputs != kInputs || nbOutputs != kOutputs) return -1;
    for (int32_t i = 0; i < kOutputs; ++i) outputs[i] = inputs[kAliasOf[i]];
    return 0;
  });
}

// PluginBase checks the query (input 0, kQuery) and gives every other tensor its type.
std::optional<DataType> RopeAppendPlugin::fixed_type(int32_t pos, int32_t /*nbInputs*/) const {
  if (pos == kPastLen) return DataType::kINT64;
  if (pos == kInvFreq) return DataType::kFLOAT;
  return std::nullopt;
}

size_t RopeAppendPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* /*inputs*/, int32_t /*nbInputs*/,
                                          const nvinfer1::DynamicPluginTensorDesc* /*outputs*/,
                                          int32_t /*nbOutputs*/) const noexcept {
  return 0;  // one pass over the new tokens, in place
}

int32_t RopeAppendPlugin::getAliasedInput(int32_t outputIndex) noexcept {
  return outputIndex >= 0 && outputIndex < kOutputs ? kAliasOf[outputIndex] : -1;
}

int32_t RopeAppendPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                                        const nvinfer1::PluginTensorDesc* /*out*/, int32_t nbOutputs) noexcept {
  return guarded<RopeAppendPlugin>("onShapeChange", -1, [&] {
    if (nbInputs != kInputs || nbOutputs != kOutputs) return -1;
    nvinfer1::Dims dims[kInputs];
    for (int i = 0; i < kInputs; ++i) dims[i] = in[i].dims;
    RopeAppendParams p;
    if (!make_params(dims, nbInputs, in[kQuery].type, &p)) return -1;
    // Resolved here, not in enqueue: the first lookup is a CUDA call a graph capture must not see.
    return cuda_status("onShapeChange", attention_default_counters(&counters_));
  });
}

int32_t RopeAppendPlugin::enqueue(const nvinfer1::PluginTensorDesc* inputDesc,
                                  const nvinfer1::PluginTensorDesc* /*outputDesc*/, const void* const* inputs,
                                  void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept {
  return guarded<RopeAppendPlugin>("enqueue", -1, [&] {
    nvinfer1::Dims dims[kInputs];
    for (int i = 0; i < kInputs; ++i) dims[i] = inputDesc[i].dims;
    RopeAppendParams p;
    if (!make_params(dims, kInputs, inputDesc[kQuery].type, &p)) return -1;
    if (p.batch == 0 || p.seq == 0) return 0;
    // The outputs alias the inputs (getAliasedInput): TensorRT hands the same buffers, so the kernel's writes to
    // q_out and the caches are the in-place update the contract describes.
    p.q_in = inputs[kQuery], p.q_out = outputs[0];
    p.k_new = inputs[kKNew], p.v_new = inputs[kVNew];
    p.k_cache = outputs[1], p.v_cache = outputs[2];
    p.past_len = static_cast<const int64_t*>(inputs[kPastLen]);
    p.inv_freq = p.rope_dim > 0 ? static_cast<const float*>(inputs[kInvFreq]) : nullptr;
    p.counters = counters_;
    if (const ParamsCheck c = check_rope_append_params(p)) {
      log_error("enqueue: " + c.message);
      return -1;
    }
    return cuda_status("enqueue", rope_append(p, stream));
  });
}

nvinfer1::IPluginCreatorInterface* ropeAppendPluginCreator() { return creator_of<RopeAppendPlugin>(); }

}  // namespace fdpp
