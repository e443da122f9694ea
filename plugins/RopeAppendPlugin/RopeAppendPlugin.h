// TensorRT IPluginV3 adapter of fdpp::RopeAppend (contract: plugins/RopeAppendPlugin/contract.json; kernel:
// plugins/kernels/attention/attention_rope_append.cu).
//
// Inputs: query [B, Hq, S, D], k_new and v_new [B, Hkv, S, D], key_cache and value_cache [B, Hkv, L, D],
// past_len [B] int64, inv_freq [rope_dim / 2] float32. Outputs: query_out, key_cache_out, value_cache_out, each
// aliased to its input (query, key_cache, value_cache): the kernel rotates the query in place and writes only the
// new rows of the caches, so no step copies a cache. float16 or bfloat16, linear layout. Attributes: rope_dim,
// interleaved, num_heads, num_kv_heads, head_dim. No workspace; enqueue() is one launch of fdpp::rope_append.
#pragma once

#include <NvInferRuntime.h>

#include <optional>

#include "common/plugin_base.h"
#include "fdpp_contract_constants.h"
#include "kernels/attention/attention_params.h"

namespace fdpp {

struct RopeAppendAttributes {
  int32_t rope_dim = contract::kRopeDimDefault, interleaved = contract::kRopeInterleavedDefault;
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;

  // Reads a field collection (any order; unknown fields rejected); throws std::invalid_argument naming the field.
  static RopeAppendAttributes parse(const nvinfer1::PluginFieldCollection* fc);
};

class RopeAppendPlugin : public PluginBase<RopeAppendPlugin, RopeAppendAttributes> {
 public:
  static constexpr const char* kName = contract::kRopeAppendOp;                // the ONNX op type in domain "fdpp"
  static constexpr const char* kVersion = contract::kRopeAppendVersionString;  // contract.json "version"
  static constexpr int32_t kInputs = 7, kOutputs = 3;
  static AttributeTable<RopeAppendAttributes> attributes();

  explicit RopeAppendPlugin(RopeAppendAttributes attributes) : PluginBase(attributes) {}

  // IPluginV3OneBuild / BuildV2
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, const nvinfer1::DataType* inputTypes,
                             int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs, const nvinfer1::DimsExprs* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  std::optional<nvinfer1::DataType> fixed_type(int32_t pos, int32_t nbInputs) const;  // for PluginBase
  int32_t getNbOutputs() const noexcept override { return kOutputs; }
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nbOutputs) const noexcept override;
  int32_t getAliasedInput(int32_t outputIndex) noexcept override;

  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nbOutputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* inputDesc, const nvinfer1::PluginTensorDesc* outputDesc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;

 private:
  // The kernel parameters for these input shapes (pointers left null); false with a logged reason if unusable.
  bool make_params(const nvinfer1::Dims* dims, int32_t nb_inputs, nvinfer1::DataType type, RopeAppendParams* p) const;

  unsigned long long* counters_ = nullptr;  // the library's dropped-token counters, resolved in onShapeChange
};

}  // namespace fdpp
