// ImplC through cuBLASLt, opened with dlopen at run time so that the library builds (and CI runs) where cuBLAS
// is not installed. We declare the handful of prototypes and enum values we use ourselves (cublasLt.h, CUDA 12/13).
//
// Y[M, N] row-major is Y^T [N, M] column-major: D = op(A) B with A = W viewed column-major [K, N] (ld K,
// transposed), B = X^T column-major [K, M] (ld K), D = Y^T [N, M] (ld N) -- the "TN" layout every cuBLASLt
// kernel supports. Bias uses CUBLASLT_EPILOGUE_BIAS (one value per row of D = per output feature); residual is
// C with beta = 1. silu_mul computes D (+ bias) into the workspace and finishes with launch_gemm_epilogue.
//
// A matmul plan (descriptors + the heuristic's first algorithm) is built once per problem signature on the
// host and cached; building one never touches the stream, so calls are CUDA-graph capturable (the first call
// for a new M does the host-side heuristic query; fdpp_gemm_prepare can do it ahead of capture).
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernels/gemm/gemm.h"

namespace fdpp {
namespace gemm {
namespace {

// ---- the subset of cublasLt.h we use -------------------------------------------------------------------------
using lt_status = int;  // cublasStatus_t, 0 = success
using lt_handle = void*;
using lt_desc = void*;
using lt_layout = void*;
using lt_pref = void*;
struct lt_algo {
  uint64_t data[8];
};
struct lt_heuristic {
  lt_algo algo;
  size_t workspaceSize;
  lt_status state;
  float wavesCount;
  int reserved[4];
};

constexpr int kComputeF32 = 68;           // CUBLAS_COMPUTE_32F
constexpr int kCudaR32F = 0;              // CUDA_R_32F
constexpr int kCudaR16F = 2;              // CUDA_R_16F
constexpr int kCudaR16BF = 14;            // CUDA_R_16BF
constexpr int kOpN = 0;                   // CUBLAS_OP_N
constexpr int kOpT = 1;                   // CUBLAS_OP_T
constexpr int kDescTransA = 3;            // CUBLASLT_MATMUL_DESC_TRANSA
constexpr int kDescTransB = 4;            // CUBLASLT_MATMUL_DESC_TRANSB
constexpr int kDescEpilogue = 7;          // CUBLASLT_MATMUL_DESC_EPILOGUE
constexpr int kDescBiasPointer = 8;       // CUBLASLT_MATMUL_DESC_BIAS_POINTER
constexpr uint32_t kEpilogueDefault = 1;  // CUBLASLT_EPILOGUE_DEFAULT
constexpr uint32_t kEpilogueBias = 4;     // CUBLASLT_EPILOGUE_BIAS
constexpr int kPrefMaxWorkspace = 1;      // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES (uint64_t)
constexpr int kPrefAlignA = 5;            // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES (uint32_t)
constexpr int kPrefAlignB = 6;
constexpr int kPrefAlignC = 7;
constexpr int kPrefAlignD = 8;

// cuBLASLt's own scratch; Hopper kernels ask for up to 32 MiB on large problems, these sizes need far less.
constexpr size_t kLtWorkspace = kImplCScratchOffset;

struct LtApi {
  lt_status (*create)(lt_handle*) = nullptr;
  lt_status (*desc_create)(lt_desc*, int, int) = nullptr;
  lt_status (*desc_destroy)(lt_desc) = nullptr;
  lt_status (*desc_set)(lt_desc, int, const void*, size_t) = nullptr;
  lt_status (*layout_create)(lt_layout*, int, uint64_t, uint64_t, int64_t) = nullptr;
  lt_status (*layout_destroy)(lt_layout) = nullptr;
  lt_status (*pref_create)(lt_pref*) = nullptr;
  lt_status (*pref_destroy)(lt_pref) = nullptr;
  lt_status (*pref_set)(lt_pref, int, const void*, size_t) = nullptr;
  lt_status (*heuristic)(lt_handle, lt_desc, lt_layout, lt_layout, lt_layout, lt_layout, lt_pref, int, lt_heuristic*,
                         int*) = nullptr;
  lt_status (*matmul)(lt_handle, lt_desc, const void*, const void*, lt_layout, const void*, lt_layout, const void*,
                      const void*, lt_layout, void*, lt_layout, const lt_algo*, void*, size_t, cudaStream_t) = nullptr;
  std::string error;  // why it could not be loaded, or ""
};

template <typename F>
bool bind(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) error = std::string("libcublasLt has no symbol ") + name;
  return fn != nullptr;
}

// Opens libcublasLt: `path` when the caller gives one (fdpp_gemm_load_cublaslt), else the dynamic linker's search
// by soname. The library reads no environment: the Python binding passes $FDPP_CUBLASLT_LIBRARY as the path.
LtApi load_api(const char* path) {
  LtApi api;
  void* lib = nullptr;
  std::string tried;
  const char* searched[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
  const char* const* names = searched;
  int count = 3;
  if (path != nullptr && *path != '\0') names = &path, count = 1;
  for (int i = 0; i < count; ++i) {
    const char* name = names[i];
    if (name == nullptr || *name == '\0') continue;
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    tried += std::string(tried.empty() ? "" : ", ") + name;
  }
  if (lib == nullptr) {
    api.error = "libcublasLt could not be loaded (tried " + tried +
                "); pass its path to fdpp_gemm_load_cublaslt (from Python: set FDPP_CUBLASLT_LIBRARY; pip "
                "package nvidia-cublas: nvidia/cublas/lib/)";
    return api;
  }
  std::string& e = api.error;
  bool ok = bind(lib, "cublasLtCreate", api.create, e) && bind(lib, "cublasLtMatmulDescCreate", api.desc_create, e) &&
            bind(lib, "cublasLtMatmulDescDestroy", api.desc_destroy, e) &&
            bind(lib, "cublasLtMatmulDescSetAttribute", api.desc_set, e) &&
            bind(lib, "cublasLtMatrixLayoutCreate", api.layout_create, e) &&
            bind(lib, "cublasLtMatrixLayoutDestroy", api.layout_destroy, e) &&
            bind(lib, "cublasLtMatmulPreferenceCreate", api.pref_create, e) &&
            bind(lib, "cublasLtMatmulPreferenceDestroy", api.pref_destroy, e) &&
            bind(lib, "cublasLtMatmulPreferenceSetAttribute", api.pref_set, e) &&
            bind(lib, "cublasLtMatmulAlgoGetHeuristic", api.heuristic, e) && bind(lib, "cublasLtMatmul", api.matmul, e);
  if (!ok) api.create = nullptr;
  return api;
}

// The loaded API, once one load succeeded (never freed: plans may be used until process exit). A failed load is
// kept too, so that the launch path does not retry dlopen on every call; load_cublaslt() may replace it.
std::mutex g_api_mu;
std::atomic<const LtApi*> g_api{nullptr};

const LtApi& api() {
  if (const LtApi* loaded = g_api.load(std::memory_order_acquire)) return *loaded;
  std::lock_guard<std::mutex> lock(g_api_mu);
  if (g_api.load(std::memory_order_relaxed) == nullptr) g_api.store(new LtApi(load_api(nullptr)));
  return *g_api.load(std::memory_order_relaxed);
}

// Everything a plan depends on.
using PlanKey = std::tuple<int, int, int64_t, int64_t, int64_t, bool, bool, uint32_t, uint32_t, uint32_t, uint32_t>;

struct LtPlan {
  lt_desc desc = nullptr;
  lt_layout a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  lt_algo algo{};
  size_t workspace = 0;
};

struct LtState {
  std::mutex mu;
  std::map<int, lt_handle> handles;  // per device
  std::map<PlanKey, LtPlan> plans;
};

LtState& state() {
  static LtState* s = new LtState();  // never destroyed: plans may be used until process exit
  return *s;
}

uint32_t alignment_of(const void* p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 2 && (v % a) != 0) a >>= 1;
  return a;
}

std::string status_text(const char* what, lt_status s) {
  return std::string("cuBLASLt ") + what + " failed with cublasStatus " + std::to_string(s);
}

// Builds (or finds) the plan; returns nullptr and sets the detail message on failure. Caller holds state().mu.
const LtPlan* get_plan_locked(const Problem& p, int device, void* d_ptr, bool bias_epilogue, const void* c_ptr) {
  const LtApi& lt = api();
  const uint32_t align_a = alignment_of(p.w), align_b = alignment_of(p.x);
  const uint32_t align_c = alignment_of(c_ptr ? c_ptr : d_ptr), align_d = alignment_of(d_ptr);
  const PlanKey key = std::make_tuple(device, int(p.dtype), p.m, p.n, p.k, bias_epilogue, c_ptr != nullptr, align_a,
                                      align_b, align_c, align_d);
  LtState& st = state();
  auto found = st.plans.find(key);
  if (found != st.plans.end()) return &found->second;

  lt_handle& handle = st.handles[device];
  if (handle == nullptr) {
    lt_status s = lt.create(&handle);
    if (s != 0) {
      handle = nullptr;
      set_detail(status_text("create", s).c_str());
      return nullptr;
    }
  }
  const int type = p.dtype == Dtype::kBFloat16 ? kCudaR16BF : kCudaR16F;
  LtPlan plan;
  lt_pref pref = nullptr;
  auto fail = [&](const char* what, lt_status s) -> const LtPlan* {
    if (plan.desc) lt.desc_destroy(plan.desc);
    for (lt_layout l : {plan.a, plan.b, plan.c, plan.d})
      if (l) lt.layout_destroy(l);
    if (pref) lt.pref_destroy(pref);
    set_detail(status_text(what, s).c_str());
    return nullptr;
  };
  lt_status s = lt.desc_create(&plan.desc, kComputeF32, kCudaR32F);
  if (s != 0) return fail("matmul descriptor", s);
  const int trans_a = kOpT, trans_b = kOpN;
  const uint32_t epilogue = bias_epilogue ? kEpilogueBias : kEpilogueDefault;
  if ((s = lt.desc_set(plan.desc, kDescTransA, &trans_a, sizeof(trans_a))) != 0) return fail("transa", s);
  if ((s = lt.desc_set(plan.desc, kDescTransB, &trans_b, sizeof(trans_b))) != 0) return fail("transb", s);
  if ((s = lt.desc_set(plan.desc, kDescEpilogue, &epilogue, sizeof(epilogue))) != 0) return fail("epilogue", s);
  if ((s = lt.layout_create(&plan.a, type, uint64_t(p.k), uint64_t(p.n), p.k)) != 0) return fail("layout A", s);
  if ((s = lt.layout_create(&plan.b, type, uint64_t(p.k), uint64_t(p.m), p.k)) != 0) return fail("layout B", s);
  if ((s = lt.layout_create(&plan.c, type, uint64_t(p.n), uint64_t(p.m), p.n)) != 0) return fail("layout C", s);
  if ((s = lt.layout_create(&plan.d, type, uint64_t(p.n), uint64_t(p.m), p.n)) != 0) return fail("layout D", s);
  if ((s = lt.pref_create(&pref)) != 0) return fail("preference", s);
  const uint64_t ws = kLtWorkspace;
  if ((s = lt.pref_set(pref, kPrefMaxWorkspace, &ws, sizeof(ws))) != 0) return fail("workspace preference", s);
  lt.pref_set(pref, kPrefAlignA, &align_a, sizeof(align_a));
  lt.pref_set(pref, kPrefAlignB, &align_b, sizeof(align_b));
  lt.pref_set(pref, kPrefAlignC, &align_c, sizeof(align_c));
  lt.pref_set(pref, kPrefAlignD, &align_d, sizeof(align_d));
  lt_heuristic result{};
  int returned = 0;
  s = lt.heuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.d, pref, 1, &result, &returned);
  if (s != 0 || returned == 0) return fail("heuristic (no algorithm for this problem)", s);
  lt.pref_destroy(pref);
  pref = nullptr;
  plan.algo = result.algo;
  plan.workspace = result.workspaceSize;
  return &st.plans.emplace(key, plan).first->second;
}

}  // namespace

bool cublaslt_available() { return api().create != nullptr; }

cudaError_t load_cublaslt(const char* path) {
  std::lock_guard<std::mutex> lock(g_api_mu);
  const LtApi* loaded = g_api.load(std::memory_order_relaxed);
  if (loaded != nullptr && loaded->create != nullptr) return cudaSuccess;  // the first library that loaded stays
  const LtApi* fresh = new LtApi(load_api(path));
  g_api.store(fresh, std::memory_order_release);  // a failed attempt's LtApi is leaked: a few bytes, once
  if (fresh->create != nullptr) return cudaSuccess;
  set_detail(fresh->error.c_str());
  return cudaErrorNotSupported;
}

cudaError_t prepare_implc_cublaslt(const Problem& p) {
  if (api().create == nullptr) {
    set_detail(api().error.c_str());
    return cudaErrorNotSupported;
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const bool silu = p.silu_mul();
  // The silu_mul scratch sits kImplCScratchOffset into a cudaMalloc'ed (256-byte aligned) workspace.
  void* d_ptr = silu ? reinterpret_cast<void*>(uintptr_t(256)) : p.y;
  LtState& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return get_plan_locked(p, device, d_ptr, p.bias != nullptr, silu ? nullptr : p.residual) ? cudaSuccess
                                                                                           : cudaErrorNotSupported;
}

size_t implc_workspace_bytes(int64_t max_m, int64_t n, Epilogue epilogue, Dtype /*dtype*/) {
  size_t bytes = kLtWorkspace;
  if (epilogue == Epilogue::kSiluMul) bytes += size_t(max_m) * size_t(n) * 2 + 256;
  return bytes;
}

cudaError_t launch_implc_cublaslt(const Problem& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const LtApi& lt = api();
  if (lt.create == nullptr) {
    set_detail(lt.error.c_str());
    return cudaErrorNotSupported;
  }
  if (workspace_bytes < implc_workspace_bytes(p.m, p.n, p.epilogue, p.dtype)) {
    set_detail("ImplC (cuBLASLt) workspace is smaller than fdpp_gemm_workspace_bytes asked for");
    return cudaErrorInvalidValue;
  }
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;

  // silu_mul: raw product into the scratch after cuBLASLt's own, then the epilogue pass.
  unsigned char* scratch = static_cast<unsigned char*>(workspace) + kLtWorkspace;
  const bool silu = p.silu_mul();
  void* d_ptr = silu ? static_cast<void*>(scratch) : p.y;
  const void* c_ptr = silu ? nullptr : p.residual;
  const bool bias_epilogue = p.bias != nullptr;
  const float alpha = 1.0f, beta = c_ptr ? 1.0f : 0.0f;
  {
    // One lock around plan lookup, the bias pointer (it lives in the cached descriptor) and the enqueue, so two
    // host threads never race on a descriptor. All of it is host work; the GPU sees one kernel (or two).
    LtState& st = state();
    std::lock_guard<std::mutex> lock(st.mu);
    const LtPlan* plan = get_plan_locked(p, device, d_ptr, bias_epilogue, c_ptr);
    if (plan == nullptr) return cudaErrorNotSupported;
    if (bias_epilogue) {
      lt_status s = lt.desc_set(plan->desc, kDescBiasPointer, &p.bias, sizeof(p.bias));
      if (s != 0) {
        set_detail(status_text("bias pointer", s).c_str());
        return cudaErrorNotSupported;
      }
    }
    lt_status s =
        lt.matmul(st.handles[device], plan->desc, &alpha, p.w, plan->a, p.x, plan->b, &beta, c_ptr ? c_ptr : d_ptr,
                  plan->c, d_ptr, plan->d, &plan->algo, workspace, kLtWorkspace, stream);
    if (s != 0) {
      set_detail(status_text("matmul", s).c_str());
      return cudaErrorUnknown;
    }
  }
  if (silu) return launch_gemm_epilogue(d_ptr, nullptr, p.residual, p.y, p.m, p.n, p.epilogue, p.dtype, p.pdl, stream);
  return cudaSuccess;
}

}  // namespace gemm
}  // namespace fdpp
