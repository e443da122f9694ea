#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
B="timeout 150 python3 out/exp/bench_exp.py --reps 10"
export FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
V=pair_s2_l2_c0,pair_s2_l2_j1,pair_s2_l2_j2,pair_s2_l3_c0,pair_s2_l3_j2
for pass in 1 2; do $B --out $OUT/o$pass --shapes o --ms 1,4,8,16 --variants $V 2>&1 | grep -v Warn; done
$B --out $OUT/d1 --shapes down --ms 1,8,16 --variants pair_s3_l2_c0,pair_s3_l2_j1,pair_s3_l2_j2,pair_s2_l2_c0,pair_s2_l2_j2 2>&1 | grep -v Warn
FDPP_PAIR_LEAN=2 timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k pair 2>&1 | tail -2
