#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
export FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
sha256sum $FDPP_PLUGIN_LIB
V=pair_s2_lx_c0,pair_s2_lx_z1,pair_s2_lx_z2,pair_s2_lx_z3,pair_s2_lx_z4
for r in 1 2; do
timeout 120 python3 out/exp/bench_exp.py --out $OUT/o$r --shapes o --ms 1,4,8 --reps 15 --variants $V 2>&1 | grep "M=" | cut -c1-150
done
timeout 120 python3 out/exp/bench_exp.py --out $OUT/down --shapes down --ms 1,8 --reps 10 --variants pair_s3_lx_c0,pair_s3_lx_z1,pair_s3_lx_z2,pair_s3_lx_z3,pair_s3_lx_z4 2>&1 | grep "M=" | cut -c1-150
tar czf $OUT/s17c.tgz -C $OUT o1 o2 down; rm -rf $OUT/o1 $OUT/o2 $OUT/down
