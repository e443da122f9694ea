#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout 100 python3 out/exp/bench_exp.py --out $OUT/gu --shapes gate_up --ms 6,7,8 --reps 10 --variants rows_s3_lx_c2,rows_s3_lx_y1,rows_s3_lx_x1y1 2>&1 | tail -4 | cut -c1-170
timeout 100 python3 out/exp/bench_exp.py --out $OUT/o --shapes o --ms 6,7,8 --reps 15 --variants rows1_s2_lx_c2,rows1_s2_lx_y1,rows1_s2_lx_x1y1 2>&1 | tail -4 | cut -c1-170
