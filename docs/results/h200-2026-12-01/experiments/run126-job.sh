#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
timeout 150 python3 scripts/bench_gemm.py --out $OUT/gemm3 --force --profile engines/profiles/h200.json > $OUT/gemm3.log 2>&1
grep -A16 "== bars" $OUT/gemm3.log
