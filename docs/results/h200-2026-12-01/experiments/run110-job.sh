#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
echo "== pair tests, TILES=4"
FDPP_PAIR_TILES=4 timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "pair" 2>&1 | tail -2
echo "== o"
timeout 150 python3 out/exp/bench_exp.py --out $OUT/o --shapes o --ms 1,2,4,8 --reps 15 --variants pair_s2_lx_c2,pair_s2_lx_n4,pair_s3_lx_n4,pair_s2_lx_c2x 2>&1 | grep "M=" | cut -c1-150
echo "== others"
timeout 150 python3 out/exp/bench_exp.py --out $OUT/g --shapes qkv,down --ms 1,8 --reps 10 --variants pair_s2_lx_c2,pair_s3_lx_c2,pair_s2_lx_n4,pair_s3_lx_n4 2>&1 | grep "M=" | cut -c1-150
tar czf $OUT/s16d.tgz -C $OUT o g; rm -rf $OUT/o $OUT/g
