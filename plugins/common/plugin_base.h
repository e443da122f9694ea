// What the fdpp IPluginV3 adapters share: the capability plumbing, names, the attributes and their serialization,
// the exception guard every noexcept method runs its body in, and the IPluginCreatorV3One creator.
// An adapter class Op : PluginBase<Op, Attributes> provides:
//   static constexpr const char* kName, kVersion  (= the contract's op and version)
//   static AttributeTable<Attributes> attributes()  (its kAttributes rows)
//   optionally std::optional<nvinfer1::DataType> fixed_type(int32_t pos, int32_t nbInputs) const  (index inputs)
// and Attributes provides static Attributes parse(const nvinfer1::PluginFieldCollection*), which throws
// std::invalid_argument naming the field.
#pragma once

#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "common/attributes.h"
#include "common/logger.h"

namespace fdpp {

// The plugins' namespace: the ONNX parser's default.
constexpr const char* kPluginNamespace = "";

// The types the CUDA kernels run (float32 is in the contracts for the CPU reference only).
inline bool is_kernel_type(nvinfer1::DataType t) {
  return t == nvinfer1::DataType::kHALF || t == nvinfer1::DataType::kBF16;
}

// Runs the body of a noexcept method of plugin Op: an exception must not cross noexcept (nor the C ABI behind
// TensorRT), so it becomes one logged line "<Op>: <method>: <what>" and the method returns failed.
template <class Op, class Result, class Body>
Result guarded(const char* method, Result failed, Body&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    log_method_error(Op::kName, method, e.what());
  } catch (...) {
    log_method_error(Op::kName, method, "unknown exception");
  }
  return failed;
}

template <class Op, class Attributes>
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuildV2,
                   public nvinfer1::IPluginV3OneRuntime {
 public:
  // The creator's factory for both phases; throws std::invalid_argument naming a bad field.
  static Op* create(const nvinfer1::PluginFieldCollection* fc) { return new Op(Attributes::parse(fc)); }

  // The creator's field names: the attribute rows without data.
  static const nvinfer1::PluginFieldCollection* fieldNames() {
    static FieldTable names;
    static const nvinfer1::PluginFieldCollection* collection = names.names(Op::attributes());
    return collection;
  }

  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuildV2*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
  }

  nvinfer1::IPluginV3* clone() noexcept override {
    return guarded<Op>("clone", static_cast<nvinfer1::IPluginV3*>(nullptr),
                       [&] { return new Op(static_cast<const Op&>(*this)); });
  }

  // The plugin holds no per-context resources: each execution context gets its own copy.
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept override {
    return clone();
  }

  const char* getPluginName() const noexcept override { return Op::kName; }
  const char* getPluginVersion() const noexcept override { return Op::kVersion; }
  const char* getPluginNamespace() const noexcept override { return kPluginNamespace; }

  // One output; an Op with more overrides this.
  int32_t getNbOutputs() const noexcept override { return 1; }

  // Every tensor linear; input 0 of a kernel type and every other tensor of input 0's type, except the positions
  // Op::fixed_type names.
  bool supportsFormatCombination(int32_t pos, const nvinfer1::DynamicPluginTensorDesc* inOut, int32_t nbInputs,
                                 int32_t nbOutputs) noexcept override {
    return guarded<Op>("supportsFormatCombination", false, [&] {
      if (pos < 0 || pos >= nbInputs + nbOutputs) return false;
      const nvinfer1::PluginTensorDesc& d = inOut[pos].desc;
      if (d.format != nvinfer1::TensorFormat::kLINEAR) return false;
      if (pos == 0) return is_kernel_type(d.type);
      const std::optional<nvinfer1::DataType> fixed = static_cast<const Op*>(this)->fixed_type(pos, nbInputs);
      return d.type == (fixed ? *fixed : inOut[0].desc.type);
    });
  }

  // The type tensor pos must have when it is not input 0's (an index or a float32 table); an Op with such inputs
  // hides this.
  std::optional<nvinfer1::DataType> fixed_type(int32_t /*pos*/, int32_t /*nbInputs*/) const { return std::nullopt; }

  // The node's attributes as parsed (not what a device resolved from them: that is resolved again on load).
  const nvinfer1::PluginFieldCollection* getFieldsToSerialize() noexcept override {
    return guarded<Op>("getFieldsToSerialize", static_cast<const nvinfer1::PluginFieldCollection*>(nullptr),
                       [&] { return serialized_.serialize(Op::attributes(), attrs_); });
  }

 protected:
  explicit PluginBase(Attributes attributes) : attrs_(std::move(attributes)) {}
  PluginBase(const PluginBase& other) : attrs_(other.attrs_) {}  // a copy serializes into its own fields
  PluginBase& operator=(const PluginBase&) = delete;

  static void log_error(const std::string& message) noexcept { log_plugin_error(Op::kName, message); }

  // A CUDA call's status as TensorRT's return code; a failure is logged as "<method>: <CUDA error> (<detail>)".
  static int32_t cuda_status(const char* method, cudaError_t err, const char* detail = "") {
    if (err == cudaSuccess) return 0;
    const std::string suffix = detail && *detail ? std::string(" (") + detail + ")" : "";
    log_error(std::string(method) + ": " + cudaGetErrorString(err) + suffix);
    return -1;
  }

  const Attributes attrs_;

 private:
  FieldTable serialized_;  // backs getFieldsToSerialize()'s collection
};

template <class Op>
class PluginCreator : public nvinfer1::IPluginCreatorV3One {
 public:
  // Both phases build from the same fields: the node's attributes (build) or getFieldsToSerialize's (runtime).
  nvinfer1::IPluginV3* createPlugin(const char* name, const nvinfer1::PluginFieldCollection* fc,
                                    nvinfer1::TensorRTPhase /*phase*/) noexcept override {
    try {
      return Op::create(fc);
    } catch (const std::exception& e) {
      log_plugin_error(Op::kName, std::string("cannot create '") + (name ? name : "") + "': " + e.what());
    } catch (...) {
      log_method_error(Op::kName, "createPlugin", "unknown exception");
    }
    return nullptr;
  }

  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override {
    return guarded<Op>("getFieldNames", static_cast<const nvinfer1::PluginFieldCollection*>(nullptr),
                       [] { return Op::fieldNames(); });
  }
  const char* getPluginName() const noexcept override { return Op::kName; }
  const char* getPluginVersion() const noexcept override { return Op::kVersion; }
  const char* getPluginNamespace() const noexcept override { return kPluginNamespace; }
};

// The creator factory an adapter's folder defines for registry.h: one creator with static storage duration.
template <class Op>
nvinfer1::IPluginCreatorInterface* creator_of() {
  static PluginCreator<Op> creator;
  return &creator;
}

}  // namespace fdpp
