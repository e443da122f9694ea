// The two symbols a TensorRT plugin library exports (trtexec --dynamicPlugins, IPluginRegistry::loadLibrary):
// getCreators() lists every fdpp plugin creator, setLoggerFinder() hands us TensorRT's logger.
#include "FlatGemmPlugin/pluginRegistry.h"

#include <atomic>
#include <cstdio>

#include "capi/fdpp_capi.h"  // FDPP_API (default visibility)

namespace {

std::atomic<nvinfer1::ILoggerFinder*> g_logger_finder{nullptr};

}  // namespace

namespace fdpp {

void trtLog(nvinfer1::ILogger::Severity severity, const char* message) noexcept {
  try {
    nvinfer1::ILoggerFinder* finder = g_logger_finder.load();
    nvinfer1::ILogger* logger = finder ? finder->findLogger() : nullptr;
    if (logger != nullptr) {
      logger->log(severity, message);
    } else if (severity <= nvinfer1::ILogger::Severity::kERROR) {
      std::fprintf(stderr, "fdpp plugin: %s\n", message);
    }
  } catch (...) {
    // Logging must never take the engine down.
  }
}

}  // namespace fdpp

extern "C" {

FDPP_API void setLoggerFinder(nvinfer1::ILoggerFinder* finder) { g_logger_finder.store(finder); }

FDPP_API nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  static nvinfer1::IPluginCreatorInterface* creators[2] = {nullptr, nullptr};
  static int32_t count = [] {
    int32_t n = 0;
    creators[n++] = fdpp::flatGemmPluginCreator();
    if (fdpp::attentionPluginCreator != nullptr) {
      if (nvinfer1::IPluginCreatorInterface* attention = fdpp::attentionPluginCreator()) creators[n++] = attention;
    }
    return n;
  }();
  nbCreators = count;
  return creators;
}

}  // extern "C"
