// TensorRT IPluginV3 adapter of fdpp::FlatGemm (contract: plugins/FlatGemmPlugin/contract.json).
//
// Inputs: x [..., K], weight [N, K], bias [N] (when has_bias = 1), residual [..., N] (when epilogue = "residual").
// Output: y [..., N], or [..., N/2] for epilogue "silu_mul". float16 or bfloat16, linear layout.
// Attributes: epilogue, has_bias, m1, m2, implb_n_tile, implb_k_tile, implb_stages, implb_split_k,
// implb_loader (version 2; "rows1" in 3, "pair" in 4), implc, profile, plugin_version (version 3: the ONNX parser
// finds the creator by it). enqueue() dispatches by the run-time M = product of x's leading dims: a table lookup, no
// timing.
#pragma once

#include <NvInferRuntime.h>

#include <string>
#include <vector>

#include "fdpp_contract_constants.h"
#include "kernels/gemm/gemm.h"

namespace fdpp {

struct FlatGemmAttributes {
  std::string epilogue = contract::kFlatGemmEpilogueDefault;  // "none" | "silu_mul" | "residual"
  int32_t has_bias = contract::kFlatGemmHasBiasDefault;
  gemm::Plan plan{};
  std::string implc = contract::kFlatGemmImplcDefault;  // as in the node ("cutlass" | "cublaslt" | "cublas" = cuBLASLt)
  std::string profile = contract::kFlatGemmProfileDefault;

  // Reads a field collection (any order, unknown fields rejected); throws std::invalid_argument with a
  // one-line message naming the bad field.
  static FlatGemmAttributes parse(const nvinfer1::PluginFieldCollection* fc);
  int32_t num_inputs() const { return 2 + has_bias + (epilogue == "residual" ? 1 : 0); }
};

class FlatGemmPlugin : public nvinfer1::IPluginV3,
                       public nvinfer1::IPluginV3OneCore,
                       public nvinfer1::IPluginV3OneBuild,
                       public nvinfer1::IPluginV3OneRuntime {
 public:
  explicit FlatGemmPlugin(FlatGemmAttributes attributes);
  ~FlatGemmPlugin() override = default;

  // IPluginV3
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
  nvinfer1::IPluginV3* clone() noexcept override;

  // IPluginV3OneCore
  const char* getPluginName() const noexcept override;
  const char* getPluginVersion() const noexcept override;
  const char* getPluginNamespace() const noexcept override;

  // IPluginV3OneBuild
  int32_t configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* out, int32_t nbOutputs) noexcept override;
  int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs, const nvinfer1::DataType* inputTypes,
                             int32_t nbInputs) const noexcept override;
  int32_t getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs, const nvinfer1::DimsExprs* shapeInputs,
                          int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                          nvinfer1::IExprBuilder& exprBuilder) noexcept override;
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* inOut, int32_t nbInputs,
                                 int32_t nbOutputs) noexcept override;
  int32_t getNbOutputs() const noexcept override;
  size_t getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* inputs, int32_t nbInputs,
                          const nvinfer1::DynamicPluginTensorDesc* outputs, int32_t nbOutputs) const noexcept override;

  // IPluginV3OneRuntime
  int32_t onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs, const nvinfer1::PluginTensorDesc* out,
                        int32_t nbOutputs) noexcept override;
  int32_t enqueue(const nvinfer1::PluginTensorDesc* inputDesc, const nvinfer1::PluginTensorDesc* outputDesc,
                  const void* const* inputs, void* const* outputs, void* workspace,
                  cudaStream_t stream) noexcept override;
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override;

 private:
  gemm::Epilogue kernel_epilogue() const;

  FlatGemmAttributes attrs_;
  // Backing storage of getFieldsToSerialize()'s collection.
  std::vector<nvinfer1::PluginField> fields_;
  std::vector<int32_t> ints_;
  std::string loader_;  // the serialized implb_loader
  nvinfer1::PluginFieldCollection collection_{};
};

class FlatGemmPluginCreator : public nvinfer1::IPluginCreatorV3One {
 public:
  FlatGemmPluginCreator();
  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase phase) noexcept override;
  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override;
  const char* getPluginName() const noexcept override;
  const char* getPluginVersion() const noexcept override;
  const char* getPluginNamespace() const noexcept override;

 private:
  std::vector<nvinfer1::PluginField> fields_;
  nvinfer1::PluginFieldCollection collection_{};
};

}  // namespace fdpp
