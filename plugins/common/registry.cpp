// getCreators(), one of the two symbols a TensorRT plugin library exports (trtexec --dynamicPlugins,
// IPluginRegistry::loadLibrary): every fdpp plugin creator. The other, setLoggerFinder(), is in logger.cpp.
#include "common/registry.h"

#include "capi/fdpp_capi.h"  // FDPP_API (default visibility)

extern "C" {

FDPP_API nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  static nvinfer1::IPluginCreatorInterface* const creators[] = {
      fdpp::flatGemmPluginCreator(), fdpp::attentionPluginCreator(), fdpp::rmsNormPluginCreator(),
      fdpp::ropeAppendPluginCreator()};
  nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
  return creators;
}

}  // extern "C"
