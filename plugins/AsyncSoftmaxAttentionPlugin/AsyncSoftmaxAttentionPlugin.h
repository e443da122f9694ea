// TensorRT IPluginV3 adapter of fdpp::AsyncSoftmaxAttention (contract: plugins/AsyncSoftmaxAttentionPlugin/
// contract.json; kernels: plugins/kernels/attention/attention_params.h).
//
// Inputs: query [B, Hq, S, D], key and value [B, Hkv, L, D] (the caches, in place), then by mask_mode:
// "past_len" past_len [B] int64, "bias" an additive bias broadcastable to [B, 1, S, L], "none" nothing.
// Output: [B, Hq, S, D]. float16 or bfloat16, linear layout. Attributes: scale, phi, guard_lo, guard_hi,
// mask_mode, num_heads, num_kv_heads, head_dim, softcap, window. enqueue() picks decode (split-KV) or prefill by S,
// never measures.
#pragma once

#include <NvInferRuntime.h>

#include <optional>
#include <string>
#include <utility>

#include "common/plugin_base.h"
#include "fdpp_contract_constants.h"
#include "kernels/attention/attention_params.h"

namespace fdpp {

struct AttentionAttributes {
  float scale = 0.f, phi = contract::kAttentionPhiDefault;
  float guard_lo = contract::kAttentionGuardLoDefault, guard_hi = contract::kAttentionGuardHiDefault;
  std::string mask_mode = contract::kAttentionMaskModeDefault;
  std::string softmax = contract::kAttentionSoftmaxDefault;  // a calibration verdict per layer
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
  float softcap = contract::kAttentionSoftcapDefault;  // 0: none
  int32_t window = contract::kAttentionWindowDefault;  // 0: none

  // Reads a field collection (any order; unknown fields rejected); throws std::invalid_argument naming the field.
  static AttentionAttributes parse(const nvinfer1::PluginFieldCollection* fc);
  int32_t num_inputs() const { return mask_mode == "none" ? 3 : 4; }
  MaskMode mode() const;
};

class AsyncSoftmaxAttentionPlugin : public PluginBase<AsyncSoftmaxAttentionPlugin, AttentionAttributes> {
 public:
  static constexpr const char* kName = contract::kAttentionOp;                // the ONNX op type in domain "fdpp"
  static constexpr const char* kVersion = contract::kAttentionVersionString;  // contract.json "version"
  static AttributeTable<AttentionAttributes> attributes();

  explicit AsyncSoftmaxAttentionPlugin(AttentionAttributes attributes) : PluginBase(std::move(attributes)) {}

  // IPluginV3OneBuild
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, const nvinfer1::DataType* inputTypes,
                             int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs, const nvinfer1::DimsExprs* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  std::optional<nvinfer1::DataType> fixed_type(int32_t pos, int32_t nbInputs) const;  // for PluginBase
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nbOutputs) const noexcept override;

  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nbOutputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* inputDesc, const nvinfer1::PluginTensorDesc* outputDesc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;

 private:
  // The kernel parameters for these tensor shapes (pointers left null); false with a logged reason if unusable.
  bool make_params(const nvinfer1::Dims* dims, int32_t nb_inputs, nvinfer1::DataType type, AttentionParams* p) const;
};

}  // namespace fdpp
