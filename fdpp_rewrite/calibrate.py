"""`python -m fdpp_rewrite calibrate [MODEL] -o calibration.json [--histogram H.png] [--apply M.fdpp.onnx]`

Chooses FlashDecoding++'s unified max phi per layer from the model's real attention scores on real text.

The model (default smollm2-135m, its trained weights) reads the calibration split of the real text (--text: the
user's own, its last quarter held out; default fdpp_rewrite.text's KJV, Old Testament); a score hook records, for
every attention row (one query token of one head), the largest and the smallest visible scaled score
(fdpp_rewrite/calibration/collect.py: through the engine on a GPU, the reference model on the CPU). phi is the value
that keeps the most rows inside the decode kernel's guard window, and a layer no phi covers within the fallback
budget runs the synchronized softmax (calibration/stats.py). The float16 prefill's anchored rule is counted with the
kernel's tiling (calibration/prefill.py). The fallback rate is then measured on the held-out split (the New
Testament): here on the CPU with these rules, and on the GPU with the kernels themselves by
scripts/calibration_gpu_check.py, which reads the held-out q/k/v that `--save-heldout-qkv` writes.

Outputs: the calibration JSON that `rewrite --calibration` reads ({"schema": "fdpp-calibration/1", "model",
"layers": [{"layer", "phi", "guard_lo", "guard_hi", "softmax"}, ...]} plus the statistics;
calibration/settings.py reads it), a histogram PNG like the paper's Figure 5 (calibration/plot.py), and with
--apply the settings written onto an existing rewritten graph's AsyncSoftmaxAttention nodes (calibration/graph.py).
"""

from __future__ import annotations

import datetime
import json
import math
import shlex
import sys
from pathlib import Path

from fdpp_rewrite.calibration.collect import (DEVICES, MAX_ENGINE_PROMPT, ByteTokens, calibration_device,
                                              calibration_text, collect, expected_duration, save_heldout_qkv,
                                              text_chunks)
from fdpp_rewrite.calibration.graph import apply_to_graph, load_apply_target
from fdpp_rewrite.calibration.plot import plot_histogram
from fdpp_rewrite.calibration.prefill import PREFILL_FP16_HI
from fdpp_rewrite.calibration.stats import FALLBACK_BUDGET, choose_phi, summarize_layer
from fdpp_rewrite.cli_args import add_force
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.ref_ops import low_guard_tail
from fdpp_rewrite.schemas import CALIBRATION_SCHEMA


def add_arguments(parser) -> None:
    parser.description = (f"{parser.description}. On a GPU (--device cuda, the default where one is present) it runs "
                          "the model's rewritten graph on the engine and collects the scores from the attention "
                          "kernels' inputs; on the CPU the model's reference implementation, which takes longer "
                          "(fewer --calibration-tokens and --heldout-tokens are quicker). The expected duration is "
                          "printed before the work starts.")
    parser.add_argument("model", nargs="?", default="smollm2-135m",
                        help="preset with trained weights, checkpoint directory or .gguf (default: smollm2-135m)")
    parser.add_argument("-o", "--output", default="calibration.json", help="calibration JSON to write")
    parser.add_argument("--histogram", help="PNG of the score distribution (default: <output>.png)")
    parser.add_argument("--text", metavar="FILE|DIR|-",
                        help="your own text: plain text, JSON lines with a \"text\" field, chat JSON lines "
                             "(\"messages\", rendered with the model's chat template), or R .rda; its last quarter "
                             "is held out (default: the built-in KJV Bible, New Testament held out)")
    parser.add_argument("--fallback-budget", type=float, default=FALLBACK_BUDGET,
                        help="a layer whose best phi sends more than this fraction of rows to the fallback is "
                             f"marked synchronized (default: {FALLBACK_BUDGET})")
    parser.add_argument("--calibration-tokens", type=int, default=16384, help="tokens of calibration text")
    parser.add_argument("--heldout-tokens", type=int, default=8192, help="tokens of held-out text")
    parser.add_argument("--chunk", type=int, default=1024, help="tokens per forward pass (one prompt)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="cuda: through the engine on the GPU; cpu: through the reference model (default: auto, "
                             "cuda where a GPU and the plugin library are present)")
    parser.add_argument("--num-layers", type=int, help="only the first N layers, for quick checks (default: all)")
    parser.add_argument("--engine", metavar="ENGINE_DIR",
                        help="collect through this engine, built from the same model, instead of exporting and "
                             "building one first (default: a temporary engine)")
    parser.add_argument("--apply", metavar="MODEL_FDPP_ONNX",
                        help="also set phi and the guards on this rewritten graph's attention nodes, in graph order "
                             "(default: no graph is changed)")
    parser.add_argument("--apply-output", help="where --apply writes (default: in place, which needs --force)")
    parser.add_argument("--save-heldout-qkv", metavar="FILE",
                        help="save one held-out prompt's q/k/v per layer (float16) for the GPU fallback check "
                             "(default: not saved)")
    parser.add_argument("--qkv-tokens", type=int, default=896, help="tokens of that prompt")
    add_force(parser)


def layer_report(layers: list[dict]) -> str:
    """One line a layer: phi, the verdict, the held-out guard margins and fallback rate."""
    lines = ["layer   phi       softmax       margin lo / hi (held-out)   fallback calib / held-out"]
    for e in layers:
        m = e.get("heldout_guard_margins", {"lo": math.nan, "hi": math.nan})
        lines.append(f"{e['layer']:5d} {e['phi']:9.3f}  {e['softmax']:12s}  {m['lo']:9.2f} / {m['hi']:7.2f}"
                     f"          {e['calibration_fallback_rate_decode']:.4%} / "
                     f"{e.get('heldout_fallback_rate_decode', math.nan):.4%}")
    return "\n".join(lines)


def _refuse_overwrite(path: Path, force: bool) -> None:
    if path.exists() and not path.is_dir() and not force:  # a folder: AtomicOutputs.check says so
        raise FdppError(f"{path} exists; pass --force to overwrite it")


def run(args) -> int:
    import torch

    from fdpp_rewrite.atomic import AtomicOutputs
    from fdpp_rewrite.models import load_model

    output = Path(args.output)
    histogram = Path(args.histogram) if args.histogram else output.with_suffix(".png")
    apply_output = Path(args.apply_output or args.apply) if args.apply else None
    if args.apply and apply_output.resolve() == Path(args.apply).resolve() and not args.force:
        raise FdppError(f"--apply would update {args.apply} in place; pass --force, or --apply-output NEW.onnx")
    # every output written under a temporary name and renamed when complete (fdpp_rewrite.atomic)
    outputs = AtomicOutputs([histogram, output], force=args.force, example="calibration.json")
    apply_outputs = AtomicOutputs([apply_output], force=args.force, option="--apply-output") if args.apply else None
    qkv_path = Path(args.save_heldout_qkv) if args.save_heldout_qkv else None
    qkv_outputs = AtomicOutputs([qkv_path], force=args.force, option="--save-heldout-qkv") if qkv_path else None
    for group in (outputs, apply_outputs, qkv_outputs):
        if group is not None:
            for path in group.paths:
                _refuse_overwrite(path, args.force)
            group.check()
    for name in ("calibration_tokens", "heldout_tokens", "chunk", "qkv_tokens"):
        if getattr(args, name) < 1:
            raise FdppError(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.fallback_budget < 1:
        raise FdppError(f"--fallback-budget must be a fraction in [0, 1), got {args.fallback_budget}")
    if args.apply:
        load_apply_target(Path(args.apply), apply_output)
    if args.engine:  # before the model loads (a minute for a 7B preset): a wrong folder fails at once
        from fdpp_rewrite.engine.manifest import read_manifest

        read_manifest(Path(args.engine))

    device = calibration_device(args.device)
    if device == "cuda" and args.chunk > MAX_ENGINE_PROMPT:
        raise FdppError(f"--chunk {args.chunk} is over the engine's one-pass prefill of {MAX_ENGINE_PROMPT} tokens; "
                        "pass a smaller --chunk")
    loaded = load_model(args.model, dtype="float32", num_layers=args.num_layers)
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        tokenizer = ByteTokens(loaded.config.vocab_size)
        print(f"calibrate: {args.model} has no tokenizer ({loaded.origin}): its tokens are the text's UTF-8 bytes "
              "(modulo the vocabulary), for checks on test models only", file=sys.stderr)
    num_layers = loaded.config.num_layers
    torch.set_grad_enabled(False)

    text = calibration_text(args.text, tokenizer)
    calibration_chunks = text_chunks(tokenizer, text.calibration, "calibration", args.calibration_tokens, args.chunk)
    heldout_chunks = text_chunks(tokenizer, text.heldout, "heldout", args.heldout_tokens, args.chunk)
    prompts = len(calibration_chunks) + len(heldout_chunks)
    tokens = sum(map(len, calibration_chunks)) + sum(map(len, heldout_chunks))
    engine_dir = Path(args.engine) if args.engine else None
    if engine_dir is not None:
        where = f"the {device.upper()}, through engine {engine_dir}"
    else:
        where = ("the GPU, through the engine (export, rewrite and engine build first)" if device == "cuda" else
                 "the CPU, through the reference model")
    print(f"calibrate: {text.name}: {prompts} prompts of up to {args.chunk} tokens through {num_layers} layers on "
          f"{where}: {expected_duration(tokens, num_layers, device, engine_dir is not None)}"
          + ("" if device == "cuda" else " on an idle 2-core machine (fewer --calibration-tokens / --heldout-tokens "
             "are quicker)"), file=sys.stderr, flush=True)
    collected = collect(device, args.model, loaded, {"calibration text": calibration_chunks,
                                                     "held-out text": heldout_chunks}, args.chunk, engine_dir)
    cal, held = collected["calibration text"], collected["held-out text"]

    layers = []
    for i in range(num_layers):
        rmax, rmin, _ = cal.layers[i].arrays()
        layers.append(summarize_layer(i, cal.layers[i], held.layers[i], choose_phi(rmax, rmin), args.fallback_budget))
    rows = sum(e["heldout_rows"] for e in layers)
    rates = {k: sum(e[f"heldout_fallback_rows_{k}"] for e in layers) / rows for k in ("decode", "prefill")}
    calibration = {
        "schema": CALIBRATION_SCHEMA, "model": loaded.source, "origin": loaded.origin,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m fdpp_rewrite", *map(shlex.quote, sys.argv[1:])]),
        "source": f"fdpp_rewrite calibrate ({output.name})",
        "text": {"name": text.name, "sha256": text.sha256, "heldout": "the last quarter of its characters"
                 if args.text else "the New Testament",
                 "calibration_tokens": sum(map(len, calibration_chunks)),
                 "heldout_tokens": sum(map(len, heldout_chunks)), "prompt_tokens": args.chunk},
        "rule": f"decode: fallback iff max(s)-phi > guard_hi, or min(s)-phi < guard_lo with max(s)-phi < guard_lo + "
                f"{low_guard_tail():g}; fp16 prefill (the 128-row anchored kernel; the synchronized plans never fall "
                f"back): iff max(s) - max(s over the row's first-processed tiles) > {PREFILL_FP16_HI:g}; a layer over "
                "the fallback budget is softmax=synchronized",
        "fallback_budget": args.fallback_budget,
        "collected_on": "engine (cuda backend, float16 kernels' inputs)" if device == "cuda" else
                        "engine (cpu backend, float32)" if engine_dir else "reference model (cpu, float32)",
        "heldout_rows": rows, "heldout_fallback_rate_cpu": rates,
        "layers": layers,
    }
    with outputs:
        outputs.temp(output).write_text(json.dumps(calibration, indent=1))
        plot_histogram(cal.layers, layers, loaded.source, outputs.temp(histogram))
    print(f"wrote {output} and {histogram}: phi per layer {[e['phi'] for e in layers]}")
    print(f"held-out fallback rate (CPU, the kernels' rule): decode {rates['decode']:.5%}, "
          f"prefill {rates['prefill']:.5%} of {rows} rows")
    print(layer_report(layers))
    if args.apply:
        with apply_outputs:
            count = apply_to_graph(calibration, Path(args.apply), apply_outputs.temp(apply_output))
        print(f"set phi and the guards on {count} attention nodes of {apply_output}")
    if qkv_path:
        ids = text_chunks(tokenizer, text.heldout, "heldout", args.qkv_tokens, args.qkv_tokens)[0]
        with qkv_outputs:
            save_heldout_qkv(loaded, ids, qkv_outputs.temp(qkv_path))
        print(f"wrote {qkv_path} (held-out q/k/v of {len(ids)} tokens for scripts/calibration_gpu_check.py)")
    return 0
