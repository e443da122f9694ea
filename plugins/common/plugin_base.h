// What the fdpp IPluginV3 adapters share: the capability plumbing, names, and the IPluginCreatorV3One creator.
// An adapter class Op provides:
//   static constexpr const char* kName, kVersion, kNamespace  (= the contract's op and version, namespace "")
//   static Op* create(const nvinfer1::PluginFieldCollection*)  (throws std::invalid_argument naming the field)
//   static const nvinfer1::PluginFieldCollection* fieldNames()
#pragma once

#include <NvInferRuntime.h>

#include <exception>
#include <string>

#include "common/logger.h"

namespace fdpp {

template <class Op>
class PluginBase : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuildV2,
                   public nvinfer1::IPluginV3OneRuntime {
 public:
  nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override {
    switch (type) {
      case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
      case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuildV2*>(this);
      case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
  }

  nvinfer1::IPluginV3* clone() noexcept override {
    try {
      return new Op(static_cast<const Op&>(*this));
    } catch (const std::exception& e) {
      log_plugin_error(Op::kName, std::string("clone: ") + e.what());
      return nullptr;
    }
  }

  // The plugin holds no per-context resources: each execution context gets its own copy.
  nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept override {
    return clone();
  }

  const char* getPluginName() const noexcept override { return Op::kName; }
  const char* getPluginVersion() const noexcept override { return Op::kVersion; }
  const char* getPluginNamespace() const noexcept override { return Op::kNamespace; }
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
      log_plugin_error(Op::kName, "createPlugin: unknown exception");
    }
    return nullptr;
  }

  const nvinfer1::PluginFieldCollection* getFieldNames() noexcept override {
    try {
      return Op::fieldNames();
    } catch (...) {
      return nullptr;
    }
  }
  const char* getPluginName() const noexcept override { return Op::kName; }
  const char* getPluginVersion() const noexcept override { return Op::kVersion; }
  const char* getPluginNamespace() const noexcept override { return Op::kNamespace; }
};

}  // namespace fdpp
