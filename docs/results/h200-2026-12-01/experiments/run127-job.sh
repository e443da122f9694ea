#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
export FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
sha256sum $FDPP_PLUGIN_LIB
for h in 0 3 4 5; do echo "== HALF=$h tests"; FDPP_PAIR_HALF=$h timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "pair" 2>&1 | tail -1; done
V=pair_s2_lx_c0,pair_s3_lx_c0,pair_s2_lx_h3,pair_s2_lx_h4,pair_s2_lx_h5,pair_s2_lx_h6
for r in 1 2; do
timeout 150 python3 docs/results/h200-2026-12-01/experiments/run98-102-bench-variants.py --out $OUT/o$r --shapes o --ms 1,2,4,8,16 --reps 15 --variants $V 2>&1 | grep "M=" | cut -c1-220
done
timeout 150 python3 docs/results/h200-2026-12-01/experiments/run98-102-bench-variants.py --out $OUT/down --shapes down --ms 1,8,16 --reps 10 --variants pair_s3_lx_c0,pair_s2_lx_c0,pair_s2_lx_h4,pair_s2_lx_h5,pair_s2_lx_h6 2>&1 | grep "M=" | cut -c1-220
tar czf $OUT/s18a.tgz -C $OUT o1 o2 down; rm -rf $OUT/o1 $OUT/o2 $OUT/down
