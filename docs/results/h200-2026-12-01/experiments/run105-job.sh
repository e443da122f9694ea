#!/usr/bin/env bash
set -u
mkdir -p .deps/c && tar -C .deps/c -xJf .deps/carry/lib.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/c/lib/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
timeout 120 python3 out/exp/bench_exp.py --out $OUT/gu --shapes gate_up --ms 5,6,7,8,9 --reps 10 --variants rows_s3_lx_c2,rows_s2_lx_c2,rows1_s2_lx_c2 2>&1 | tail -6 | cut -c1-160
timeout 120 python3 out/exp/bench_exp.py --out $OUT/o --shapes o --ms 1,2,3,4,5,6,7,8 --reps 15 --variants pair_s2_lx_c2,rows1_s2_lx_c2 2>&1 | tail -9 | cut -c1-160
