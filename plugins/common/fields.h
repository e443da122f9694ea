// Reading the attributes TensorRT passes a plugin creator (PluginField), shared by the adapters. Each reader
// throws std::invalid_argument with a one-line message naming the field; the creators catch it.
#pragma once

#include <NvInferRuntime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace fdpp {

// An integer field (INT8/16/32/64) in [lo, hi].
int64_t read_int(const nvinfer1::PluginField& f, int64_t lo, int64_t hi);
// The same for an int32 attribute member: [lo, hi] lies within int32.
inline int32_t read_int32(const nvinfer1::PluginField& f, int32_t lo, int32_t hi) {
  return static_cast<int32_t>(read_int(f, lo, hi));
}

// An integer field that is one of choices[0 .. count).
int32_t read_int_choice(const nvinfer1::PluginField& f, const int* choices, size_t count);
template <size_t N>
int32_t read_int_choice(const nvinfer1::PluginField& f, const int (&choices)[N]) {
  return read_int_choice(f, choices, N);
}

// A float field (FLOAT32/64), finite and in [lo, hi].
float read_float(const nvinfer1::PluginField& f, double lo, double hi);

// A string field (CHAR; the length may or may not count a terminating NUL).
std::string read_string(const nvinfer1::PluginField& f);

// A string field that is one of choices[0 .. count).
std::string read_string_choice(const nvinfer1::PluginField& f, const char* const* choices, size_t count);
template <size_t N>
std::string read_string_choice(const nvinfer1::PluginField& f, const char* const (&choices)[N]) {
  return read_string_choice(f, choices, N);
}

}  // namespace fdpp
