# The AMD build (-DFDPP_HIP=ON): libfdpp_plugins_hip.so from the portable kernels (plugins/kernels/portable/) and the
# host code they need, compiled by hipcc for the AMD targets that hipcc here can build; with
# -DMIGraphX_INCLUDE_DIR=<folder holding migraphx/migraphx.hpp> also libfdpp_migraphx.so, the MIGraphX custom ops
# (plugins/migraphx/). hipcc drives clang itself, so these are custom commands, not a CMake language.
#
#   cmake -S . -B build -DFDPP_HIP=ON [-DFDPP_HIP_ARCHS="gfx90a;gfx908"] [-DMIGraphX_INCLUDE_DIR=...]
#
# Each requested target is probed first (a one-kernel compile of the portability header); the ones that fail are
# listed and skipped, and the configure step stops only when none builds. HIP_PLATFORM=amd is always set: hipcc
# picks the NVIDIA platform by itself wherever it finds nvcc.

option(FDPP_HIP "also build libfdpp_plugins_hip.so for AMD GPUs with hipcc (the portable kernels)" OFF)
# gfx90a: MI210/MI250; gfx908: MI100; gfx942: MI300 (needs a newer hipcc than Debian 12's 5.2); gfx1100 (RDNA3) runs
# 32-lane wavefronts, which the portable kernels are not built for.
set(FDPP_HIP_ARCHS "gfx90a;gfx908;gfx942;gfx1100" CACHE STRING "AMD GPU targets to try (built: those hipcc accepts)")
set(MIGraphX_INCLUDE_DIR "" CACHE PATH "MIGraphX's include folder (migraphx/migraphx.hpp); when given, libfdpp_migraphx.so")

if(NOT FDPP_HIP)
  return()
endif()

find_program(FDPP_HIPCC hipcc)
if(NOT FDPP_HIPCC)
  message(FATAL_ERROR "FDPP_HIP=ON needs hipcc; install it (Debian/Ubuntu: apt-get install hipcc libamdhip64-dev)")
endif()
set(_hip_env ${CMAKE_COMMAND} -E env HIP_PLATFORM=amd)
set(_hip_dir ${CMAKE_BINARY_DIR}/hip)
file(MAKE_DIRECTORY ${_hip_dir})

# --- which targets build ----------------------------------------------------------------------------------------
file(WRITE ${_hip_dir}/probe.cu
     "#include \"kernels/portable/fdpp_portable.h\"\n"
     "__global__ void probe(float* x) { x[threadIdx.x] = fdpp::port::shfl_xor(x[threadIdx.x], 1); }\n")
set(FDPP_HIP_BUILT_ARCHS "")
set(_hip_skipped "")
foreach(_arch IN LISTS FDPP_HIP_ARCHS)
  execute_process(
    COMMAND ${_hip_env} ${FDPP_HIPCC} -x hip --offload-arch=${_arch} -I${PROJECT_SOURCE_DIR}/plugins -c
            ${_hip_dir}/probe.cu -o ${_hip_dir}/probe_${_arch}.o
    RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err)
  if(_rc EQUAL 0)
    list(APPEND FDPP_HIP_BUILT_ARCHS ${_arch})
  else()
    string(REGEX MATCH "error: [^\n]*" _why "${_err}")
    string(REPLACE ";" "," _why "${_why}")  # a list separator would split the message
    list(APPEND _hip_skipped "${_arch} (${_why})")
  endif()
endforeach()
foreach(_skip IN LISTS _hip_skipped)
  message(STATUS "fdpp: HIP target skipped: ${_skip}")
endforeach()
if(NOT FDPP_HIP_BUILT_ARCHS)
  message(FATAL_ERROR "FDPP_HIP=ON: hipcc builds none of FDPP_HIP_ARCHS (${FDPP_HIP_ARCHS}); see the reasons above")
endif()
message(STATUS "fdpp: HIP targets built: ${FDPP_HIP_BUILT_ARCHS}")

# --- the objects --------------------------------------------------------------------------------------------------
set(_hip_flags -std=c++17 -O3 -fPIC -fvisibility=hidden -Wall -Wextra -Werror -DNDEBUG)
foreach(_arch IN LISTS FDPP_HIP_BUILT_ARCHS)
  list(APPEND _hip_flags --offload-arch=${_arch})
endforeach()
# The shim maps the two CUDA runtime types the shared parameter headers name (see its comment).
set(_hip_includes -I${PROJECT_SOURCE_DIR}/plugins -I${PROJECT_SOURCE_DIR}/plugins/kernels/portable/hip_shim
                  -I${CMAKE_BINARY_DIR}/generated)
file(GLOB _hip_kernel_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/plugins/kernels/portable/*.cu)
set(_hip_host_sources ${PROJECT_SOURCE_DIR}/plugins/kernels/attention/attention_check.cpp
                      ${PROJECT_SOURCE_DIR}/plugins/capi/capi_common.cpp
                      ${PROJECT_SOURCE_DIR}/plugins/capi/portable_capi.cpp)
file(GLOB_RECURSE _hip_headers CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/plugins/*.h ${PROJECT_SOURCE_DIR}/plugins/*.cuh)
list(APPEND _hip_headers ${CMAKE_BINARY_DIR}/generated/fdpp_contract_constants.h)

# fdpp_hip_objects(<out list> <extra flags> <sources>...): one hipcc compile per source (parallel under -j).
function(fdpp_hip_objects out extra)
  set(objects "")
  foreach(src IN LISTS ARGN)
    file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${src})
    string(REPLACE "/" "_" obj ${rel})
    set(obj ${_hip_dir}/${obj}.o)
    add_custom_command(
      OUTPUT ${obj}
      COMMAND ${_hip_env} ${FDPP_HIPCC} -x hip ${_hip_flags} ${extra} ${_hip_includes} -c ${src} -o ${obj}
      DEPENDS ${src} ${_hip_headers}
      COMMENT "hipcc ${rel} (${FDPP_HIP_BUILT_ARCHS})"
      VERBATIM)
    list(APPEND objects ${obj})
  endforeach()
  set(${out} ${objects} PARENT_SCOPE)
endfunction()

fdpp_hip_objects(_hip_objects "" ${_hip_kernel_sources} ${_hip_host_sources})
set(_hip_link ${_hip_env} ${FDPP_HIPCC} ${_hip_flags} -shared -Wl,--version-script=${PROJECT_SOURCE_DIR}/plugins/exports.map)
set(FDPP_HIP_LIBRARY ${CMAKE_BINARY_DIR}/libfdpp_plugins_hip.so)
add_custom_command(
  OUTPUT ${FDPP_HIP_LIBRARY}
  COMMAND ${_hip_link} ${_hip_objects} -o ${FDPP_HIP_LIBRARY}
  DEPENDS ${_hip_objects} ${PROJECT_SOURCE_DIR}/plugins/exports.map
  COMMENT "hipcc: linking libfdpp_plugins_hip.so for ${FDPP_HIP_BUILT_ARCHS}"
  VERBATIM)
add_custom_target(fdpp_plugins_hip ALL DEPENDS ${FDPP_HIP_LIBRARY})

# --- the MIGraphX adapter -----------------------------------------------------------------------------------------
if(MIGraphX_INCLUDE_DIR)
  if(NOT EXISTS "${MIGraphX_INCLUDE_DIR}/migraphx/migraphx.hpp")
    message(FATAL_ERROR "MIGraphX_INCLUDE_DIR=${MIGraphX_INCLUDE_DIR} has no migraphx/migraphx.hpp; point it at "
                        "MIGraphX's include folder (/opt/rocm/include, or src/api/include of its sources)")
  endif()
  set(_mgx_includes -isystem ${MIGraphX_INCLUDE_DIR})
  # An installed MIGraphX has the generated migraphx/api/export.h; its source tree does not: stand in for it (the C
  # API's symbols come from libmigraphx_c.so at load time either way).
  if(NOT EXISTS "${MIGraphX_INCLUDE_DIR}/migraphx/api/export.h")
    file(WRITE ${_hip_dir}/migraphx_export/migraphx/api/export.h
         "// Written by cmake/fdpp_hip.cmake: the source tree's MIGraphX headers lack this generated file.\n"
         "#pragma once\n#define MIGRAPHX_C_EXPORT\n")
    list(APPEND _mgx_includes -isystem ${_hip_dir}/migraphx_export)
  endif()
  fdpp_hip_objects(_mgx_objects "${_mgx_includes}" ${PROJECT_SOURCE_DIR}/plugins/migraphx/fdpp_migraphx.cpp)
  find_library(MIGraphX_C_LIBRARY migraphx_c HINTS ${MIGraphX_INCLUDE_DIR}/../lib /opt/rocm/lib)
  set(_mgx_lib_flag "")
  if(MIGraphX_C_LIBRARY)
    set(_mgx_lib_flag ${MIGraphX_C_LIBRARY})
  else()
    message(STATUS "fdpp: libmigraphx_c.so not found; libfdpp_migraphx.so resolves MIGraphX's C API when loaded")
  endif()
  set(FDPP_MIGRAPHX_LIBRARY ${CMAKE_BINARY_DIR}/libfdpp_migraphx.so)
  add_custom_command(
    OUTPUT ${FDPP_MIGRAPHX_LIBRARY}
    COMMAND ${_hip_link} ${_mgx_objects} ${_hip_objects} ${_mgx_lib_flag} -o ${FDPP_MIGRAPHX_LIBRARY}
    DEPENDS ${_mgx_objects} ${_hip_objects} ${PROJECT_SOURCE_DIR}/plugins/exports.map
    COMMENT "hipcc: linking libfdpp_migraphx.so (the MIGraphX custom ops)"
    VERBATIM)
  add_custom_target(fdpp_migraphx ALL DEPENDS ${FDPP_MIGRAPHX_LIBRARY})
  message(STATUS "fdpp: building the MIGraphX adapter against ${MIGraphX_INCLUDE_DIR}")
endif()
