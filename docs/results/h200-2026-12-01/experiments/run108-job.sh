#!/usr/bin/env bash
set -u
mkdir -p .deps/c && tar -C .deps/c -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
for lib in .deps/c/lib .deps/libexp .deps/c/lib .deps/libexp; do
  echo "== $lib"
  FDPP_PLUGIN_LIB=$PWD/$lib/libfdpp_plugins.so timeout 60 python3 out/exp/bench_exp.py --out $OUT/x --shapes o --ms 1,8 --reps 15 --variants pair_s2_lx_c2,rows1_s2_lx_c2 2>&1 | grep "M=" | cut -c1-120
done
