// The adapters' attribute readers (fields.h).
#include "common/fields.h"

#include "common/attributes.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace fdpp {
namespace {

using nvinfer1::PluginField;
using nvinfer1::PluginFieldType;

// %g: "-6" and "1e-06", not std::to_string's "-6.000000" and "0.000001".
std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

std::string field_name(const PluginField& f) { return std::string("attribute ") + (f.name ? f.name : "?"); }

void require_data(const PluginField& f) {
  if (f.data == nullptr || f.length < 1) throw std::invalid_argument(field_name(f) + " is empty");
}

int64_t raw_int(const PluginField& f) {
  require_data(f);
  switch (f.type) {
    case PluginFieldType::kINT8: return *static_cast<const int8_t*>(f.data);
    case PluginFieldType::kINT16: return *static_cast<const int16_t*>(f.data);
    case PluginFieldType::kINT32: return *static_cast<const int32_t*>(f.data);
    case PluginFieldType::kINT64: return *static_cast<const int64_t*>(f.data);
    default: throw std::invalid_argument(field_name(f) + " must be an integer");
  }
}

}  // namespace

int64_t read_int(const PluginField& f, int64_t lo, int64_t hi) {
  const int64_t v = raw_int(f);
  if (v < lo || v > hi)
    throw std::invalid_argument(field_name(f) + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) +
                                ", " + std::to_string(hi) + "]");
  return v;
}

int32_t read_int_choice(const PluginField& f, const int* choices, size_t count) {
  const int64_t v = raw_int(f);
  std::string listed;
  for (size_t i = 0; i < count; ++i) {
    if (v == choices[i]) return choices[i];
    listed += (listed.empty() ? "" : ", ") + std::to_string(choices[i]);
  }
  throw std::invalid_argument(field_name(f) + " = " + std::to_string(v) + " is not one of " + listed);
}

float read_float(const PluginField& f, double lo, double hi) {
  require_data(f);
  double v;
  switch (f.type) {
    case PluginFieldType::kFLOAT32: v = *static_cast<const float*>(f.data); break;
    case PluginFieldType::kFLOAT64: v = *static_cast<const double*>(f.data); break;
    default: throw std::invalid_argument(field_name(f) + " must be a float");
  }
  if (!std::isfinite(v) || v < lo || v > hi)
    throw std::invalid_argument(field_name(f) + " = " + number(v) + " is outside [" + number(lo) + ", " + number(hi) +
                                "]");
  return static_cast<float>(v);
}

std::string read_string(const PluginField& f) {
  if (f.type != PluginFieldType::kCHAR) throw std::invalid_argument(field_name(f) + " must be a string");
  if (f.data == nullptr || f.length < 0) return std::string();
  const char* chars = static_cast<const char*>(f.data);
  return std::string(chars, strnlen(chars, static_cast<size_t>(f.length)));
}

std::string read_string_choice(const PluginField& f, const char* const* choices, size_t count) {
  const std::string v = read_string(f);
  std::string listed;
  for (size_t i = 0; i < count; ++i) {
    if (v == choices[i]) return v;
    listed += (listed.empty() ? "" : ", ") + std::string(choices[i]);
  }
  throw std::invalid_argument(field_name(f) + " = '" + v + "' is not one of " + listed);
}

// TensorRT's ONNX parser picks the creator by plugin_version and plugin_namespace and may pass them along.
bool is_routing_field(const std::string& name) { return name == "plugin_version" || name == "plugin_namespace"; }

}  // namespace fdpp
