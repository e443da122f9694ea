"""Accuracy of a GPU engine on real text against the fp32 reference model: perplexity, teacher-forced next-token
top-1 agreement, and the asynchronized softmax's fallback rate.

    python scripts/accuracy_engine.py ENGINE --reference smollm2-135m --tokens 16384 --window 1024 --out acc.json

Text: the King James Bible's New Testament (fdpp_rewrite.text split "heldout"; the calibration reads only the Old
Testament), tokenized with the engine's tokenizer and cut into windows of --window tokens, each scored from its
own start. The reference: transformers' model of the family (LlamaForCausalLM, Gemma3ForCausalLM...) in float32
on the engine's device with the same weights (the preset's, e.g. SmolLM2's dequantized GGUF), per window. The
engine is scored twice:
  prefill  each window in one prompt pass (the prefill attention, logits of every position)
  decode   the windows decoded token by token, teacher-forced, --batch windows at a time (the decode attention,
           its CUDA graphs and the per-sequence lengths)
Fallback rate: rows that took the exact fallback (the library's counters) over the attention rows computed
(layers x query heads x query positions).
The peer (--peer-dtype, default the engine's dtype when it is not float32): the same transformers model in that
dtype, each window in one forward pass, scored like the engine's prefill: what rounding to that dtype costs any
runtime, beside what it costs ours.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def windows_of(tokenizer, tokens: int, window: int) -> list:
    from fdpp_rewrite.text import real_text

    text = real_text("heldout", min(12 * tokens, 900_000))  # ~4 characters a token: plenty
    ids = tokenizer.encode(text)
    if len(ids) < tokens:
        raise SystemExit(f"error: the held-out text has {len(ids)} tokens; ask for at most that many")
    ids = ids[:tokens - tokens % window]
    return [ids[i:i + window] for i in range(0, len(ids), window)]


class Scores:
    """Running negative log-likelihood and argmax agreement with the reference, over scored positions."""

    def __init__(self):
        self.nll, self.count, self.agree = 0.0, 0, 0

    def add(self, logits, targets, reference_argmax=None):
        import torch

        logp = torch.log_softmax(logits.float(), dim=-1)
        self.nll += -logp.gather(-1, targets.unsqueeze(-1)).sum().item()
        self.count += targets.numel()
        if reference_argmax is not None:
            self.agree += (logits.argmax(-1) == reference_argmax).sum().item()

    def report(self) -> dict:
        return {"perplexity": math.exp(self.nll / self.count), "positions": self.count,
                "top1_agreement": self.agree / self.count}


def score_peer(preset: str, dtype: str, device: str, windows: list, ref_argmax: list) -> Scores:
    """transformers' model in `dtype`, each window in one forward pass, against the float32 reference's argmax."""
    import torch

    from bench_hf import hf_model

    model, _ = hf_model(preset, None, dtype, device)
    scores = Scores()
    with torch.inference_mode():
        for ids, argmax in zip(windows, ref_argmax):
            x = torch.tensor([ids], device=device)
            scores.add(model(input_ids=x).logits[0, :-1], x[0, 1:], argmax)
    del model
    torch.cuda.empty_cache()
    return scores


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", type=Path)
    parser.add_argument("--reference", required=True, help="the preset (or checkpoint) the engine was exported from")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8, help="windows decoded together in the decode pass")
    parser.add_argument("--peer-dtype", choices=["float16", "bfloat16", "none"],
                        help="also score transformers' model in this dtype against the float32 reference (default: "
                             "the engine's dtype, none for a float32 engine)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import torch

    from bench_hf import hf_model
    from fdpp_rewrite.engine.buckets import pick
    from fdpp_rewrite.engine.cli import _tokenizer
    from fdpp_rewrite.engine.runtime import Engine
    from fdpp_rewrite.gpu.attention import read_library_counters

    started = time.perf_counter()
    engine = Engine(args.engine)
    tokenizer = _tokenizer(engine)
    if tokenizer is None:
        raise SystemExit(f"error: {args.engine} has no tokenizer; accuracy needs real text")
    if args.window > engine.max_seq:
        raise SystemExit(f"error: --window {args.window} exceeds the engine's max sequence {engine.max_seq}")
    windows = windows_of(tokenizer, args.tokens, args.window)
    # the reference, window by window (float32, full causal attention)
    device = engine.device.type  # the cpu backend runs this too (no fallback counters there: reported as None)
    counters = read_library_counters if device == "cuda" else (lambda reset: (None, None))
    reference, origin = hf_model(args.reference, None, "float32", device)
    reference_class = type(reference).__name__
    rows_per_token = engine.num_layers * reference.config.num_attention_heads
    ref_scores, ref_argmax = Scores(), []
    with torch.inference_mode():
        for ids in windows:
            x = torch.tensor([ids], device=device)
            logits = reference(input_ids=x).logits[0, :-1]
            ref_scores.add(logits, x[0, 1:])
            ref_argmax.append(logits.argmax(-1))
    del reference
    torch.cuda.empty_cache()
    peer_dtype = args.peer_dtype or (engine.manifest["dtype"] if engine.manifest["dtype"] != "float32" else "none")
    peer = None if peer_dtype == "none" else score_peer(args.reference, peer_dtype, device, windows, ref_argmax)

    # engine, prefill: one prompt pass per window, every position's logits
    counters(reset=True)
    prefill = Scores()
    for ids, argmax in zip(windows, ref_argmax):
        engine.reset()
        x = torch.tensor([ids], device=engine.device)
        past = torch.zeros(1, dtype=torch.int64, device=engine.device)
        feeds = engine.feeds(x, past, slice(0, 1), pick(len(ids), engine.kv_buckets))
        logits = engine.forward(feeds, cache_program=True)[0, :-1]
        prefill.add(logits, x[0, 1:], argmax)
    prefill_fallback, _ = counters(reset=True)
    prefill_rows = rows_per_token * args.tokens

    # engine, decode: teacher-forced, --batch windows at a time
    decode = Scores()
    batch = min(args.batch, engine.max_batch)
    for first in range(0, len(windows), batch):
        group = windows[first:first + batch]
        truth = torch.tensor(group, device=engine.device)
        engine.reset()
        logits = torch.stack([engine.prefill(slot, ids[:1]) for slot, ids in enumerate(group)])
        engine.active = len(group)
        step_logits = [logits]
        for t in range(1, args.window - 1):
            step_logits.append(engine.decode(truth[:, t]).clone())  # a view of the graph's output buffer
        stacked = torch.stack(step_logits, dim=1)  # [B, window - 1, V]: the prediction of positions 1..window-1
        decode.add(stacked, truth[:, 1:], torch.stack(ref_argmax[first:first + batch]))
    decode_fallback, _ = counters(reset=True)
    decode_rows = rows_per_token * args.tokens

    report = {"command": "python " + " ".join([f"scripts/{Path(__file__).name}", *(argv or sys.argv[1:])]),
              "engine": str(args.engine), "gpu": engine.manifest.get("gpu"), "dtype": engine.manifest["dtype"],
              "reference": f"{args.reference}, transformers {reference_class} float32 ({origin})",
              "text": "KJV New Testament (fdpp_rewrite.text 'heldout'; calibration used the Old Testament)",
              "tokens": args.tokens, "window": args.window,
              "reference_perplexity": ref_scores.report()["perplexity"],
              "prefill": {**prefill.report(), "fallback_rows": prefill_fallback, "attention_rows": prefill_rows},
              "decode": {**decode.report(), "fallback_rows": decode_fallback, "attention_rows": decode_rows},
              "peer": None if peer is None else {"model": f"transformers {peer_dtype}", **peer.report()},
              "seconds": time.perf_counter() - started}
    for mode in ("prefill", "decode"):
        part = report[mode]
        part["perplexity_vs_reference_pct"] = 100 * (part["perplexity"] / report["reference_perplexity"] - 1)
        rows = part["fallback_rows"]
        part["fallback_rate"] = None if rows is None else rows / part["attention_rows"]
        print(f"{mode:>7}: perplexity {part['perplexity']:.4f} (reference {report['reference_perplexity']:.4f}, "
              f"{part['perplexity_vs_reference_pct']:+.3f}%), top-1 agreement {100 * part['top1_agreement']:.2f}%, "
              f"fallback rows {part['fallback_rows']} of {part['attention_rows']}")
    if peer is not None:
        part = report["peer"]
        part["perplexity_vs_reference_pct"] = 100 * (part["perplexity"] / report["reference_perplexity"] - 1)
        print(f"   peer: {part['model']}: perplexity {part['perplexity']:.4f} "
              f"({part['perplexity_vs_reference_pct']:+.3f}%), top-1 agreement {100 * part['top1_agreement']:.2f}%")
    tmp = Path(f"{args.out}.tmp")
    tmp.write_text(json.dumps(report, indent=1) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out} in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
