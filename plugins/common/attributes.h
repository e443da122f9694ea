// An adapter's attributes as one table (AttributeSpec rows, one per contract attribute): the creator's field names,
// the constructor's parse and validation, and getFieldsToSerialize all walk the same rows, so an attribute added
// to a contract is one new row in the adapter.
#pragma once

#include <NvInferRuntime.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace fdpp {

// One serialized value; which member counts follows the row's type.
struct FieldValue {
  float f = 0.f;
  int32_t i = 0;
  std::string s;
};

inline FieldValue float_value(float f) { return FieldValue{f, 0, {}}; }
inline FieldValue int_value(int32_t i) { return FieldValue{0.f, i, {}}; }
inline FieldValue text_value(std::string s) { return FieldValue{0.f, 0, std::move(s)}; }

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

// An adapter's rows, whatever their number: what PluginBase reaches through Op::attributes().
template <class Attributes>
class AttributeTable {
 public:
  // Implicit, so that an adapter's attributes() returns its kAttributes array as it is.
  template <size_t N>
  AttributeTable(const AttributeSpec<Attributes> (&rows)[N]) : rows_(rows), size_(N) {}
  size_t size() const { return size_; }
  const AttributeSpec<Attributes>& operator[](size_t row) const { return rows_[row]; }
  const AttributeSpec<Attributes>* begin() const { return rows_; }
  const AttributeSpec<Attributes>* end() const { return rows_ + size_; }

 private:
  const AttributeSpec<Attributes>* rows_;
  size_t size_;
};

// Fields every plugin node may carry for TensorRT's ONNX parser to find the creator; not attributes of the op.
bool is_routing_field(const std::string& name);

// Parses a field collection (any order) over the defaults; throws std::invalid_argument on an unknown, repeated or
// missing required field.
template <class Attributes>
Attributes parse_attributes(const nvinfer1::PluginFieldCollection* fc, const AttributeTable<Attributes>& specs,
                            Attributes defaults) {
  const size_t count = specs.size();
  std::vector<bool> seen(count, false);
  for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
    const nvinfer1::PluginField& f = fc->fields[i];
    const std::string name = f.name ? f.name : "";
    size_t row = 0;
    while (row < count && name != specs[row].name) ++row;
    if (row == count) {
      if (is_routing_field(name)) continue;
      throw std::invalid_argument("unknown attribute '" + name + "'");
    }
    if (seen[row]) throw std::invalid_argument("attribute " + name + " is given twice");
    specs[row].read(f, defaults);
    seen[row] = true;
  }
  for (size_t row = 0; row < count; ++row) {
    if (specs[row].required && !seen[row])
      throw std::invalid_argument(std::string("attribute ") + specs[row].name + " is required");
  }
  return defaults;
}

// The storage behind a PluginFieldCollection that must outlive the call returning it: the creator's field names
// (no data) or a plugin's serialized fields.
class FieldTable {
 public:
  FieldTable() = default;
  FieldTable(const FieldTable&) = delete;  // fields_ points into values_ and collection_ into fields_: never copied
  FieldTable& operator=(const FieldTable&) = delete;

  template <class Attributes>
  const nvinfer1::PluginFieldCollection* names(const AttributeTable<Attributes>& specs) {
    values_.clear();
    fields_.clear();
    for (const auto& spec : specs) fields_.emplace_back(spec.name, nullptr, spec.type, spec.type == kChar ? 0 : 1);
    return finish();
  }

  template <class Attributes>
  const nvinfer1::PluginFieldCollection* serialize(const AttributeTable<Attributes>& specs,
                                                   const Attributes& attributes) {
    values_.clear();
    fields_.clear();
    values_.reserve(specs.size());  // fields_ points into values_: no reallocation after the first push
    for (const auto& spec : specs) values_.push_back(spec.value(attributes));
    for (size_t row = 0; row < specs.size(); ++row) {
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
