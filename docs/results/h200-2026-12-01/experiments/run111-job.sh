#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
OUT=$OUT bash scripts/device_job.sh gemm_tests gemm_sanitize > $OUT/job.log 2>&1
grep -E "^=== |passed|failed|FAILED" $OUT/job.log | tail -8
