"""GPU-side Python: ctypes bindings of libfdpp_plugins.so's C ABI (plugins/capi/fdpp_capi.h)."""
