// What the library's TensorRT plugin adapters share: the creators that getCreators() (pluginRegistry.cpp, the
// one file that defines the exported entry points) hands to TensorRT, and logging through the logger TensorRT
// gives us in setLoggerFinder().
//
// Each adapter defines its creator factory in its own folder:
//   plugins/FlatGemmPlugin/FlatGemmPlugin.cpp                    fdpp::flatGemmPluginCreator()
//   plugins/AsyncSoftmaxAttentionPlugin/<its file>.cpp           fdpp::attentionPluginCreator()
// A factory returns a pointer to a creator with static storage duration (never freed).
#pragma once

#include <NvInferRuntime.h>

namespace fdpp {

nvinfer1::IPluginCreatorInterface* flatGemmPluginCreator();
// Declared weak so the library still links (and getCreators lists only the GEMM) while the attention adapter
// is absent from a build.
__attribute__((weak)) nvinfer1::IPluginCreatorInterface* attentionPluginCreator();

// Logs through TensorRT's logger when setLoggerFinder gave us one (else stderr for errors). Never throws.
void trtLog(nvinfer1::ILogger::Severity severity, const char* message) noexcept;

}  // namespace fdpp
