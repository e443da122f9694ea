// The C ABI of libfdpp_plugins.so: what the Python side (ctypes) and other hosts call.
//
// Conventions every fdpp_* function keeps:
//  - returns fdpp_status; FDPP_OK is 0. On failure, fdpp_last_error() returns a one-line message for this thread.
//  - never throws, never synchronizes, allocates or copies from host memory inside a launch: launches are
//    CUDA-graph capturable. Workspace, where needed, is sized by a *_workspace_bytes() query and passed in.
//  - pointers are device pointers unless the name says host_; strides are in elements.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FDPP_API __attribute__((visibility("default")))

typedef enum fdpp_status {
  FDPP_OK = 0,
  FDPP_ERR_INVALID_ARGUMENT = 1,  // a shape, pointer alignment or attribute the caller can fix
  FDPP_ERR_UNSUPPORTED = 2,       // a valid request this build does not implement (dtype, head_dim, arch)
  FDPP_ERR_CUDA = 3,              // a CUDA runtime error (the message carries cudaGetErrorString)
  FDPP_ERR_INTERNAL = 4           // a bug: please report
} fdpp_status;

// Element types, shared by every op.
typedef enum fdpp_dtype { FDPP_FLOAT16 = 0, FDPP_BFLOAT16 = 1, FDPP_FLOAT32 = 2 } fdpp_dtype;

// Programmatic dependent launch of a kernel after the one before it on the stream (the ops' args carry it):
// AUTO where the GPU runs the library's sm_90a code (compute capability 9.x), the default; OFF never (a timing
// baseline, or a producer that writes an input the kernel reads before its wait, see the op's header).
typedef enum fdpp_pdl { FDPP_PDL_AUTO = 0, FDPP_PDL_OFF = 1 } fdpp_pdl;

FDPP_API int fdpp_abi_version(void);         // bumped on any change to a signature or struct in this folder
FDPP_API const char* fdpp_last_error(void);  // message of the last failure on the calling thread ("" if none)

#ifdef __cplusplus
}  // extern "C"
#endif
