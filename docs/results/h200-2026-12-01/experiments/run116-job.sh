#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
for xr in 1 2; do
echo "== xreg $xr tests"
FDPP_PAIR_XREG=$xr timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "pair" 2>&1 | tail -1
done
for r in 1 2; do
timeout 120 python3 out/exp/bench_exp.py --out $OUT/o$r --shapes o --ms 1,2,4,8 --reps 15 --variants pair_s2_lx_c0,pair_s2_lx_r1,pair_s2_lx_r2,pair_s3_lx_r1,pair_s3_lx_r2 2>&1 | grep "M=" | cut -c1-160
done
timeout 120 python3 out/exp/bench_exp.py --out $OUT/down --shapes down,qkv --ms 1,8 --reps 10 --variants pair_s3_lx_c0,pair_s3_lx_r1,pair_s3_lx_r2,rows_s3_lx_c0 2>&1 | grep "M=" | cut -c1-160
tar czf $OUT/s17a.tgz -C $OUT o1 o2 down; rm -rf $OUT/o1 $OUT/o2 $OUT/down
