// An adapter's attributes as one table (AttributeSpec rows, one per contract attribute): the creator's field names,
// the constructor's parse and validation, and getFieldsToSerialize all walk the same rows, so an attribute added
// to a contract is one new row in the adapter.
#pragma once

#include <NvInferRuntime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fdpp {

// One serialized value; which member counts follows the row's type.
struct FieldValue {
  float f = 0.f;
  int32_t i = 0;
  std::string s;
};

template <class Attributes>
struct AttributeSpec {
  const char* name;                // the ONNX attribute and the PluginField name
  nvinfer1::PluginFieldType type;  // kFLOAT32, kINT32 or kCHAR: what the ONNX parser passes for float/int/string
  bool required;                   // the contract's "required": no default
  // Reads and validates one field into the attributes (throws std::invalid_argument naming the field).
  void (*read)(const nvinfer1::PluginField& field, Attributes& into);
  // The value getFieldsToSerialize writes, which read() accepts back.
  FieldValue (*value)(const Attributes& from);
};

// Fields every plugin node may carry for TensorRT's ONNX parser to find the creator; not attributes of the op.
bool is_routing_field(const std::string& name);

// Parses a field collection (any order) over the defaults; throws std::invalid_argument on an unknown, repeated or
// missing required field.
template <class Attributes, size_t N>
Attributes parse_attributes(const nvinfer1::PluginFieldCollection* fc, const AttributeSpec<Attributes> (&specs)[N],
                            Attributes defaults) {
  bool seen[N] = {};
  for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
    const nvinfer1::PluginField& f = fc->fields[i];
    const std::string name = f.name ? f.name : "";
    size_t row = 0;
    while (row < N && name != specs[row].name) ++row;
    if (row == N) {
      if (is_routing_field(name)) continue;
      throw std::invalid_argument("unknown attribute '" + name + "'");
    }
    if (seen[row]) throw std::invalid_argument("attribute " + name + " is given twice");
    specs[row].read(f, defaults);
    seen[row] = true;
  }
  for (size_t row = 0; row < N; ++row) {
    if (specs[row].required && !seen[row])
      throw std::invalid_argument(std::string("attribute ") + specs[row].name + " is required");
  }
  return defaults;
}

// The storage behind a PluginFieldCollection that must outlive the call returning it: the creator's field names
// (no data) or a plugin's serialized fields.
class FieldTable {
 public:
  template <class Attributes, size_t N>
  const nvinfer1::PluginFieldCollection* names(const AttributeSpec<Attributes> (&specs)[N]) {
    values_.clear();
    fields_.clear();
    for (const auto& spec : specs) fields_.emplace_back(spec.name, nullptr, spec.type, spec.type == kChar ? 0 : 1);
    return finish();
  }

  template <class Attributes, size_t N>
  const nvinfer1::PluginFieldCollection* serialize(const AttributeSpec<Attributes> (&specs)[N],
                                                   const Attributes& attributes) {
    values_.clear();
    fields_.clear();
    values_.reserve(N);  // fields_ points into values_: no reallocation after the first push
    for (const auto& spec : specs) values_.push_back(spec.value(attributes));
    for (size_t row = 0; row < N; ++row) {
      const FieldValue& v = values_[row];
      const void* data = specs[row].type == kChar ? static_cast<const void*>(v.s.c_str())
                         : specs[row].type == nvinfer1::PluginFieldType::kFLOAT32 ? static_cast<const void*>(&v.f)
                                                                                  : static_cast<const void*>(&v.i);
      const int32_t length = specs[row].type == kChar ? static_cast<int32_t>(v.s.size() + 1) : 1;
      fields_.emplace_back(specs[row].name, data, specs[row].type, length);
    }
    return finish();
  }

 private:
  static constexpr nvinfer1::PluginFieldType kChar = nvinfer1::PluginFieldType::kCHAR;

  const nvinfer1::PluginFieldCollection* finish() {
    collection_.nbFields = static_cast<int32_t>(fields_.size());
    collection_.fields = fields_.data();
    return &collection_;
  }

  std::vector<FieldValue> values_;
  std::vector<nvinfer1::PluginField> fields_;
  nvinfer1::PluginFieldCollection collection_{};
};

}  // namespace fdpp
