#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
export FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
timeout 200 python3 scripts/bench_implb_loaders.py --out $OUT/loaders --shapes o,down --ms 1,8 2>&1 | tail -6
