// TensorRT IPluginV3 adapter of fdpp::RMSNorm: translates tensors and the epsilon attribute, calls fdpp::rms_norm.
#include "RMSNormPlugin/RMSNormPlugin.h"

#include <string>

#include "common/fields.h"
#include "common/registry.h"

namespace fdpp {
namespace {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;
using Spec = AttributeSpec<RmsNormAttributes>;

// The contract's attributes (names and ranges: contract.json through fdpp_contract_constants.h).
const Spec kAttributes[] = {
    {"epsilon", PluginFieldType::kFLOAT32, true,
     [](const PluginField& f, RmsNormAttributes& a) {
       a.epsilon = read_float(f, contract::kRmsNormEpsilonMin, contract::kRmsNormEpsilonMax);
     },
     [](const RmsNormAttributes& a) { return float_value(a.epsilon); }},
};

}  // namespace

RmsNormAttributes RmsNormAttributes::parse(const nvinfer1::PluginFieldCollection* fc) {
  return parse_attributes(fc, RMSNormPlugin::attributes(), RmsNormAttributes{});
}

AttributeTable<RmsNormAttributes> RMSNormPlugin::attributes() { return kAttributes; }

bool RMSNormPlugin::make_params(const nvinfer1::Dims& x, const nvinfer1::Dims& weight, DataType type,
                                RmsNormParams* p) const {
  if (x.nbDims < 1 || weight.nbDims != 1 || x.d[x.nbDims - 1] != weight.d[0]) {
    log_error("x must be [..., hidden] and weight [hidden]");
    return false;
  }
  if (!is_kernel_type(type)) {
    log_error("x must be float16 or bfloat16");
    return false;
  }
  const int64_t hidden = weight.d[0];
  if (hidden < kRmsNormAlign || hidden > kRmsNormMaxHidden || hidden % kRmsNormAlign != 0) {
    log_error("hidden " + std::to_string(hidden) + " is not supported; the kernel takes a multiple of " +
              std::to_string(kRmsNormAlign) + " up to " + std::to_string(kRmsNormMaxHidden));
    return false;
  }
  int64_t rows = 1;
  for (int i = 0; i + 1 < x.nbDims; ++i) rows *= x.d[i];
  p->dtype = type == DataType::kBF16 ? NormDtype::kBFloat16 : NormDtype::kFloat16;
  p->hidden = static_cast<int>(hidden), p->rows = rows, p->epsilon = attrs_.epsilon;
  p->x_row_stride = hidden, p->y_row_stride = hidden;  // linear layout: rows are contiguous
  return true;
}

int32_t RMSNormPlugin::configurePlugin(const nvinfer1::DynamicPluginTensorDesc* in, int32_t nbInputs,
                                       const nvinfer1::DynamicPluginTensorDesc* /*out*/, int32_t nbOutputs) noexcept {
  return guarded<RMSNormPlugin>("configurePlugin", -1, [&] {
    if (nbInputs != 2 || nbOutputs != 1) {
      log_error("expected 2 inputs (x, weight) and 1 output");
      return -1;
    }
    RmsNormParams p;
    return make_params(in[0].max, in[1].max, in[0].desc.type, &p) ? 0 : -1;
  });
}

int32_t RMSNormPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs, const DataType* inputTypes,
                                          int32_t nbInputs) const noexcept {
  return guarded<RMSNormPlugin>("getOutputDataTypes", -1, [&] {
    if (nbOutputs != 1 || nbInputs != 2) return -1;
    outputTypes[0] = inputTypes[0];
    return 0;
  });
}

int32_t RMSNormPlugin::getOutputShapes(const nvinfer1::DimsExprs* inputs, int32_t nbInputs,
                                       const nvinfer1::DimsExprs* /*shapeInputs*/, int32_t /*nbShapeInputs*/,
                                       nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                                       nvinfer1::IExprBuilder& /*builder*/) noexcept {
  return guarded<RMSNormPlugin>("getOutputShapes", -1, [&] {
    if (nbInputs != 2 || nbOutputs != 1 || inputs[0].nbDims < 1) return -1;
    outputs[0] = inputs[0];
    return 0;
  });
}

size_t RMSNormPlugin::getWorkspaceSize(const nvinfer1::DynamicPluginTensorDesc* /*inputs*/, int32_t /*nbInputs*/,
                                       const nvinfer1::DynamicPluginTensorDesc* /*outputs*/,
                                       int32_t /*nbOutputs*/) const noexcept {
  return 0;  // one CTA per row, everything in registers
}

int32_t RMSNormPlugin::onShapeChange(const nvinfer1::PluginTensorDesc* in, int32_t nbInputs,
                                     const nvinfer1::PluginTensorDesc* /*out*/, int32_t nbOutputs) noexcept {
  return guarded<RMSNormPlugin>("onShapeChange", -1, [&] {
    if (nbInputs != 2 || nbOutputs != 1) return -1;
    RmsNormParams p;
    return make_params(in[0].dims, in[1].dims, in[0].type, &p) ? 0 : -1;
  });
}

int32_t RMSNormPlugin::enqueue(const nvinfer1::PluginTensorDesc* inputDesc,
                               const nvinfer1::PluginTensorDesc* /*outputDesc*/, const void* const* inputs,
                               void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept {
  return guarded<RMSNormPlugin>("enqueue", -1, [&] {
    RmsNormParams p;
    if (!make_params(inputDesc[0].dims, inputDesc[1].dims, inputDesc[0].type, &p)) return -1;
    if (p.rows == 0) return 0;
    p.x = inputs[0], p.weight = inputs[1], p.y = outputs[0];
    return cuda_status("enqueue", rms_norm(p, stream));
  });
}

nvinfer1::IPluginCreatorInterface* rmsNormPluginCreator() { return creator_of<RMSNormPlugin>(); }

}  // namespace fdpp
