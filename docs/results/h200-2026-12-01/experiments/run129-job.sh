#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
export FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
sha256sum $FDPP_PLUGIN_LIB
for r in 1 2 3; do
timeout 150 python3 scripts/bench_gemm.py --out $OUT/gemm$r --force --profile engines/profiles/h200.json > $OUT/gemm$r.log 2>&1
grep -A16 "== bars" $OUT/gemm$r.log
done
tar czf $OUT/s18c.tgz -C $OUT gemm1 gemm2 gemm3 gemm1.log gemm2.log gemm3.log && rm -rf $OUT/gemm1 $OUT/gemm2 $OUT/gemm3
