#!/usr/bin/env bash
set -u
mkdir -p .deps && for t in lib libnew; do tar -C .deps -xJf .deps/carry/$t.tar.xz; done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,uuid --format=csv,noheader
B="timeout 120 python3 out/exp/bench_exp.py --reps 10 --shapes o,down,qkv,gate_up --ms 1,8,16 --variants pair_s2_l2_c0,pair_s3_l2_c0,rows_s3_l2_c0,rows1_s2_l2_c0"
mkdir -p $OUT/ab
for pass in 1 2; do
  for L in lib libnew; do
    echo "-- pass $pass: $L"; FDPP_PLUGIN_LIB=$PWD/.deps/$L/libfdpp_plugins.so $B --out $OUT/ab/$L$pass 2>&1 | grep -v Warn
  done
done
tar -C $OUT -czf $OUT/ab.tgz ab && rm -rf $OUT/ab
export FDPP_PLUGIN_LIB=$PWD/.deps/libnew/libfdpp_plugins.so
OUT=$OUT bash scripts/device_job.sh gemm_tests gemm_sanitize profile gemm_bench 2>&1 | tail -40
mkdir -p $OUT/bench2 && tar -C $OUT -xzf $OUT/results.tgz results/profiles/h200.json 2>/dev/null
timeout 100 python3 scripts/bench_gemm.py --out $OUT/bench2 --force --profile $OUT/results/profiles/h200.json > $OUT/bench2/log.txt 2>&1; grep -A12 "== bars" $OUT/bench2/log.txt
rm -rf $OUT/results
