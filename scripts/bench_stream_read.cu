// How fast can a chain of weight-streaming kernels read HBM, depending on how each kernel issues its loads?
// The question behind ImplB's TMA pipeline (plugins/kernels/gemm/gemm_implb_bulk.cu; results in docs/notes-gemm.md).
//
// Each kernel reads one weight-sized buffer into shared memory through a ring of stages and touches every byte
// once (no math). 60 launches over rotating buffers (together > 3x L2) run back to back in one CUDA graph,
// with and without programmatic dependent launch (each kernel triggers its successor at the top and copies
// its first stages before griddepcontrol.wait, as the GEMMs do). Loaders:
//   cp.async  2 CTAs per SM of 128 threads, 16 bytes per thread and copy
//   bulk      one CTA per SM; stage = `pieces` 1-D cp.async.bulk copies of contiguous memory
//   tma       one CTA per SM; stage = one 3-D tensor copy of 16 weight rows x 1024 columns
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o /tmp/bench_stream_read scripts/bench_stream_read.cu && /tmp/bench_stream_read
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));           \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kStage = 32768;  // bytes per stage (16 rows x 1024 fp16 columns for the TMA loader)
constexpr int kStages = 3;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* b) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(b)));
}
__device__ __forceinline__ void mbar_expect(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  asm volatile("{\n .reg .pred p;\n again: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra again;\n}"
               ::"r"(smem_u32(b)), "r"(parity) : "memory");
}

// Touch every 16 bytes of a stage so the copy cannot be skipped; the sum is never true in practice.
__device__ __forceinline__ float consume(const unsigned char* stage) {
  float acc = 0.f;
  for (int j = threadIdx.x; j < kStage / 16; j += blockDim.x) {
    const uint4 v = reinterpret_cast<const uint4*>(stage)[j];
    acc += __int_as_float(v.x ^ v.w);
  }
  return acc;
}

struct Args {
  const unsigned char* w;
  long long units;  // stages' worth of bytes in the buffer
  int pieces;       // bulk loader: copies per stage
  int k;            // tma loader: weight columns (rows = units * kStage / (2 k))
  float* sink;
};

// CTA b streams units [b * per, (b + 1) * per).
__device__ __forceinline__ void my_units(const Args& a, long long* first, int* count) {
  const long long per = (a.units + gridDim.x - 1) / gridDim.x;
  *first = blockIdx.x * per;
  const long long end = a.units < *first + per ? a.units : *first + per;
  *count = end > *first ? int(end - *first) : 0;
}

__global__ void __launch_bounds__(128) load_cp_async(const __grid_constant__ CUtensorMap, Args a) {
  extern __shared__ __align__(1024) unsigned char ring[];
  long long first;
  int n;
  my_units(a, &first, &n);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  auto issue = [&](int i) {
    for (int j = threadIdx.x; j < kStage / 16; j += blockDim.x)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(ring + (i % kStages) * kStage + 16 * j)),
                   "l"(a.w + (first + i) * kStage + 16 * j));
    asm volatile("cp.async.commit_group;");
  };
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n)
      issue(i);
    else
      asm volatile("cp.async.commit_group;");
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float acc = 0.f;
  for (int i = 0; i < n; ++i) {
    if (i + kStages - 1 < n)
      issue(i + kStages - 1);
    else
      asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 1));
    __syncthreads();
    acc += consume(ring + (i % kStages) * kStage);
    __syncthreads();
  }
  if (acc == 1.2345f) a.sink[blockIdx.x] = acc;
}

template <bool kTensor>
__global__ void __launch_bounds__(128) load_copy_engine(const __grid_constant__ CUtensorMap map, Args a) {
  extern __shared__ __align__(1024) unsigned char raw[];
  unsigned char* ring = raw + ((1024 - (smem_u32(raw) & 1023)) & 1023);  // the 128-byte swizzle wants 1 KB
  __shared__ __align__(8) uint64_t full[kStages];
  long long first;
  int n;
  my_units(a, &first, &n);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) mbar_init(&full[s]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  auto issue = [&](int i) {  // warp 0
    const int s = i % kStages;
    const long long u = first + i;
    if (threadIdx.x == 0) mbar_expect(&full[s], kStage);
    __syncwarp();
    if (kTensor) {
      const int steps = a.k / 1024;  // units per 16-row block
      if (threadIdx.x == 0)
        asm volatile(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {0, %2, %3}], [%4];"
            ::"r"(smem_u32(ring + s * kStage)), "l"(&map), "r"(int(u % steps) * 16), "r"(int(u / steps) * 16),
            "r"(smem_u32(&full[s]))
            : "memory");
    } else if (threadIdx.x < a.pieces) {
      const uint32_t piece = kStage / a.pieces;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   ::"r"(smem_u32(ring + s * kStage + threadIdx.x * piece)),
                   "l"(a.w + u * kStage + threadIdx.x * piece), "r"(piece), "r"(smem_u32(&full[s]))
                   : "memory");
    }
  };
  if (threadIdx.x < 32)
    for (int i = 0; i < kStages && i < n; ++i) issue(i);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  float acc = 0.f;
  for (int i = 0; i < n; ++i) {
    mbar_wait(&full[i % kStages], (i / kStages) & 1);
    acc += consume(ring + (i % kStages) * kStage);
    __syncthreads();
    if (threadIdx.x < 32 && i + kStages < n) issue(i + kStages);
  }
  if (acc == 1.2345f) a.sink[blockIdx.x] = acc;
}

using Kernel = void (*)(const CUtensorMap, Args);

// [rows][k / 64][64] fp16 with boxes of 16 rows x 16 chunks (one stage), 128-byte swizzle: ImplB's TMA layout.
CUtensorMap weight_map(const void* w, int rows, int k) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
  CUtensorMap map;
  const cuuint64_t dims[3] = {64, cuuint64_t(k / 64), cuuint64_t(rows)};
  const cuuint64_t strides[2] = {128, cuuint64_t(k) * 2};
  const cuuint32_t box[3] = {64, 16, 16}, steps[3] = {1, 1, 1};
  const CUresult r = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)(
      &map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<void*>(w), dims, strides, box, steps,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::printf("cuTensorMapEncodeTiled failed (%d)\n", int(r)), std::exit(1);
  return map;
}

// Microseconds per kernel: median of 10 replays of a graph of 60 launches over the buffers.
float time_chain(Kernel kernel, int grid, int smem, bool pdl, const std::vector<unsigned char*>& bufs, int rows,
                 int k, int pieces, float* sink, cudaStream_t stream) {
  CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const int launches = 60;
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < launches; ++i) {
    const unsigned char* w = bufs[i % bufs.size()];
    const Args args{w, 2LL * rows * k / kStage, pieces, k, sink};
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, kernel, weight_map(w, rows, k), args));
  }
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> us;
  for (int r = 0; r < 12; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r >= 2) us.push_back(ms * 1000.f / launches);  // the first two warm up
  }
  std::sort(us.begin(), us.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return us[us.size() / 2];
}

int main() {
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int sms, l2;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  float* sink;
  CHECK(cudaMalloc(&sink, 1 << 20));
  struct Shape { const char* name; int rows, k; };
  const Shape shapes[] = {{"o", 4096, 4096}, {"qkv", 12288, 4096}, {"down", 4096, 11264}, {"gate_up", 22016, 4096}};
  struct Loader { const char* name; Kernel kernel; int ctas_per_sm, pieces, smem; };
  const int ring = kStages * kStage;
  const Loader loaders[] = {
      {"cp.async, 2 CTAs/SM", load_cp_async, 2, 0, ring},
      {"bulk, 1 x 32 KB", load_copy_engine<false>, 1, 1, ring + 1024},
      {"bulk, 8 x 4 KB", load_copy_engine<false>, 1, 8, ring + 1024},
      {"bulk, 32 x 1 KB", load_copy_engine<false>, 1, 32, ring + 1024},
      {"tma, 16 rows x 2 KB", load_copy_engine<true>, 1, 0, ring + 1024},
  };
  std::printf("%-8s %-22s %21s %21s\n", "shape", "loader", "PDL us (TB/s)", "no PDL us (TB/s)");
  for (const Shape& s : shapes) {  // down uses K = 11264 (a whole number of 1024-column units)
    const size_t bytes = size_t(s.rows) * s.k * 2;
    const size_t copies = std::max<size_t>(2, std::min<size_t>(60, 3 * size_t(l2) / bytes + 1));
    std::vector<unsigned char*> bufs(copies);
    for (auto& b : bufs) {
      CHECK(cudaMalloc(&b, bytes));
      CHECK(cudaMemset(b, 1, bytes));
    }
    for (const Loader& l : loaders) {
      const int grid = l.ctas_per_sm * sms;
      const float on = time_chain(l.kernel, grid, l.smem, true, bufs, s.rows, s.k, l.pieces, sink, stream);
      const float off = time_chain(l.kernel, grid, l.smem, false, bufs, s.rows, s.k, l.pieces, sink, stream);
      std::printf("%-8s %-22s %10.2f (%5.2f) %14.2f (%5.2f)\n", s.name, l.name, on, bytes / on / 1e6, off,
                  bytes / off / 1e6);
    }
    for (auto& b : bufs) CHECK(cudaFree(b));
  }
  return 0;
}
