"""`python -m fdpp_rewrite calibrate [MODEL] -o calibration.json [--histogram H.png] [--apply M.fdpp.onnx]`

Chooses FlashDecoding++'s unified max phi per layer from the model's real attention scores on real text.

The model (default smollm2-135m, its trained weights) reads the calibration split of the real text
(--text: the user's own, its last quarter held out; default fdpp_rewrite.text's KJV, Old Testament);
a score hook records, for every attention row (one query token of
one head), the largest and the smallest visible scaled score. On a GPU (--device cuda, or auto with a GPU and the
plugin library) the hook sits on the engine running the model's rewritten graph and sees the attention kernels'
real inputs (fdpp_rewrite.engine.calibration); on the CPU it sits in the reference model. Both give the same JSON.
A model without a tokenizer (a random-init test preset such as tiny-opt-wide) reads the text as UTF-8 bytes.

The decode kernel (the paper's unified max) sends a
row to the exact fallback unless

    max(s) - phi <= guard_hi   and   (guard_lo <= min(s) - phi  or  max(s) - phi >= guard_lo + low_guard_tail)

With guard_lo = -80 and guard_hi = 60, the widest window the contract and the kernel's float32/tf32 P allow, phi is
the value that keeps the most calibration rows inside, centred in the best interval. The prefill kernel keeps P in
fp16 and anchors each row's unified max on its diagonal tiles and tile 0 instead (plugins/kernels/
attention_softmax_state.cuh); its rule, max(s) - anchor <= 11, is simulated here with the kernel's tiling. The
fallback rate is then measured on the held-out split (the New Testament): here on the CPU with these rules, and on
the GPU with the kernels themselves by scripts/calibration_gpu_check.py, which reads the held-out q/k/v that
`--save-heldout-qkv` writes.

Outputs: the calibration JSON that `rewrite --calibration` reads ({"schema": "fdpp-calibration/1", "model",
"layers": [{"layer", "phi", "guard_lo", "guard_hi"}, ...]} plus the statistics), a histogram PNG like the paper's
Figure 5, and with --apply the attributes set on an existing rewritten graph's AsyncSoftmaxAttention nodes.
"""

from __future__ import annotations

import datetime
import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fdpp_rewrite.contracts import attention_guard, load_contract
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.ref_ops import guard_flags, low_guard_tail
from fdpp_rewrite.schemas import CALIBRATION_SCHEMA

# The widest guard window the attention contract allows, [-80, 60]: e^-80 is still a normal float32, and
# 2^20 keys x e^60 x 65504 stay below float32's max.
GUARD_LO, GUARD_HI = attention_guard().lo_range[0], attention_guard().hi_range[1]
# The float16 prefill's window above its anchor (the attention contract's fp16_prefill_window): e^11 fits float16.
PREFILL_FP16_HI = float(load_contract("AsyncSoftmaxAttention").raw["fp16_prefill_window"]["guard_hi"])
# The prefill kernel's tiling (PrefillTraits): query blocks, key tiles, anchor tiles (diagonal ones + tile 0).
PREFILL_BLOCK_M, PREFILL_BLOCK_N, PREFILL_ANCHOR_TILES = 128, 64, 4
# A layer whose best phi still sends more than this fraction of its calibration rows to the fallback runs the
# synchronized softmax instead (the paper's verdict for OPT-6.7B, scores in about [-497, 364]).
FALLBACK_BUDGET = 1e-4
# phi ignores up to this fraction of the rarest calibration rows (well under the budget): a few outliers of one
# text must not move it (issue 29: layer 18's phi moved by 31 between KJV and Austen).
PHI_IGNORED_FRACTION = 2e-5
HIST_RANGE = (-64.0, 64.0)
HIST_BINS = 512


# What the CPU reference model costs per token and layer at the default --chunk, measured on a 2-core machine
# (SmolLM2-135M, 1024-token prompts: about 12 s a prompt for its 30 layers); the default run, 24 prompts, takes
# about 5 minutes there, longer on a busy machine.
CPU_SECONDS_PER_TOKEN_LAYER = 4e-4
# The engine path on a GPU: the export, rewrite and engine build first (about a minute for SmolLM2-135M, GEMM
# profiling included), then the prompts, whose cost is mostly the score statistics (an estimate for an H200).
GPU_SETUP_SECONDS, GPU_SECONDS_PER_TOKEN_LAYER = 60, 5e-6
DEVICES = ("auto", "cpu", "cuda")


def add_arguments(parser) -> None:
    parser.description = (f"{parser.description}. On a GPU (--device cuda, the default where one is present) it runs "
                          "the model's rewritten graph on the engine and collects the scores from the attention "
                          "kernels' inputs (about a minute); on the CPU the model's reference implementation, "
                          "about 5 minutes on an idle 2-core machine at the defaults (fewer --calibration-tokens and "
                          "--heldout-tokens are quicker). The expected duration is printed before the work starts.")
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
    parser.add_argument("--force", action="store_true", help="overwrite existing outputs")


def expected_duration(tokens: int, num_layers: int, device: str = "cpu", engine_given: bool = False) -> str:
    """e.g. 24576 tokens through 30 layers on the cpu -> "about 5 min" (CPU_SECONDS_PER_TOKEN_LAYER); on cuda the
    export and build come first unless the user's engine is given."""
    if device == "cuda":
        setup = 0 if engine_given else GPU_SETUP_SECONDS
        seconds = setup + GPU_SECONDS_PER_TOKEN_LAYER * tokens * num_layers
    else:
        seconds = CPU_SECONDS_PER_TOKEN_LAYER * tokens * num_layers
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {max(seconds, 1):.0f} s"


# --- statistics --------------------------------------------------------------------------------------------------

@dataclass
class LayerStats:
    """Per attention row of one layer: its largest and smallest visible score, and its head; plus a histogram of
    every visible score."""

    row_max: list = field(default_factory=list)
    row_min: list = field(default_factory=list)
    head: list = field(default_factory=list)
    hist: object = None
    below: int = 0  # scores under / over the histogram's range
    above: int = 0
    prefill_fallback: int = 0  # rows the anchored fp16 prefill kernel would recompute (simulated tiling)

    def arrays(self):
        import torch

        return torch.cat(self.row_max).cpu(), torch.cat(self.row_min).cpu(), torch.cat(self.head).cpu()


class ScoreCollector:
    """The score hook of both paths (ReferenceModel's, and the engine's CollectingBackend): scores [B, Hq, S, L]
    (scaled, before the mask), mask [B, 1, S, L], on any device; the statistics stay on it until arrays()."""

    def __init__(self, num_layers: int):
        self.layers = [LayerStats() for _ in range(num_layers)]

    def __call__(self, layer: int, scores, mask) -> None:
        import torch

        stats = self.layers[layer]
        visible = torch.isfinite(mask).expand_as(scores)
        s = scores.float()
        stats.row_max.append(s.masked_fill(~visible, -math.inf).amax(-1).flatten())
        stats.row_min.append(s.masked_fill(~visible, math.inf).amin(-1).flatten())
        heads = torch.arange(s.shape[1], device=s.device).view(1, -1, 1).expand(s.shape[0], -1, s.shape[2])
        stats.head.append(heads.flatten())
        values = s[visible]
        hist = torch.histc(values, bins=HIST_BINS, min=HIST_RANGE[0], max=HIST_RANGE[1])
        hist = hist.cpu()  # 512 counts: plot_histogram reads them on the host
        stats.hist = hist if stats.hist is None else stats.hist + hist
        stats.below += int((values < HIST_RANGE[0]).sum())
        stats.above += int((values > HIST_RANGE[1]).sum())
        stats.prefill_fallback += anchored_prefill_fallbacks(s.masked_fill(~visible, -math.inf))


def anchored_prefill_fallbacks(s) -> int:
    """Rows of one prompt (scores [B, H, S, L], masked = -inf, past_len 0) whose max exceeds their anchor by more
    than PREFILL_FP16_HI, the anchor being the max over the tiles the prefill kernel processes first."""
    import torch

    seq, total = s.shape[2], 0
    row_max = s.amax(-1)
    for m0 in range(0, seq, PREFILL_BLOCK_M):
        m1 = min(m0 + PREFILL_BLOCK_M, seq)
        tiles = -(-m1 // PREFILL_BLOCK_N)
        if tiles <= PREFILL_ANCHOR_TILES:
            continue  # every tile runs the synchronized update: nothing can fall back
        first_diag = (tiles - PREFILL_ANCHOR_TILES + 1) * PREFILL_BLOCK_N
        block = s[:, :, m0:m1]
        anchor = torch.maximum(block[..., :PREFILL_BLOCK_N].amax(-1), block[..., first_diag:].amax(-1))
        total += int((row_max[:, :, m0:m1] > anchor + PREFILL_FP16_HI).sum())
    return total



def text_chunks(tokenizer, text: str, split: str, num_tokens: int, chunk: int) -> list[list[int]]:
    """Up to num_tokens tokens of the split's text in prompts of `chunk` tokens."""
    flag = "--calibration-tokens" if split == "calibration" else "--heldout-tokens / --qkv-tokens"
    ids = tokenizer.encode(text[:num_tokens * 8])  # under 8 characters a token in any prose: enough, then cut
    if len(ids) < 2:
        raise FdppError(f"the {split} text gives only {len(ids)} tokens; pass a longer --text (or lower {flag})")
    if len(ids) < num_tokens:
        print(f"calibrate: the {split} text gives {len(ids)} tokens, fewer than {flag} {num_tokens}: using them all",
              file=sys.stderr)
    ids = ids[:num_tokens]
    return [ids[i:i + chunk] for i in range(0, len(ids), chunk)]


def run_model(model, chunks, collector=None, desc="forward", progress=None):
    import torch

    from fdpp_rewrite.progress import Progress

    with (progress or Progress()).stage(desc, total=len(chunks), unit="prompt") as stage:
        for ids in chunks:
            input_ids = torch.tensor([ids])
            caches = model.new_caches(1, len(ids))
            model.forward(input_ids, torch.zeros(1, dtype=torch.int64), caches, score_hook=collector)
            stage.update()


# --- choosing phi ---------------------------------------------------------------------------------------------------

def fallback_rows(row_max, row_min, phi: float, guard_lo: float, guard_hi: float) -> int:
    """Rows (of a layer's row_max / row_min tensors) the decode kernel's guard sends to the fallback at this phi."""
    return int(guard_flags(row_max, row_min, phi, guard_lo, guard_hi).sum())


def phi_upper_bounds(row_max, row_min, guard_lo: float = GUARD_LO):
    """Per row, the largest phi at which the low side of the guard keeps it (ref_ops.guard_flags): a row is kept
    while its min is within guard_lo of phi, or its max within guard_lo + low_guard_tail."""
    import torch

    return torch.maximum(row_min.double() - guard_lo, row_max.double() - guard_lo - low_guard_tail())


def choose_phi(row_max, row_min, guard_lo: float = GUARD_LO, guard_hi: float = GUARD_HI, step: float = 0.05,
               ignored_fraction: float = PHI_IGNORED_FRACTION) -> float:
    """A phi that keeps all calibration rows but the rarest `ignored_fraction` on the fast path (a row is kept for
    phi in [row_max - guard_hi, phi_upper_bounds]). Among those phi (an interval [A, B]) it takes the one nearest
    the median row max, as the paper's phi sits near the maxima (typical rows then have p near 1), but keeps a
    margin of min(10, (B - A) / 4) from both ends for held-out rows beyond the calibration's. Ignoring the rarest
    rows is what makes phi a quantile, not an extreme: one text's outliers do not move it."""
    import torch

    rmax = torch.sort(row_max.double()).values
    upper = torch.sort(phi_upper_bounds(row_max, row_min, guard_lo)).values
    lo_edge, hi_edge = float(rmax[0]) - guard_hi - 1.0, float(upper[-1]) + 1.0
    candidates = torch.arange(lo_edge, hi_edge + step, step, dtype=torch.float64)
    n = rmax.numel()
    too_high = n - torch.searchsorted(rmax, candidates + guard_hi, right=True)
    too_low = torch.searchsorted(upper, candidates, right=False)
    cost = too_high + too_low  # an upper bound of the rows outside (a row may break both)
    best = max(int(cost.min()), int(ignored_fraction * n))
    best_idx = torch.nonzero(cost <= best).flatten()
    runs = torch.split(best_idx, torch.diff(best_idx, prepend=best_idx[:1] - 1).ne(1).cumsum(0).bincount().tolist())
    longest = max(runs, key=len)
    a, b = float(candidates[longest[0]]), float(candidates[longest[-1]])
    margin = min(10.0, (b - a) / 4)
    target = float(row_max.double().median())
    return round(min(max(target, a + margin), b - margin), 4)


def guard_margins(row_max, row_min, phi: float, guard_lo: float = GUARD_LO, guard_hi: float = GUARD_HI) -> dict:
    """How far the rows' extremes stay inside the guard at phi (nats; negative: some rows fall back): above, the
    window's top minus the largest row max; below, the smallest room any row has before the low side flags it."""
    return {"hi": round(phi + guard_hi - float(row_max.max()), 3),
            "lo": round(float(phi_upper_bounds(row_max, row_min, guard_lo).min()) - phi, 3)}


def layer_verdict(row_max, row_min, phi: float, budget: float = FALLBACK_BUDGET) -> str:
    """"unified" when phi keeps the layer's fallback within the budget, else "synchronized" (no phi covers it)."""
    return "unified" if fallback_rows(row_max, row_min, phi, GUARD_LO, GUARD_HI) <= budget * row_max.numel() \
        else "synchronized"


def summarize_layer(i, cal: LayerStats, held: LayerStats | None, phi: float, budget: float = FALLBACK_BUDGET) -> dict:
    import torch

    rmax, rmin, heads = cal.arrays()
    cal_fallback = fallback_rows(rmax, rmin, phi, GUARD_LO, GUARD_HI)
    entry = {"layer": i, "phi": phi, "guard_lo": GUARD_LO, "guard_hi": GUARD_HI,
             "softmax": layer_verdict(rmax, rmin, phi, budget),
             "calibration_rows": int(rmax.numel()),
             "calibration_fallback_rows_decode": cal_fallback,
             "calibration_fallback_rate_decode": cal_fallback / max(int(rmax.numel()), 1),
             "calibration_fallback_rows_prefill": cal.prefill_fallback}
    q = torch.tensor([0.0001, 0.01, 0.5, 0.99, 0.9999], dtype=torch.float64)
    entry["row_max_quantiles"] = dict(zip(["0.01%", "1%", "50%", "99%", "99.99%"],
                                          [round(v, 3) for v in torch.quantile(rmax.double(), q).tolist()]))
    entry["row_min_quantiles"] = dict(zip(["0.01%", "1%", "50%", "99%", "99.99%"],
                                          [round(v, 3) for v in torch.quantile(rmin.double(), q).tolist()]))
    entry["row_max_median_per_head"] = [round(float(rmax[heads == h].median()), 3) for h in range(int(heads.max()) + 1)]
    if held is not None:
        hmax, hmin, _ = held.arrays()
        entry["heldout_rows"] = int(hmax.numel())
        entry["heldout_fallback_rows_decode"] = fallback_rows(hmax, hmin, phi, GUARD_LO, GUARD_HI)
        entry["heldout_fallback_rate_decode"] = entry["heldout_fallback_rows_decode"] / max(int(hmax.numel()), 1)
        entry["heldout_fallback_rows_prefill"] = held.prefill_fallback
        entry["heldout_guard_margins"] = guard_margins(hmax, hmin, phi)
    return entry


# --- outputs --------------------------------------------------------------------------------------------------------

def plot_histogram(cal: list[LayerStats], layers: list[dict], model_name: str, path: Path) -> None:
    """Figure 5 style: the distribution of softmax inputs over all layers (log counts) with the range that holds
    99.99% of them, and per layer the spread of row maxima against the chosen phi and its windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    hist = sum(s.hist for s in cal)
    edges = torch.linspace(HIST_RANGE[0], HIST_RANGE[1], HIST_BINS + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    cdf = torch.cumsum(hist, 0) / hist.sum()
    lo = float(centers[int(torch.searchsorted(cdf, torch.tensor(0.00005)))])
    hi = float(centers[min(int(torch.searchsorted(cdf, torch.tensor(0.99995))), HIST_BINS - 1)])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    ax1.bar(centers.numpy(), hist.numpy(), width=float(edges[1] - edges[0]), color="tab:blue")
    ax1.set_yscale("log")
    ax1.axvspan(lo, hi, color="tab:orange", alpha=0.15, label=f"99.99% of scores in [{lo:.1f}, {hi:.1f}]")
    ax1.set_xlabel("scaled attention score s (softmax input)")
    ax1.set_ylabel("count")
    ax1.set_title(f"{model_name}: softmax inputs, all layers")
    ax1.legend(fontsize=8)
    xs = [entry["layer"] for entry in layers]
    q = [entry["row_max_quantiles"] for entry in layers]
    ax2.fill_between(xs, [v["0.01%"] for v in q], [v["99.99%"] for v in q], alpha=0.25, label="row max, 0.01-99.99%")
    ax2.plot(xs, [v["50%"] for v in q], color="tab:blue", label="row max, median")
    ax2.fill_between(xs, [v["0.01%"] for v in (e["row_min_quantiles"] for e in layers)],
                     [v["0.01%"] for v in q], alpha=0.12, color="tab:gray", label="row min (0.01%) .. row max (0.01%)")
    phis = [entry["phi"] for entry in layers]
    ax2.plot(xs, phis, color="black", marker=".", label="phi (decode's unified max)")
    synchronized = [e["layer"] for e in layers if e.get("softmax") == "synchronized"]
    if synchronized:
        ax2.scatter(synchronized, [e["phi"] for e in layers if e["layer"] in synchronized], color="tab:red",
                    marker="x", zorder=3, label="synchronized (no phi within the budget)")
    ax2.set_xlabel("layer")
    ax2.set_ylabel("score")
    ax2.set_title("row maxima per layer and the unified max phi")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")  # not from the name: it may be a temporary one
    plt.close(fig)


def load_apply_target(model_path: Path, output: Path):
    """The rewritten graph --apply will update (structure only) and its attention nodes; checked before the long
    calibration run so that a wrong --apply fails at once."""
    import onnx

    if not model_path.is_file():
        raise FdppError(f"--apply: {model_path} does not exist; rewrite the model first")
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf/IO errors of many kinds: all mean "not a usable model"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise FdppError(f"--apply: cannot load {model_path}: {first}; re-run rewrite") from exc
    nodes = [n for n in model.graph.node if n.domain == "fdpp" and n.op_type == "AsyncSoftmaxAttention"]
    if not nodes:
        raise FdppError(f"--apply: {model_path} has no fdpp::AsyncSoftmaxAttention nodes; pass a rewritten model "
                        "(python -m fdpp_rewrite rewrite)")
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    if external and output.resolve().parent != model_path.resolve().parent:
        raise FdppError("--apply-output must be in the same folder as a model with external data (it refers to it)")
    return model, nodes


def apply_to_graph(calibration: dict, model_path: Path, output: Path) -> int:
    """Sets phi / guard_lo / guard_hi on the fdpp::AsyncSoftmaxAttention nodes of a rewritten graph, the k-th node
    in graph order taking layer k. Returns the number of nodes set."""
    import onnx
    from onnx import helper

    model, nodes = load_apply_target(model_path, output)
    layers = sorted(calibration["layers"], key=lambda e: e["layer"])
    if len(nodes) != len(layers):
        raise FdppError(f"--apply: {model_path} has {len(nodes)} AsyncSoftmaxAttention nodes but the calibration has "
                        f"{len(layers)} layers; calibrate the same model (or its --num-layers)")
    for node, entry in zip(nodes, layers):
        values = {"phi": entry["phi"], "guard_lo": entry["guard_lo"], "guard_hi": entry["guard_hi"]}
        kept = [a for a in node.attribute if a.name not in values and a.name != "softmax"]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(k, float(v)) for k, v in values.items()])
        if entry.get("softmax", "unified") != "unified":  # unified is the default: such nodes stay as they were
            node.attribute.append(helper.make_attribute("softmax", entry["softmax"]))
    meta = {p.key: p for p in model.metadata_props}
    if "fdpp.rewrite.calibration" in meta:
        meta["fdpp.rewrite.calibration"].value = calibration.get("source", "fdpp_rewrite calibrate")
    onnx.save(model, str(output))
    return len(nodes)


def save_heldout_qkv(loaded, ids: list[int], path: Path) -> None:
    """One held-out prompt through the reference model, keeping every layer's q (after RoPE), k and v in float16:
    the real inputs of the attention kernels for the GPU fallback check."""
    import torch

    from fdpp_rewrite.models.reference import ReferenceModel

    class Capturing(ReferenceModel):
        def _attention(self, i, h, positions, angles, mask, cache, score_hook):
            c = self.config
            batch, seq, _ = h.shape
            q = self._linear(h, f"layers.{i}.attn.q").view(batch, seq, c.num_heads, c.head_dim).transpose(1, 2)
            self.queries[i] = self._rotate(q, angles) if angles is not None else q
            return super()._attention(i, h, positions, angles, mask, cache, score_hook)

    model = Capturing(loaded.config, loaded.weights)
    model.queries = {}
    caches = model.new_caches(1, len(ids))
    model.forward(torch.tensor([ids]), torch.zeros(1, dtype=torch.int64), caches)
    c = loaded.config
    torch.save({"model": loaded.source, "tokens": len(ids), "scale": c.head_dim ** -0.5,
                "num_heads": c.num_heads, "num_kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
                "q": [model.queries[i].half().contiguous() for i in range(c.num_layers)],
                "k": [caches[i][0].half().contiguous() for i in range(c.num_layers)],
                "v": [caches[i][1].half().contiguous() for i in range(c.num_layers)]}, path)


def calibration_text(spec: str | None, tokenizer):
    """--text (fdpp_rewrite.text.load_text, chats through the model's chat template where it has one), or KJV."""
    from fdpp_rewrite.text import kjv_text, load_text

    if spec is None:
        return kjv_text()
    template = None
    if getattr(tokenizer, "chat_template", None):
        template = lambda messages: tokenizer.apply_chat_template(messages, add_generation_prompt=False)  # noqa: E731
    return load_text(spec, template)


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


class ByteTokens:
    """The tokenizer of a model without one (random-init test presets): each UTF-8 byte is a token, modulo the
    vocabulary, so that test models can be calibrated on real text."""

    chat_template = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode()]


# The longest prompt the engine prefills in one pass (runtime.MAX_PREFILL_CHUNK; longer ones run as chunks whose
# past the collection would mis-slice).
MAX_ENGINE_PROMPT = 8192


def calibration_device(choice: str) -> str:
    """--device: auto is cuda where torch sees a GPU and the plugin library loads, else cpu."""
    import torch

    if choice == "cuda":
        from fdpp_rewrite.errors import require_gpu

        require_gpu("calibrate --device cuda")
        return "cuda"
    if choice == "auto" and torch.cuda.is_available():
        from fdpp_rewrite.gpu.device import library_facts

        return "cuda" if library_facts() is not None else "cpu"
    return "cpu"


def collect_with_reference(loaded, chunk_sets: dict) -> dict:
    """{name: ScoreCollector} of each {name: prompts} from the CPU reference model."""
    from fdpp_rewrite.models.reference import ReferenceModel

    model = ReferenceModel(loaded.config, loaded.weights)
    collectors = {}
    for name, chunks in chunk_sets.items():
        collectors[name] = ScoreCollector(loaded.config.num_layers)
        run_model(model, chunks, collectors[name], name)
    return collectors


def collect_with_engine(source: str, backend: str, chunk_sets: dict, chunk: int, num_layers: int,
                        engine_dir: Path | None = None) -> dict:
    """{name: ScoreCollector} of each {name: prompts} from the engine running the model's rewritten graph
    (fdpp_rewrite.engine.calibration; one export and engine build for all, or engine_dir, the user's)."""
    from fdpp_rewrite.engine.calibration import EngineCollector

    engine = EngineCollector(source, backend, max_prompt=max(chunk, 2), num_layers=num_layers, engine=engine_dir)
    collectors = {}
    try:
        if num_layers is not None and engine.engine.num_layers != num_layers:
            raise FdppError(f"engine {engine_dir} has {engine.engine.num_layers} layers, {source} has {num_layers}: "
                            "pass the engine built from this model")
        for name, chunks in chunk_sets.items():
            collectors[name] = ScoreCollector(engine.engine.num_layers)
            engine.run(chunks, collectors[name], name)
    finally:
        engine.close()
    return collectors


def collect(device: str, source: str, loaded, chunk_sets: dict, chunk: int, engine_dir: Path | None = None) -> dict:
    """{name: ScoreCollector}: through the engine on cuda (or any backend with engine_dir), through the reference
    model on the cpu."""
    if device == "cuda" or engine_dir is not None:
        return collect_with_engine(source, device, chunk_sets, chunk, loaded.config.num_layers, engine_dir)
    return collect_with_reference(loaded, chunk_sets)


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
                f"{low_guard_tail():g}; fp16 prefill (anchored): iff max(s) - max(s over the row's first-processed "
                "tiles) > 11; a layer over the fallback budget is softmax=synchronized",
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
