// TensorRT IPluginV3 adapter of fdpp::RMSNorm (contract: plugins/RMSNormPlugin/contract.json; kernel:
// plugins/kernels/norm/rms_norm.h).
//
// Inputs: x [..., hidden] and weight [hidden]. Output: y, x's shape. float16 or bfloat16, linear layout.
// Attribute: epsilon. No workspace; enqueue() is one launch of fdpp::rms_norm, the C ABI's launcher.
#pragma once

#include <NvInferRuntime.h>

#include "common/plugin_base.h"
#include "fdpp_contract_constants.h"
#include "kernels/norm/rms_norm.h"

namespace fdpp {

struct RmsNormAttributes {
  float epsilon = 0.f;

  // Reads a field collection (any order; unknown fields rejected); throws std::invalid_argument naming the field.
  static RmsNormAttributes parse(const nvinfer1::PluginFieldCollection* fc);
};

class RMSNormPlugin : public PluginBase<RMSNormPlugin, RmsNormAttributes> {
 public:
  static constexpr const char* kName = contract::kRmsNormOp;                // the ONNX op type in domain "fdpp"
  static constexpr const char* kVersion = contract::kRmsNormVersionString;  // contract.json "version"
  static AttributeTable<RmsNormAttributes> attributes();

  explicit RMSNormPlugin(RmsNormAttributes attributes) : PluginBase(attributes) {}

  // IPluginV3OneBuild
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, const nvinfer1::DataType* inputTypes,
                             int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs, const nvinfer1::DimsExprs* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nbOutputs) const noexcept override;

  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nbOutputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* inputDesc, const nvinfer1::PluginTensorDesc* outputDesc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;

 private:
  // The kernel parameters for x's and weight's shapes (pointers left null); false with a logged reason if unusable.
  bool make_params(const nvinfer1::Dims& x, const nvinfer1::Dims& weight, nvinfer1::DataType type,
                   RmsNormParams* p) const;
};

}  // namespace fdpp
