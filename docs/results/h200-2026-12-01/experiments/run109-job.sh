#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum .deps/lib/libfdpp_plugins.so .deps/libexp/libfdpp_plugins.so
for lib in lib libexp lib libexp; do
  echo "== $lib"
  FDPP_PAIR_DEBUG=1 FDPP_PLUGIN_LIB=$PWD/.deps/$lib/libfdpp_plugins.so timeout 90 python3 out/exp/bench_exp.py --out $OUT/ab_$lib --shapes o --ms 1,4,8 --reps 15 --variants pair_s2_lx_c2,pair_s2_lx_m1,pair_s2_lx_m2,rows1_s2_lx_c2 2>&1 | grep -E "M=|pair debug" | sort | uniq -c | cut -c1-200
done
echo "== gate_up, lib"
FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so timeout 90 python3 out/exp/bench_exp.py --out $OUT/gu --shapes gate_up --ms 6,7,8 --reps 10 --variants rows_s3_lx_c2,rows_s2_lx_c2 2>&1 | grep "M=" | cut -c1-140
export FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so
OUT=$OUT bash scripts/device_job.sh gemm_tests gemm_sanitize profile gemm_bench > $OUT/job.log 2>&1
grep -E "^=== |passed|failed|FAILED" $OUT/job.log | tail -14
mkdir -p $OUT/r && tar xzf $OUT/results.tgz -C $OUT/r
grep -A16 "== bars" $OUT/r/results/gemm_bench.log
timeout 100 python3 scripts/bench_gemm.py --out $OUT/gemm2 --force --profile $OUT/r/results/profiles/h200.json > $OUT/gemm2.log 2>&1
grep -A16 "== bars" $OUT/gemm2.log
tar czf $OUT/s16c.tgz -C $OUT ab_lib ab_libexp gu gemm2 gemm2.log && rm -rf $OUT/ab_lib $OUT/ab_libexp $OUT/gu $OUT/gemm2 $OUT/r
