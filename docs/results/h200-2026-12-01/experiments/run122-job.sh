#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
export FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
sha256sum $FDPP_PLUGIN_LIB
echo "== 12 tests"; FDPP_PAIR_NOMATH=12 timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "pair" 2>&1 | tail -1
V=pair_s2_lx_c0,pair_s2_lx_z4,pair_s2_lx_z5,pair_s2_lx_z12
for r in 1 2; do
timeout 120 python3 out/exp/bench_exp.py --out $OUT/o$r --shapes o --ms 1,2,4,8 --reps 15 --variants $V 2>&1 | grep "M=" | cut -c1-200
done
timeout 120 python3 out/exp/bench_exp.py --out $OUT/down --shapes down --ms 1,8 --reps 10 --variants pair_s3_lx_c0,pair_s3_lx_z12,pair_s3_lx_z5 2>&1 | grep "M=" | cut -c1-200
tar czf $OUT/s17g.tgz -C $OUT o1 o2 down; rm -rf $OUT/o1 $OUT/o2 $OUT/down
