#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
export FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
sha256sum $FDPP_PLUGIN_LIB
OUT=$OUT bash scripts/device_job.sh gemm_tests gemm_sanitize profile gemm_bench > $OUT/job.log 2>&1
grep -E "^=== |passed|failed|FAILED|ERROR SUMMARY" $OUT/job.log | tail -16
mkdir -p $OUT/r && tar xzf $OUT/results.tgz -C $OUT/r
grep -E "^ +\[[0-9]+, [0-9]+\]" $OUT/r/results/profile.log
grep -A16 "== bars" $OUT/r/results/gemm_bench.log
timeout 110 python3 scripts/bench_gemm.py --out $OUT/gemm2 --force --profile $OUT/r/results/profiles/h200.json > $OUT/gemm2.log 2>&1
grep -A16 "== bars" $OUT/gemm2.log
tar czf $OUT/s18b.tgz -C $OUT gemm2 gemm2.log job.log && rm -rf $OUT/gemm2 $OUT/r
