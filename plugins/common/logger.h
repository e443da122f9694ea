// Logging for the TensorRT adapters, through the logger TensorRT hands over in setLoggerFinder() (logger.cpp).
#pragma once

#include <NvInferRuntime.h>

#include <string>

namespace fdpp {

// Logs through TensorRT's logger when setLoggerFinder gave us one (else stderr for errors). Never throws.
void trtLog(nvinfer1::ILogger::Severity severity, const char* message) noexcept;

// Logs "<plugin>: <message>" as an error. Never throws: a message lost to an allocation failure is replaced.
void log_plugin_error(const char* plugin, const std::string& message) noexcept;

// Logs "<plugin>: <method>: <what>" as an error, building the message inside (so a catch block can call it without
// allocating). Never throws.
void log_method_error(const char* plugin, const char* method, const char* what) noexcept;

}  // namespace fdpp
