#!/usr/bin/env bash
set -u
mkdir -p .deps && tar -C .deps -xJf .deps/carry/libnew.tar.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FDPP_PLUGIN_LIB=$PWD/.deps/libnew/libfdpp_plugins.so
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
sha256sum $FDPP_PLUGIN_LIB
python3 out/exp/readbw.py
for i in 1 2; do
  timeout 100 python3 scripts/bench_gemm.py --out $OUT/s$i --force --profile engines/profiles/h200.json > $OUT/bench-$i.log 2>&1
  cp $OUT/s$i/results.json $OUT/results-$i.json; rm -rf $OUT/s$i
  grep -A12 "== bars" $OUT/bench-$i.log | grep -E "PASS|FAIL|graph  "
  grep -E "^   8 " $OUT/bench-$i.log
done
python3 out/exp/readbw.py
