#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum .deps/lib/libfdpp_plugins.so .deps/libexp/libfdpp_plugins.so
export FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
echo "== acc tests"; FDPP_PAIR_ACC=1 timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "pair" 2>&1 | tail -1
echo "== xreg+acc tests"; FDPP_PAIR_XREG=2 FDPP_PAIR_ACC=1 timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "pair" 2>&1 | tail -1
V=pair_s2_lx_c0,pair_s2_lx_i1,pair_s2_lx_z1,pair_s2_lx_r2,pair_s2_lx_r2i1,pair_s3_lx_r2i1
for r in 1 2; do
echo "== committed lib"; FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so timeout 60 python3 out/exp/bench_exp.py --out $OUT/c$r --shapes o --ms 1,8 --reps 15 --variants pair_s2_lx_c0 2>&1 | grep "M=" | cut -c1-100
echo "== exp lib"; timeout 120 python3 out/exp/bench_exp.py --out $OUT/o$r --shapes o --ms 1,2,4,8 --reps 15 --variants $V 2>&1 | grep "M=" | cut -c1-190
done
timeout 120 python3 out/exp/bench_exp.py --out $OUT/down --shapes down --ms 1,8 --reps 10 --variants pair_s3_lx_c0,pair_s3_lx_i1,pair_s3_lx_r2i1,pair_s3_lx_z1 2>&1 | grep "M=" | cut -c1-190
tar czf $OUT/s17b.tgz -C $OUT c1 c2 o1 o2 down; rm -rf $OUT/c1 $OUT/c2 $OUT/o1 $OUT/o2 $OUT/down
