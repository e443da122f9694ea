#!/usr/bin/env python3
"""The GPU half of calibration: our decode and prefill kernels on a held-out prompt's real q/k/v, with the calibrated
phi per layer, counting the rows that take the exact fallback.

    python -m fdpp_rewrite calibrate -o out/calibration/calibration.json \
        --save-heldout-qkv out/calibration/heldout_qkv.pt
    PYTHONPATH=. python3 scripts/calibration_gpu_check.py --out out/calibration-gpu   # on the GPU machine

Every held-out token is a query row of every head: the decode kernel runs them as one multi-token step (each row
sees exactly the keys a one-token decode step at that position would see), the prefill kernel as the prompt.
The outputs are checked against a float32 reference too. Writes calibration_gpu.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BAR = 1e-4  # fallback rows / rows: the 0.01%


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibration", type=Path, default=Path("out/calibration/calibration.json"))
    parser.add_argument("--qkv", type=Path, default=Path("out/calibration/heldout_qkv.pt"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch

    from fdpp_rewrite.errors import FdppError, require_gpu
    from fdpp_rewrite.gpu import attention as att

    require_gpu("calibration_gpu_check")
    for path in (args.calibration, args.qkv):
        if not path.is_file():
            raise FdppError(f"{path} not found; make it with `python -m fdpp_rewrite calibrate -o "
                            f"{args.calibration} --save-heldout-qkv {args.qkv}`")
    calibration = json.loads(args.calibration.read_text())
    data = torch.load(args.qkv)
    layers = {e["layer"]: e for e in calibration["layers"]}
    if len(layers) != len(data["q"]):
        raise FdppError(f"{args.calibration} has {len(layers)} layers but {args.qkv} has {len(data['q'])}")
    scale = data["scale"]
    report = {"model": calibration["model"], "tokens": data["tokens"], "layers": []}
    hopper = torch.cuda.get_device_capability()[0] == 9
    totals = {"rows": 0, "decode": 0, "prefill": 0, "decode_uncalibrated": 0, "prefill_wgmma": 0}
    for i in range(len(data["q"])):
        q, k, v = (t.cuda() for t in (data["q"][i], data["k"][i], data["v"][i]))
        past = torch.zeros(1, dtype=torch.int64, device="cuda")
        e = layers[i]
        tuned = {"phi": e["phi"], "guard_lo": e["guard_lo"], "guard_hi": e["guard_hi"], "scale": scale}
        row = {"layer": i, "rows": q.shape[1] * q.shape[2], **tuned}
        # prefill_config=1: the 128-row unified-max kernel (off Hopper the plan may choose the synchronized 64-row
        # one for short prompts, which would count no fallbacks and test nothing here); 4: the wgmma kernel the
        # plan runs on sm_90.
        checks = [("decode", "decode", tuned), ("prefill", "prefill", {**tuned, "prefill_config": 1}),
                  ("decode_uncalibrated", "decode", {"scale": scale})]
        if hopper:
            checks.append(("prefill_wgmma", "prefill", {**tuned, "prefill_config": 4}))
            checks.append(("prefill_wgmma_tma", "prefill", {**tuned, "prefill_config": 5}))
        for name, kernel, options in checks:
            counters = att.Counters()
            out = att.attention(q, k, v, past, kernel=kernel, counters=counters, **options)
            row[f"{name}_fallback_rows"] = counters.fallback_rows
            totals[name] += counters.fallback_rows
            if name != "decode_uncalibrated":
                ref = torch.nn.functional.scaled_dot_product_attention(
                    q.float(), k.float().repeat_interleave(q.shape[1] // k.shape[1], 1),
                    v.float().repeat_interleave(q.shape[1] // k.shape[1], 1), is_causal=True, scale=scale)
                row[f"{name}_max_abs_error"] = (out.float() - ref).abs().max().item()
        totals["rows"] += row["rows"]
        report["layers"].append(row)
        print(f"layer {i:2}: phi {e['phi']:7.3f}  fallback rows decode {row['decode_fallback_rows']:5} "
              f"prefill {row['prefill_fallback_rows']:5} "
              f"(uncalibrated decode {row['decode_uncalibrated_fallback_rows']})"
              f" of {row['rows']}; max |err| {row['decode_max_abs_error']:.2e} / {row['prefill_max_abs_error']:.2e}")
    rates = {k: totals[k] / totals["rows"] for k in ("decode", "prefill", "decode_uncalibrated", "prefill_wgmma")}
    report.update(totals=totals, rates=rates, bar=BAR,
                  passed=rates["decode"] < BAR and rates["prefill"] < BAR and rates["prefill_wgmma"] < BAR)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "calibration_gpu.json").write_text(json.dumps(report, indent=1))
    print(f"\nheld-out fallback rate with the calibrated phi: decode {rates['decode']:.5%}, prefill "
          f"{rates['prefill']:.5%} of {totals['rows']} rows (bar < {BAR:.2%}); uncalibrated decode "
          f"{rates['decode_uncalibrated']:.5%}" + (f"; prefill on the wgmma kernel {rates['prefill_wgmma']:.5%}"
                                                   if hopper else ""))
    print("PASS" if report["passed"] else "FAIL")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
