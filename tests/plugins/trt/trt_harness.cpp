// Drives one fdpp TensorRT plugin the way TensorRT does, without TensorRT: dlopen the plugin library, find the
// creator through getCreators, create the plugin from a node's attributes, run the build-phase calls (with an
// expression builder of ours), serialize through getFieldsToSerialize, recreate the plugin for the runtime phase,
// and, when a CUDA device is visible and the spec names input files, enqueue it eagerly and inside a CUDA graph.
//
//   fdpp_trt_harness LIBRARY SPEC
//
// SPEC is text written by tests/plugins/trt/test_trt_harness.py, one item a line:
//   plugin NAME VERSION                     the creator to find (namespace "")
//   field NAME int|float|string VALUE       one node attribute (string: the rest of the line)
//   case LABEL                              a set of tensor shapes; the lines below belong to it
//   input half|bf16|float|int64 D0,D1,.. [FILE]   an input tensor (FILE: its raw bytes, for enqueue)
//   output FILE                             where enqueue writes output 0 (output i > 0: FILE.i)
// It prints what each call answered, a line each ("key value..."), for the test to check; errors the plugin
// logs come out as "log ..." lines. Exit code 0, or 2 for a bad spec or a call that failed.
#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace nv = nvinfer1;

namespace {

// ---- what TensorRT would provide ------------------------------------------------------------------------------
class PrintingLogger : public nv::ILogger {
 public:
  void log(Severity severity, const char* msg) noexcept override {
    std::printf("log %d %s\n", static_cast<int>(severity), msg);
  }
};

class LoggerFinder : public nv::ILoggerFinder {
 public:
  nv::ILogger* findLogger() noexcept override { return &logger_; }

 private:
  PrintingLogger logger_;
};

// Every shape the harness gives is concrete, so each expression is a constant (TensorRT's builder also has
// symbolic ones; the adapters only combine what they are given).
class ConstantExpr : public nv::IDimensionExpr {
 public:
  explicit ConstantExpr(int64_t value) : impl_(value) { mImpl = &impl_; }

 private:
  struct Impl : nv::apiv::VDimensionExpr {
    explicit Impl(int64_t v) : value(v) {}
    bool isConstant() const override { return true; }
    int64_t getConstantValue() const override { return value; }
    bool isSizeTensor() const override { return false; }
    int64_t value;
  };
  Impl impl_;
};

class ConstantExprBuilder : public nv::IExprBuilder {
 public:
  ConstantExprBuilder() : impl_(this) { mImpl = &impl_; }
  const nv::IDimensionExpr* make(int64_t value) {
    exprs_.push_back(std::make_unique<ConstantExpr>(value));
    return exprs_.back().get();
  }

 private:
  struct Impl : nv::apiv::VExprBuilder {
    explicit Impl(ConstantExprBuilder* b) : builder(b) {}
    const nv::IDimensionExpr* constant(int64_t value) override { return builder->make(value); }
    const nv::IDimensionExpr* operation(nv::DimensionOperation op, const nv::IDimensionExpr& a,
                                        const nv::IDimensionExpr& b) override {
      const int64_t x = a.getConstantValue(), y = b.getConstantValue();
      switch (op) {
        case nv::DimensionOperation::kSUM: return builder->make(x + y);
        case nv::DimensionOperation::kPROD: return builder->make(x * y);
        case nv::DimensionOperation::kMAX: return builder->make(x > y ? x : y);
        case nv::DimensionOperation::kMIN: return builder->make(x < y ? x : y);
        case nv::DimensionOperation::kSUB: return builder->make(x - y);
        case nv::DimensionOperation::kEQUAL: return builder->make(x == y);
        case nv::DimensionOperation::kLESS: return builder->make(x < y);
        case nv::DimensionOperation::kFLOOR_DIV: return y == 0 ? nullptr : builder->make(x / y);
        case nv::DimensionOperation::kCEIL_DIV: return y == 0 ? nullptr : builder->make((x + y - 1) / y);
      }
      return nullptr;
    }
    const nv::IDimensionExpr* declareSizeTensor(int32_t, const nv::IDimensionExpr&,
                                                const nv::IDimensionExpr&) override {
      return nullptr;  // no fdpp plugin has data-dependent output shapes
    }
    ConstantExprBuilder* builder;
  };
  Impl impl_;
  std::vector<std::unique_ptr<ConstantExpr>> exprs_;
};

// ---- the spec -------------------------------------------------------------------------------------------------
struct Field {
  std::string name, type, text;
  int32_t i = 0;
  float f = 0.f;
};

struct Tensor {
  nv::DataType type = nv::DataType::kHALF;
  nv::Dims dims{};
  std::string file;
};

struct Case {
  std::string label;
  std::vector<Tensor> inputs;
  std::string output_file;
};

struct Spec {
  std::string plugin, version;
  std::vector<Field> fields;
  std::vector<Case> cases;
};

[[noreturn]] void fail(const std::string& message) {
  std::printf("error %s\n", message.c_str());
  std::exit(2);
}

nv::DataType parse_type(const std::string& s) {
  if (s == "half") return nv::DataType::kHALF;
  if (s == "bf16") return nv::DataType::kBF16;
  if (s == "float") return nv::DataType::kFLOAT;
  if (s == "int64") return nv::DataType::kINT64;
  fail("unknown tensor type " + s);
}

const char* type_name(nv::DataType t) {
  switch (t) {
    case nv::DataType::kHALF: return "half";
    case nv::DataType::kBF16: return "bf16";
    case nv::DataType::kFLOAT: return "float";
    case nv::DataType::kINT64: return "int64";
    case nv::DataType::kINT32: return "int32";
    default: return "other";
  }
}

size_t type_size(nv::DataType t) {
  return t == nv::DataType::kINT64 ? 8 : t == nv::DataType::kFLOAT || t == nv::DataType::kINT32 ? 4 : 2;
}

Spec read_spec(const char* path) {
  std::ifstream in(path);
  if (!in) fail(std::string("cannot read ") + path);
  Spec spec;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    if (!(words >> key)) continue;
    if (key == "plugin") {
      words >> spec.plugin >> spec.version;
    } else if (key == "field") {
      Field f;
      words >> f.name >> f.type;
      std::getline(words >> std::ws, f.text);
      if (f.type == "int") f.i = static_cast<int32_t>(std::stol(f.text));
      else if (f.type == "float") f.f = std::stof(f.text);
      else if (f.type != "string") fail("unknown field type " + f.type);
      spec.fields.push_back(f);
    } else if (key == "case") {
      spec.cases.emplace_back();
      words >> spec.cases.back().label;
    } else if (key == "input" || key == "output") {
      if (spec.cases.empty()) fail(key + " before the first case");
      if (key == "output") {
        words >> spec.cases.back().output_file;
        continue;
      }
      Tensor t;
      std::string type, dims;
      words >> type >> dims >> t.file;
      t.type = parse_type(type);
      std::istringstream ds(dims);
      std::string d;
      while (std::getline(ds, d, ',')) t.dims.d[t.dims.nbDims++] = std::stol(d);
      spec.cases.back().inputs.push_back(t);
    } else {
      fail("unknown spec line: " + line);
    }
  }
  return spec;
}

// The node's attributes as TensorRT's ONNX parser passes them: ints as INT32, floats as FLOAT32, strings as CHAR.
std::vector<nv::PluginField> to_plugin_fields(const std::vector<Field>& fields) {
  std::vector<nv::PluginField> out;
  for (const Field& f : fields) {
    if (f.type == "int") out.emplace_back(f.name.c_str(), &f.i, nv::PluginFieldType::kINT32, 1);
    else if (f.type == "float") out.emplace_back(f.name.c_str(), &f.f, nv::PluginFieldType::kFLOAT32, 1);
    else
      out.emplace_back(f.name.c_str(), f.text.c_str(), nv::PluginFieldType::kCHAR, static_cast<int32_t>(f.text.size()));
  }
  return out;
}

std::string dims_text(const nv::Dims& d) {
  std::string s;
  for (int i = 0; i < d.nbDims; ++i) s += (i ? "," : "") + std::to_string(d.d[i]);
  return s;
}

// "name type value" of each serialized field, in order.
std::vector<std::string> describe(const nv::PluginFieldCollection* fc) {
  std::vector<std::string> lines;
  for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i) {
    const nv::PluginField& f = fc->fields[i];
    std::string value;
    if (f.type == nv::PluginFieldType::kINT32) value = "int " + std::to_string(*static_cast<const int32_t*>(f.data));
    else if (f.type == nv::PluginFieldType::kFLOAT32) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "float %.9g", static_cast<double>(*static_cast<const float*>(f.data)));
      value = buf;
    } else if (f.type == nv::PluginFieldType::kCHAR) {
      const char* chars = static_cast<const char*>(f.data);
      value = "string " + std::string(chars, strnlen(chars, static_cast<size_t>(f.length)));
    } else {
      value = "other";
    }
    lines.push_back(std::string(f.name) + " " + value);
  }
  return lines;
}

// ---- the calls ------------------------------------------------------------------------------------------------
struct Capabilities {
  nv::IPluginV3OneCore* core;
  nv::IPluginV3OneBuildV2* build;  // every fdpp adapter has the V2 build capability (getAliasedInput)
  nv::IPluginV3OneRuntime* runtime;
};

Capabilities capabilities(nv::IPluginV3* plugin, bool need_build) {
  Capabilities c{
      static_cast<nv::IPluginV3OneCore*>(plugin->getCapabilityInterface(nv::PluginCapabilityType::kCORE)),
      static_cast<nv::IPluginV3OneBuildV2*>(plugin->getCapabilityInterface(nv::PluginCapabilityType::kBUILD)),
      static_cast<nv::IPluginV3OneRuntime*>(plugin->getCapabilityInterface(nv::PluginCapabilityType::kRUNTIME))};
  if (c.core == nullptr || c.runtime == nullptr || (need_build && c.build == nullptr))
    fail("getCapabilityInterface returned null");
  return c;
}

// The build phase for one case: what TensorRT's builder asks while it adds the layer and picks formats.
size_t build_phase(nv::IPluginV3OneBuildV2* build, const Case& c) {
  const int32_t nb_in = static_cast<int32_t>(c.inputs.size());
  const int32_t nb_out = build->getNbOutputs();
  std::printf("case %s\nnb_outputs %d\n", c.label.c_str(), nb_out);
  std::vector<nv::DataType> in_types, out_types(nb_out);
  for (const Tensor& t : c.inputs) in_types.push_back(t.type);
  if (build->getOutputDataTypes(out_types.data(), nb_out, in_types.data(), nb_in) != 0)
    fail("getOutputDataTypes failed");

  ConstantExprBuilder exprs;
  std::vector<nv::DimsExprs> in_exprs(nb_in), out_exprs(nb_out);
  for (int32_t i = 0; i < nb_in; ++i) {
    in_exprs[i].nbDims = c.inputs[i].dims.nbDims;
    for (int j = 0; j < in_exprs[i].nbDims; ++j) in_exprs[i].d[j] = exprs.make(c.inputs[i].dims.d[j]);
  }
  if (build->getOutputShapes(in_exprs.data(), nb_in, nullptr, 0, out_exprs.data(), nb_out, exprs) != 0)
    fail("getOutputShapes failed");

  std::vector<nv::DynamicPluginTensorDesc> descs(nb_in + nb_out);
  for (int32_t i = 0; i < nb_in + nb_out; ++i) {
    nv::PluginTensorDesc& d = descs[i].desc;
    d.format = nv::TensorFormat::kLINEAR;
    d.scale = 1.f;
    if (i < nb_in) {
      d.type = c.inputs[i].type;
      d.dims = c.inputs[i].dims;
    } else {
      const nv::DimsExprs& e = out_exprs[i - nb_in];
      d.type = out_types[i - nb_in];
      d.dims.nbDims = e.nbDims;
      for (int j = 0; j < e.nbDims; ++j) d.dims.d[j] = e.d[j]->getConstantValue();
      std::printf("output %d %s %s\n", i - nb_in, type_name(d.type), dims_text(d.dims).c_str());
      std::printf("alias %d %d\n", i - nb_in, build->getAliasedInput(i - nb_in));
    }
    descs[i].min = descs[i].opt = descs[i].max = d.dims;
  }
  // TensorRT asks position by position, the earlier ones already fixed; so do we.
  for (int32_t pos = 0; pos < nb_in + nb_out; ++pos)
    std::printf("format %d %d\n", pos, build->supportsFormatCombination(pos, descs.data(), nb_in, nb_out) ? 1 : 0);
  nv::DynamicPluginTensorDesc as_float = descs[0];  // the contract's float32 is the CPU reference's, not a kernel's
  as_float.desc.type = nv::DataType::kFLOAT;
  std::vector<nv::DynamicPluginTensorDesc> float_descs = descs;
  float_descs[0] = as_float;
  std::printf("format_float32 %d\n", build->supportsFormatCombination(0, float_descs.data(), nb_in, nb_out) ? 1 : 0);
  std::printf("configure %d\n", build->configurePlugin(descs.data(), nb_in, descs.data() + nb_in, nb_out));
  const size_t workspace = build->getWorkspaceSize(descs.data(), nb_in, descs.data() + nb_in, nb_out);
  std::printf("workspace %zu\n", workspace);
  return workspace;
}

bool read_file(const std::string& path, std::vector<char>* bytes, size_t expected) {
  std::ifstream in(path, std::ios::binary);
  bytes->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return bytes->size() == expected;
}

size_t elements(const nv::Dims& d) {
  size_t n = 1;
  for (int i = 0; i < d.nbDims; ++i) n *= static_cast<size_t>(d.d[i]);
  return n;
}

#define CUDA_OK(call)                                                                \
  do {                                                                               \
    const cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) fail(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

// The runtime phase on the GPU: onShapeChange, enqueue eagerly, then the same enqueue captured in a CUDA graph
// (from freshly uploaded inputs, into zeroed outputs) must write the same bytes. An output the plugin aliases to an
// input (getAliasedInput) is bound to that input's buffer, as TensorRT binds it.
void enqueue_case(nv::IPluginV3OneRuntime* runtime, nv::IPluginV3OneBuildV2* build, const Case& c, size_t workspace) {
  const int32_t nb_in = static_cast<int32_t>(c.inputs.size());
  const int32_t nb_out = build->getNbOutputs();
  std::vector<nv::PluginTensorDesc> in(nb_in), out(nb_out);
  for (int32_t i = 0; i < nb_in; ++i) in[i] = {c.inputs[i].dims, c.inputs[i].type, nv::TensorFormat::kLINEAR, 1.f};
  // The outputs' shapes and types: what the build phase answered for this case.
  ConstantExprBuilder exprs;
  std::vector<nv::DimsExprs> in_exprs(nb_in), out_exprs(nb_out);
  std::vector<nv::DataType> in_types, out_types(nb_out);
  for (int32_t i = 0; i < nb_in; ++i) {
    in_types.push_back(in[i].type);
    in_exprs[i].nbDims = in[i].dims.nbDims;
    for (int j = 0; j < in[i].dims.nbDims; ++j) in_exprs[i].d[j] = exprs.make(in[i].dims.d[j]);
  }
  if (build->getOutputShapes(in_exprs.data(), nb_in, nullptr, 0, out_exprs.data(), nb_out, exprs) != 0 ||
      build->getOutputDataTypes(out_types.data(), nb_out, in_types.data(), nb_in) != 0)
    fail("getOutputShapes or getOutputDataTypes failed");
  for (int32_t o = 0; o < nb_out; ++o) {
    out[o] = {nv::Dims{}, out_types[o], nv::TensorFormat::kLINEAR, 1.f};
    out[o].dims.nbDims = out_exprs[o].nbDims;
    for (int j = 0; j < out_exprs[o].nbDims; ++j) out[o].dims.d[j] = out_exprs[o].d[j]->getConstantValue();
  }
  std::printf("shape_change %d\n", runtime->onShapeChange(in.data(), nb_in, out.data(), nb_out));

  std::vector<std::vector<char>> host_in(nb_in);
  std::vector<void*> device_in(nb_in);
  for (int32_t i = 0; i < nb_in; ++i) {
    const size_t bytes = elements(in[i].dims) * type_size(in[i].type);
    if (!read_file(c.inputs[i].file, &host_in[i], bytes))
      fail("input file " + c.inputs[i].file + " has the wrong size");
    CUDA_OK(cudaMalloc(&device_in[i], bytes > 0 ? bytes : 1));
  }
  std::vector<size_t> out_bytes(nb_out);
  std::vector<void*> device_out(nb_out);
  std::vector<int32_t> alias(nb_out);
  for (int32_t o = 0; o < nb_out; ++o) {
    out_bytes[o] = elements(out[o].dims) * type_size(out[o].type);
    alias[o] = build->getAliasedInput(o);
    if (alias[o] >= 0) device_out[o] = device_in[alias[o]];
    else CUDA_OK(cudaMalloc(&device_out[o], out_bytes[o]));
  }
  void* device_ws = nullptr;
  CUDA_OK(cudaMalloc(&device_ws, workspace > 0 ? workspace : 1));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Copies and clears go on the plugin's stream: the stream is non-blocking, so a cudaMemset on the legacy
  // stream would not be ordered before the enqueue (under load it landed after it and zeroed the output).
  auto upload = [&] {
    for (int32_t i = 0; i < nb_in; ++i)
      CUDA_OK(cudaMemcpyAsync(device_in[i], host_in[i].data(), host_in[i].size(), cudaMemcpyHostToDevice, stream));
    for (int32_t o = 0; o < nb_out; ++o)
      if (alias[o] < 0) CUDA_OK(cudaMemsetAsync(device_out[o], 0, out_bytes[o], stream));
    CUDA_OK(cudaStreamSynchronize(stream));
  };
  auto download = [&] {
    std::vector<std::vector<char>> got(nb_out);
    for (int32_t o = 0; o < nb_out; ++o) {
      got[o].resize(out_bytes[o]);
      CUDA_OK(cudaMemcpyAsync(got[o].data(), device_out[o], out_bytes[o], cudaMemcpyDeviceToHost, stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    return got;
  };

  upload();
  std::printf("enqueue %d\n",
              runtime->enqueue(in.data(), out.data(), device_in.data(), device_out.data(), device_ws, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  const std::vector<std::vector<char>> eager = download();

  upload();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const int32_t captured =
      runtime->enqueue(in.data(), out.data(), device_in.data(), device_out.data(), device_ws, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  std::printf("graph_enqueue %d\n", captured);
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_OK(cudaGraphLaunch(exec, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  std::printf("graph_equal %d\n", download() == eager ? 1 : 0);

  for (int32_t o = 0; o < nb_out; ++o) {
    const std::string path = o == 0 ? c.output_file : c.output_file + "." + std::to_string(o);
    std::ofstream(path, std::ios::binary).write(eager[o].data(), static_cast<std::streamsize>(out_bytes[o]));
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
  for (void* p : device_in) CUDA_OK(cudaFree(p));
  for (int32_t o = 0; o < nb_out; ++o)
    if (alias[o] < 0) CUDA_OK(cudaFree(device_out[o]));
  CUDA_OK(cudaFree(device_ws));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) fail("usage: fdpp_trt_harness LIBRARY SPEC");
  const Spec spec = read_spec(argv[2]);

  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) fail(std::string("dlopen: ") + dlerror());
  using GetCreators = nv::IPluginCreatorInterface* const* (*)(int32_t&);
  using SetLoggerFinder = void (*)(nv::ILoggerFinder*);
  auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
  auto set_logger_finder = reinterpret_cast<SetLoggerFinder>(dlsym(lib, "setLoggerFinder"));
  if (get_creators == nullptr || set_logger_finder == nullptr)
    fail("the library exports no getCreators/setLoggerFinder (built without -DTensorRT_INCLUDE_DIR?)");
  static LoggerFinder finder;
  set_logger_finder(&finder);

  int32_t nb_creators = 0;
  nv::IPluginCreatorInterface* const* creators = get_creators(nb_creators);
  nv::IPluginCreatorV3One* creator = nullptr;
  for (int32_t i = 0; i < nb_creators; ++i) {
    if (std::strcmp(creators[i]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") != 0) continue;
    auto* c = static_cast<nv::IPluginCreatorV3One*>(creators[i]);
    std::printf("creator %s %s '%s'\n", c->getPluginName(), c->getPluginVersion(), c->getPluginNamespace());
    if (spec.plugin == c->getPluginName() && spec.version == c->getPluginVersion() && *c->getPluginNamespace() == 0)
      creator = c;
  }
  if (creator == nullptr) fail("no creator " + spec.plugin + " version " + spec.version);
  const nv::PluginFieldCollection* names = creator->getFieldNames();
  for (int32_t i = 0; names != nullptr && i < names->nbFields; ++i)
    std::printf("creator_field %s\n", names->fields[i].name);

  // Build phase: from the node's attributes.
  std::vector<nv::PluginField> fields = to_plugin_fields(spec.fields);
  const nv::PluginFieldCollection fc{static_cast<int32_t>(fields.size()), fields.data()};
  std::unique_ptr<nv::IPluginV3> built(creator->createPlugin("node", &fc, nv::TensorRTPhase::kBUILD));
  if (!built) {
    std::printf("create failed\n");
    return 2;
  }
  const Capabilities b = capabilities(built.get(), true);
  std::printf("plugin %s %s '%s'\n", b.core->getPluginName(), b.core->getPluginVersion(), b.core->getPluginNamespace());
  std::vector<size_t> workspaces;
  for (const Case& c : spec.cases) workspaces.push_back(build_phase(b.build, c));

  // Serialize and recreate for the runtime phase, as an engine file would.
  const std::vector<std::string> serialized = describe(b.runtime->getFieldsToSerialize());
  for (const std::string& line : serialized) std::printf("serialized %s\n", line.c_str());
  std::unique_ptr<nv::IPluginV3> loaded(
      creator->createPlugin("node", b.runtime->getFieldsToSerialize(), nv::TensorRTPhase::kRUNTIME));
  if (!loaded) fail("createPlugin from the serialized fields failed");
  const Capabilities l = capabilities(loaded.get(), false);
  std::printf("roundtrip %d\n", describe(l.runtime->getFieldsToSerialize()) == serialized ? 1 : 0);
  std::unique_ptr<nv::IPluginV3> context_copy(l.runtime->attachToContext(nullptr));
  if (!context_copy) fail("attachToContext returned null");
  const Capabilities r = capabilities(context_copy.get(), false);

  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  for (size_t i = 0; i < spec.cases.size(); ++i) {
    const Case& c = spec.cases[i];
    if (c.output_file.empty()) continue;
    if (!gpu) {
      std::printf("enqueue skipped: no CUDA device\n");
      break;
    }
    std::printf("case %s\n", c.label.c_str());
    enqueue_case(r.runtime, b.build, c, workspaces[i]);
  }
  std::fflush(stdout);
  return 0;
}
