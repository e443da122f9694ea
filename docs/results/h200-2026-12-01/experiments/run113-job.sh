#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz && tar -C .deps -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum .deps/lib/libfdpp_plugins.so .deps/libexp/libfdpp_plugins.so
echo "== splitw tests"
FDPP_PAIR_SPLITW=1 FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_gemm.py -k "pair" 2>&1 | tail -1
for lib in lib libexp lib libexp; do
  echo "== $lib"
  FDPP_PLUGIN_LIB=$PWD/.deps/$lib/libfdpp_plugins.so timeout 90 python3 out/exp/bench_exp.py --out $OUT/o_$lib --shapes o --ms 1,2,4,8 --reps 15 --variants pair_s2_lx_c2,pair_s2_lx_g1 2>&1 | grep "M=" | cut -c1-110
done
FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so timeout 90 python3 out/exp/bench_exp.py --out $OUT/down --shapes down --ms 1,8 --reps 10 --variants pair_s3_lx_c2,pair_s3_lx_g1 2>&1 | grep "M=" | cut -c1-110
tar czf $OUT/s16g.tgz -C $OUT o_lib o_libexp down; rm -rf $OUT/o_lib $OUT/o_libexp $OUT/down
