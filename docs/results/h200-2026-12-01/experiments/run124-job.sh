#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz && tar -C .deps -xJf .deps/carry/libold.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum .deps/lib/libfdpp_plugins.so .deps/libold/libfdpp_plugins.so
for lib in libold lib libold lib; do
  echo "== $lib"
  FDPP_PLUGIN_LIB=$PWD/.deps/$lib/libfdpp_plugins.so timeout 60 python3 out/exp/bench_exp.py --out $OUT/ab_$lib --shapes o,down --ms 1,8 --reps 10 --variants pair_s2_lx_c0,pair_s3_lx_c0 2>&1 | grep "M=" | cut -c1-110
done
export FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
OUT=$OUT bash scripts/device_job.sh gemm_tests gemm_sanitize profile gemm_bench > $OUT/job.log 2>&1
grep -E "^=== |passed|failed|FAILED|ERROR SUMMARY" $OUT/job.log | tail -16
mkdir -p $OUT/r && tar xzf $OUT/results.tgz -C $OUT/r
grep -A16 "== bars" $OUT/r/results/gemm_bench.log
timeout 100 python3 scripts/bench_gemm.py --out $OUT/gemm2 --force --profile $OUT/r/results/profiles/h200.json > $OUT/gemm2.log 2>&1
grep -A16 "== bars" $OUT/gemm2.log
tar czf $OUT/s17i.tgz -C $OUT ab_lib ab_libold gemm2 gemm2.log && rm -rf $OUT/ab_lib $OUT/ab_libold $OUT/gemm2 $OUT/r
