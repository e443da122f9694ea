// TensorRT IPluginV3 adapter of fdpp::FlatGemm (contract: plugins/FlatGemmPlugin/contract.json).
//
// Inputs: x [..., K], weight [N, K], bias [N] (when has_bias = 1), residual [..., N] (when epilogue = "residual").
// Output: y [..., N], or [..., N/2] for epilogue "silu_mul". float16 or bfloat16, linear layout.
// Attributes: epilogue, has_bias, m1, m2, implb_n_tile, implb_k_tile, implb_stages, implb_split_k,
// implb_loader (version 2; "rows1" in 3, "pair" in 4, "wgmma" in 5), implc, profile, plugin_version (version 3: the
// ONNX parser finds the creator by it), m3, implb_wgmma_stages, implb_wgmma_split_k (version 5: the wgmma range).
// enqueue() dispatches by the run-time M = product of x's leading dims: a table lookup, no timing.
#pragma once

#include <NvInferRuntime.h>

#include <string>

#include "common/plugin_base.h"
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

class FlatGemmPlugin : public PluginBase<FlatGemmPlugin, FlatGemmAttributes> {
 public:
  static constexpr const char* kName = contract::kFlatGemmOp;                // the ONNX op type in domain "fdpp"
  static constexpr const char* kVersion = contract::kFlatGemmVersionString;  // = the node's plugin_version
  static AttributeTable<FlatGemmAttributes> attributes();

  explicit FlatGemmPlugin(FlatGemmAttributes attributes);

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
  gemm::Epilogue kernel_epilogue() const;
  // plan_ for this weight [N, K] on the current GPU: the node's plan, or for an unprofiled node the library's
  // default ImplB tiles for the device (contract.json unprofiled_default). False with a logged reason if unusable.
  bool resolve_plan(int64_t n, int64_t k);
  // Builds the cuBLASLt plan enqueue will use for these shapes when ImplC serves their M, so that enqueue (and a
  // CUDA-graph capture of it) only launches. False with a logged reason if cuBLASLt cannot serve them.
  bool prepare_library_gemm(const nvinfer1::PluginTensorDesc* in) const;

  gemm::Plan plan_;  // what enqueue runs (attrs_.plan until resolve_plan)
};

}  // namespace fdpp
