"""The Hugging Face peers of the engine benchmark: transformers' own model of a preset, with the same weights the
export writes (the preset's seeded random init, or its trained weights), timed on the same prompts.

    python scripts/bench_hf.py llama2-7b --modes eager compile --batch 1 8 --context 128 1024 --out hf.json

Modes:
  eager     model.generate with the default dynamic cache and the default (sdpa) attention
  compile   a static cache (cache_implementation="static"), with which generate compiles the decoding forward
            with torch.compile (CompileConfig fullgraph, mode "reduce-overhead": CUDA graphs), transformers'
            documented fast path; it recompiles per shape, and the warm-up generation of each point pays that
Per point: first-token time = a timed generate of 1 new token; decode step = (time of `--new-tokens` minus the
time of 1) / (new tokens - 1), greedy, min_new_tokens = max_new_tokens so no sequence stops early. Prompts are
those of `bench` (random ids, seed 0), so the engine's and these numbers are for the same inputs.

The JSON is rewritten after every point and read back on start: points already in it are skipped, so a run cut
by a time limit continues where it stopped (`--deadline-s` stops starting new points after that many seconds).
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def hf_model(preset: str, layers: int | None, dtype: str, device: str):
    import torch
    import transformers

    from fdpp_rewrite.models import load_model
    from fdpp_rewrite.models.hf import hf_state_dict
    from fdpp_rewrite.models.hf_config import hf_config_json

    loaded = load_model(preset, dtype=dtype, num_layers=layers)
    config_json = hf_config_json(loaded.config)
    fields = {k: v for k, v in config_json.items() if k not in ("model_type", "architectures")}
    if config_json["model_type"] == "llama":
        config = transformers.LlamaConfig(**fields)
        model_class = transformers.LlamaForCausalLM
    else:  # every other family (gemma3_text, qwen3, phi3...): transformers' own class of its model_type
        try:
            config = transformers.AutoConfig.for_model(config_json["model_type"], **fields)
        except ValueError as exc:
            raise SystemExit(f"error: transformers {transformers.__version__} has no model of type "
                             f"{config_json['model_type']!r} ({preset}): {exc}") from None
        model_class = transformers.AutoModelForCausalLM.from_config
    torch_dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[dtype]
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # built in the target dtype on the target device: no fp32 copy on the host
    try:
        with torch.device(device):
            model = model_class(config)
    finally:
        torch.set_default_dtype(default_dtype)
    state = hf_state_dict(loaded.config, loaded.weights)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [name for name in missing if not (loaded.config.tie_embeddings and name == "lm_head.weight")]:
        raise SystemExit(f"error: weights do not match transformers' model (missing {missing}, unexpected "
                         f"{unexpected})")
    del state
    model.eval()
    return model, loaded.origin


def prompts_of(vocab: int, batch: int, context: int):
    rng = random.Random(0)  # the prompts `bench` draws (fdpp_rewrite/engine/bench.py, bench_point)
    return [[rng.randrange(vocab) for _ in range(context)] for _ in range(batch)]


def timed_generate(model, ids, new_tokens: int, **options) -> float:
    import torch

    if ids.is_cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **options)
    if ids.is_cuda:
        torch.cuda.synchronize()
    assert out.shape[1] == ids.shape[1] + new_tokens
    return time.perf_counter() - started


def bench_point(model, mode: str, batch: int, context: int, new_tokens: int, vocab: int, device: str) -> dict:
    import torch
    import transformers

    ids = torch.tensor(prompts_of(vocab, batch, context), device=device)
    options = {}
    if mode == "compile":  # transformers compiles the decoding forward itself when the cache is static
        options = {"cache_implementation": "static",
                   "compile_config": transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")}
    started = time.perf_counter()
    timed_generate(model, ids, new_tokens, **options)  # warm-up (compile mode: compiles and captures this shape)
    warmup_s = time.perf_counter() - started
    first = min(timed_generate(model, ids, 1, **options) for _ in range(2))
    total = timed_generate(model, ids, new_tokens, **options)
    step = (total - first) / (new_tokens - 1)
    return {"system": f"hf-{mode}", "batch": batch, "context": context, "new_tokens": new_tokens,
            "tokens_per_s": batch / step, "ms_per_step": step * 1e3, "first_token_ms": first * 1e3,
            "warmup_s": warmup_s}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset")
    parser.add_argument("--layers", type=int, help="keep only the first N layers (default: all)")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", nargs="+", default=["eager", "compile"], choices=["eager", "compile"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--context", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--deadline-s", type=float, help="start no new point after this many seconds")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write (and to resume from)")
    args = parser.parse_args(argv)
    if args.new_tokens < 2:
        parser.error("--new-tokens must be at least 2 to time a decode step")

    import torch
    import transformers

    from fdpp_rewrite.errors import require_gpu

    if args.device.startswith("cuda"):
        require_gpu("bench_hf on --device cuda")
    started = time.perf_counter()
    report = json.loads(args.out.read_text()) if args.out.is_file() else {"points": []}
    done = {(p["system"], p["batch"], p["context"]) for p in report["points"]}
    todo = [(m, b, c) for m in args.modes for c in args.context for b in args.batch if (f"hf-{m}", b, c) not in done]
    if not todo:
        print(f"every point is already in {args.out}")
        return 0
    model, origin = hf_model(args.preset, args.layers, args.dtype, args.device)
    print(f"loaded {args.preset} into transformers {transformers.__version__} in {time.perf_counter() - started:.0f} s "
          f"({origin})", flush=True)
    command = "python " + " ".join([f"scripts/{Path(__file__).name}", *(argv or sys.argv[1:])])
    report["commands"] = report.get("commands", []) + [command]  # every run that added points, in order
    report.update(preset=args.preset, layers=args.layers, dtype=args.dtype, transformers=transformers.__version__,
                  torch=torch.__version__, weights=origin)
    for mode, batch, context in todo:
        if args.deadline_s and time.perf_counter() - started > args.deadline_s:
            print(f"deadline: {len([t for t in todo if (f'hf-{t[0]}', t[1], t[2]) not in done])} points left for "
                  "the next run", flush=True)
            break
        try:
            point = bench_point(model, mode, batch, context, args.new_tokens, model.config.vocab_size, args.device)
        except Exception as exc:  # noqa: BLE001 - a peer that fails at one shape is recorded, the rest still run
            point = {"system": f"hf-{mode}", "batch": batch, "context": context, "error": f"{type(exc).__name__}: "
                     f"{str(exc).splitlines()[0] if str(exc) else ''}"[:300]}
        report["points"].append(point)
        done.add((point["system"], batch, context))
        tmp = Path(f"{args.out}.tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, args.out)
        shown = (f"{point['tokens_per_s']:.1f} tok/s, {point['ms_per_step']:.2f} ms/step, first token "
                 f"{point['first_token_ms']:.1f} ms (warm-up {point['warmup_s']:.0f} s)") if "error" not in point \
            else point["error"]
        print(f"hf-{mode} batch {batch} context {context}: {shown}", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    from fdpp_rewrite.errors import run_script

    run_script(main)
