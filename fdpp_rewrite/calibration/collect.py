"""The scores calibrate reads: the text cut into prompts, each run through the model with a ScoreCollector
(calibration/stats.py) on every attention layer. On a GPU (--device cuda, or auto with a GPU and the plugin
library) the hook sits on the engine running the model's rewritten graph and sees the attention kernels' real inputs
(fdpp_rewrite/engine/calibration.py); on the CPU it sits in the reference model. Both give the same statistics.
A model without a tokenizer (a random-init test preset such as tiny-opt-wide) reads the text as UTF-8 bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from fdpp_rewrite.calibration.stats import ScoreCollector
from fdpp_rewrite.errors import FdppError

# The cost model behind the duration calibrate prints before the work: seconds per token and layer through the CPU
# reference model (its attention scores and statistics included) at the default --chunk, and on a GPU the export,
# rewrite and engine build first, then the prompts, whose cost is mostly the score statistics. Estimates to set
# expectations, not measurements of this machine.
CPU_SECONDS_PER_TOKEN_LAYER = 4e-4
GPU_SETUP_SECONDS, GPU_SECONDS_PER_TOKEN_LAYER = 60, 5e-6
DEVICES = ("auto", "cpu", "cuda")
# The longest prompt the engine prefills in one pass (runtime.MAX_PREFILL_CHUNK; longer ones run as chunks whose
# past the collection would mis-slice).
MAX_ENGINE_PROMPT = 8192


def expected_duration(tokens: int, num_layers: int, device: str = "cpu", engine_given: bool = False) -> str:
    """e.g. 24576 tokens through 30 layers on the cpu -> "about 5 min" (CPU_SECONDS_PER_TOKEN_LAYER); on cuda the
    export and build come first unless the user's engine is given."""
    if device == "cuda":
        setup = 0 if engine_given else GPU_SETUP_SECONDS
        seconds = setup + GPU_SECONDS_PER_TOKEN_LAYER * tokens * num_layers
    else:
        seconds = CPU_SECONDS_PER_TOKEN_LAYER * tokens * num_layers
    return f"about {seconds / 60:.0f} min" if seconds >= 90 else f"about {max(seconds, 1):.0f} s"


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


class ByteTokens:
    """The tokenizer of a model without one (random-init test presets): each UTF-8 byte is a token, modulo the
    vocabulary, so that test models can be calibrated on real text."""

    chat_template = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        return [b % self.vocab_size for b in text.encode()]


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
