#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
export FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
timeout 200 python3 -m fdpp_rewrite profile smollm2-135m llama2-7b --quick --out $OUT/p/h200.json --plots $OUT/p/plots 2>&1 | grep -v "it/s\|M/s" | tail -12
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "graph" 2>&1 | tail -1
cp $OUT/p/h200.json $OUT/profile-check.json; rm -rf $OUT/p
