#!/usr/bin/env bash
set -u
mkdir -p .deps && for t in lib libexp libnew; do tar -C .deps -xJf .deps/carry/$t.tar.xz; done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
B="timeout 100 python3 out/exp/bench_exp.py --reps 10"
for pass in 1 2; do
  echo "-- pass $pass: committed lib"; FDPP_PLUGIN_LIB=$PWD/.deps/lib/libfdpp_plugins.so $B --out $OUT/lib$pass --shapes o,down --ms 1,8,16 --variants pair_s2_l2_c0,pair_s3_l2_c0 2>&1 | grep -v Warn
  echo "-- pass $pass: new lib"; FDPP_PLUGIN_LIB=$PWD/.deps/libnew/libfdpp_plugins.so $B --out $OUT/new$pass --shapes o,down --ms 1,8,16 --variants pair_s2_l2_c0,pair_s3_l2_c0 2>&1 | grep -v Warn
  echo "-- pass $pass: exp lib (j2 = run 132's)"; FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so $B --out $OUT/exp$pass --shapes o,down --ms 1,8,16 --variants pair_s2_l2_j2,pair_s3_l2_j2 2>&1 | grep -v Warn
done
FDPP_PLUGIN_LIB=$PWD/.deps/libnew/libfdpp_plugins.so timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k pair 2>&1 | tail -2
