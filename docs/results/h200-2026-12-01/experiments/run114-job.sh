#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libexp.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/libexp/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid,clocks.sm --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
mkdir -p $OUT/tr && timeout 200 python3 out/exp/pair_trace.py $OUT/tr 2>&1 | tail -8
tar czf $OUT/s16h.tgz -C $OUT tr && rm -rf $OUT/tr
