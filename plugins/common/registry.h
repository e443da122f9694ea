// The plugin creators getCreators() (registry.cpp, the library's TensorRT entry point) hands to TensorRT. Each
// adapter defines its creator factory in its own folder; a factory returns a creator with static storage duration
// (never freed).
#pragma once

#include <NvInferRuntime.h>

namespace fdpp {

nvinfer1::IPluginCreatorInterface* flatGemmPluginCreator();    // plugins/FlatGemmPlugin/FlatGemmPlugin.cpp
nvinfer1::IPluginCreatorInterface* attentionPluginCreator();   // plugins/AsyncSoftmaxAttentionPlugin/...Plugin.cpp
nvinfer1::IPluginCreatorInterface* rmsNormPluginCreator();     // plugins/RMSNormPlugin/RMSNormPlugin.cpp
nvinfer1::IPluginCreatorInterface* ropeAppendPluginCreator();  // plugins/RopeAppendPlugin/RopeAppendPlugin.cpp

}  // namespace fdpp
