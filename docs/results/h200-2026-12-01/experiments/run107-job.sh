#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
echo "== whole-unit pair tests, CAST=2"
FDPP_PAIR_CAST=2 timeout 120 python3 -m pytest -q -x -m gpu tests/gpu/test_gemm.py -k pair_whole_units 2>&1 | tail -3
echo "== o"
timeout 150 python3 out/exp/bench_exp.py --out $OUT/o --shapes o --ms 1,2,4,6,7,8 --reps 15 --variants pair_s2_lx_c2,pair_s2_lx_m1,pair_s2_lx_m2,rows1_s2_lx_c2 2>&1 | tail -7 | cut -c1-230
echo "== qkv gate_up"
timeout 150 python3 out/exp/bench_exp.py --out $OUT/g --shapes qkv,gate_up --ms 1,4,7,8 --reps 10 --variants rows_s3_lx_c2,pair_s2_lx_c2,pair_s2_lx_m1,pair_s2_lx_m2 2>&1 | tail -9 | cut -c1-230
echo "== gemm tests CAST=2"
FDPP_PAIR_CAST=2 OUT=$OUT/t bash scripts/device_job.sh gemm_tests gemm_sanitize > $OUT/job.log 2>&1
grep -E "^=== |passed|failed|FAILED|rror" $OUT/job.log | tail -14
tar czf $OUT/exp.tgz -C $OUT o g t job.log 2>/dev/null; rm -rf $OUT/o $OUT/g $OUT/t
