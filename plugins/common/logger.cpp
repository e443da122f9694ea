// setLoggerFinder(), the second exported TensorRT entry point, and the adapters' logging through it.
#include "common/logger.h"

#include <atomic>
#include <cstdio>

#include "capi/fdpp_capi.h"  // FDPP_API (default visibility)

namespace {

std::atomic<nvinfer1::ILoggerFinder*> g_logger_finder{nullptr};

constexpr const char* kMessageLost = "fdpp plugin error (message lost: out of memory)";

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

void log_plugin_error(const char* plugin, const std::string& message) noexcept {
  try {
    trtLog(nvinfer1::ILogger::Severity::kERROR, (std::string(plugin) + ": " + message).c_str());
  } catch (...) {
    trtLog(nvinfer1::ILogger::Severity::kERROR, kMessageLost);
  }
}

void log_method_error(const char* plugin, const char* method, const char* what) noexcept {
  try {
    log_plugin_error(plugin, std::string(method) + ": " + what);
  } catch (...) {
    trtLog(nvinfer1::ILogger::Severity::kERROR, kMessageLost);
  }
}

}  // namespace fdpp

extern "C" {

FDPP_API void setLoggerFinder(nvinfer1::ILoggerFinder* finder) { g_logger_finder.store(finder); }

}  // extern "C"
