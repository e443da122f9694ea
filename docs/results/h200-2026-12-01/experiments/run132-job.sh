#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/lib.tar.xz && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem --format=csv,noheader
python3 out/exp/readbw.py
B="timeout 150 python3 out/exp/bench_exp.py --reps 10"
V_O=pair_s2_l2_c0,pair_s2_l2_q11,pair_s2_l2_q12,pair_s2_l2_q13,pair_s2_l2_q14,pair_s2_l2_q8,pair_s2_l2_b1,pair_s2_l2_b1q12
export FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
$B --out $OUT/o1 --shapes o --ms 1,4,8 --variants $V_O 2>&1 | grep -v Warn
FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so $B --out $OUT/o_lib --shapes o --ms 1,8 --variants pair_s2_l2_c0 2>&1 | grep -v Warn
$B --out $OUT/o2 --shapes o --ms 1,4,8 --variants $V_O 2>&1 | grep -v Warn
$B --out $OUT/d1 --shapes down --ms 1,8 --variants pair_s3_l2_c0,pair_s3_l2_q12,pair_s3_l2_q14,pair_s3_l2_q8,pair_s3_l2_b1,pair_s3_l2_b1q12 2>&1 | grep -v Warn
FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so timeout 100 python3 scripts/bench_gemm.py --shapes o --profile engines/profiles/h200.json --out $OUT/bg --force 2>&1 | grep -A14 "== o" | head -16
python3 out/exp/readbw.py
FDPP_PAIR_SHIFT=12 FDPP_PAIR_DIRECT=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k pair -x 2>&1 | tail -2
