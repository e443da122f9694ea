"""`python -m fdpp_rewrite generate model.onnx --prompt "..." [--chat] [--max-new-tokens N]`

Greedy decoding through any session object with onnxruntime's `run(output_names, feeds)`: one prefill step
for the prompt, then one step per token, the updated KV caches fed back as the next step's inputs."""

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fdpp_rewrite.errors import FdppError, cannot_load

ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
              "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(double)": np.float64}
CACHE_TYPES = ("tensor(float)", "tensor(float16)")  # what the exporter's KV caches can be


@dataclass(frozen=True)
class CacheLayout:
    """Shapes of the KV cache inputs: key_cache.i / value_cache.i [batch, num_kv_heads, max_cache, head_dim]."""
    num_layers: int
    num_kv_heads: int
    max_cache: int
    head_dim: int
    dtype: type

    @classmethod
    def from_session(cls, session, max_cache: int | None = None) -> "CacheLayout":
        """Read the layout from the session's declared inputs (`get_inputs()`, as onnxruntime has it).
        `max_cache` is required when the cache length is a dynamic dimension."""
        if not hasattr(session, "get_inputs"):
            raise FdppError("this session has no get_inputs(); pass layout=CacheLayout.from_metadata(...)")
        caches = {i.name: i for i in session.get_inputs() if i.name.startswith("key_cache.")}
        if not caches:
            raise FdppError("the model has no key_cache.* inputs; was it written by `fdpp_rewrite export`?")
        first = caches["key_cache.0"]
        _, kv_heads, length, head_dim = first.shape
        if not isinstance(length, int):
            if not max_cache:
                raise FdppError("the model's cache length is dynamic; pass --max-cache N")
            length = max_cache
        if first.type not in CACHE_TYPES:
            raise FdppError(f"unsupported cache type {first.type}")
        return cls(len(caches), kv_heads, length, head_dim, ORT_DTYPES[first.type])

    @classmethod
    def from_metadata(cls, metadata: dict, max_cache: int | None = None) -> "CacheLayout":
        """From the model.fdpp.json the exporter writes."""
        config = metadata["config"]
        length = metadata.get("max_cache") or max_cache
        if not length:
            raise FdppError("the model's cache length is dynamic; pass --max-cache N")
        return cls(config["num_layers"], config["num_kv_heads"], length, config["head_dim"],
                   np.float16 if metadata["dtype"] == "float16" else np.float32)

    def empty_caches(self, batch: int) -> dict[str, np.ndarray]:
        shape = (batch, self.num_kv_heads, self.max_cache, self.head_dim)
        caches = {}
        for i in range(self.num_layers):
            caches[f"key_cache.{i}"] = np.zeros(shape, self.dtype)
            caches[f"value_cache.{i}"] = np.zeros(shape, self.dtype)
        return caches

    def output_names(self) -> list[str]:
        names = ["logits"]
        for i in range(self.num_layers):
            names += [f"key_cache_out.{i}", f"value_cache_out.{i}"]
        return names


def greedy_decode(session, prompt_ids: list[int], max_new_tokens: int, layout: CacheLayout,
                  stop_ids=()) -> list[int]:
    """The new token ids (stop token excluded) after greedy decoding from prompt_ids, batch 1."""
    if not prompt_ids:
        raise FdppError("the prompt is empty after tokenization; pass a non-empty --prompt")
    if len(prompt_ids) + max_new_tokens > layout.max_cache:
        raise FdppError(f"prompt ({len(prompt_ids)} tokens) + {max_new_tokens} new tokens exceed the model's cache "
                        f"of {layout.max_cache}; shorten the prompt or lower --max-new-tokens")
    caches = layout.empty_caches(1)
    names = layout.output_names()
    step_ids = np.array([prompt_ids], dtype=np.int64)
    past = 0
    generated = []
    for _ in range(max_new_tokens):
        outputs = session.run(names, {"input_ids": step_ids, "past_len": np.array([past], np.int64), **caches})
        next_id = int(np.argmax(outputs[0][0, -1]))
        for k in range(layout.num_layers):  # the updated caches are the next step's inputs
            caches[f"key_cache.{k}"] = outputs[1 + 2 * k]
            caches[f"value_cache.{k}"] = outputs[2 + 2 * k]
        past += step_ids.shape[1]
        if next_id in stop_ids:
            break
        generated.append(next_id)
        step_ids = np.array([[next_id]], dtype=np.int64)
    return generated


def generate(session, tokenizer, prompt: str, max_new_tokens: int = 32, *, chat: bool = False,
             system: str | None = None, layout: CacheLayout | None = None) -> str:
    """The greedy continuation of `prompt` (or, with chat=True, the assistant's answer to it, rendered through
    the tokenizer's chat template). `session` is anything with `run(output_names, feeds)`; without `layout`
    it must also have onnxruntime's `get_inputs()`."""
    return tokenizer.decode(generate_ids(session, tokenizer, prompt, max_new_tokens, chat=chat, system=system,
                                         layout=layout))


def generate_ids(session, tokenizer, prompt: str, max_new_tokens: int = 32, *, chat: bool = False,
                 system: str | None = None, layout: CacheLayout | None = None) -> list[int]:
    """Like generate(), but the new token ids (what `generate` decodes)."""
    layout = layout or CacheLayout.from_session(session)
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    else:
        text = prompt
    stop_ids = {tokenizer.eos_id} if tokenizer.eos_id is not None else set()
    return greedy_decode(session, tokenizer.encode(text), max_new_tokens, layout, stop_ids)


def load_tokenizer_for(onnx_path, source: str | None = None):
    """The tokenizer of an exported model: from `source` (preset, GGUF file or checkpoint directory) when
    given, else from the files the exporter wrote beside the model."""
    if source:
        from fdpp_rewrite.models import load_model

        tokenizer = load_model(source).tokenizer
        if tokenizer is None:
            raise FdppError(f"{source} has no tokenizer (random-init presets have none); "
                            "pass --tokenizer with a GGUF file or a checkpoint directory with tokenizer.json")
        return tokenizer
    from fdpp_rewrite.export import read_metadata
    from fdpp_rewrite.tokenizer import Tokenizer

    metadata = read_metadata(Path(onnx_path))
    if not metadata.get("tokenizer"):
        raise FdppError(f"{onnx_path} was exported from {metadata.get('source')}, which has no tokenizer; "
                        "pass --tokenizer <GGUF file or checkpoint directory>")
    return Tokenizer.load(Path(metadata["_directory"]), metadata["tokenizer"])


def open_session(onnx_path):
    import onnxruntime as ort

    path = Path(onnx_path)
    if not path.is_file():
        raise FdppError(f"{path} does not exist; export a model first (python -m fdpp_rewrite export ...)")
    if is_rewritten(path):  # fdpp ops: onnxruntime does not know them, the CPU reference ops run them
        from fdpp_rewrite.ref_ops import make_reference_session

        return make_reference_session(path)
    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for unreadable models
        raise cannot_load(path, exc) from None


def is_rewritten(path: Path) -> bool:
    """Whether the model at `path` has fdpp nodes (written by `fdpp_rewrite rewrite`)."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf/IO errors of many kinds: all mean "not a usable model"
        raise cannot_load(path, exc) from None
    return any(node.domain == "fdpp" for node in model.graph.node)


def add_arguments(parser):
    parser.add_argument("model", type=Path, help="an ONNX model written by `fdpp_rewrite export`, or its "
                                                      "rewrite (run on the CPU reference ops)")
    parser.add_argument("--prompt", required=True, help="the prompt (or, with --chat, the user message)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--system", help="a system message for --chat")
    parser.add_argument("--tokenizer", help="tokenizer source (preset, GGUF, checkpoint dir); "
                                            "default: the one saved beside the model")
    parser.add_argument("--max-cache", type=int, help="cache length for models exported with --max-cache 0")


def run(args) -> int:
    if args.max_new_tokens <= 0:
        raise FdppError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    if not args.model.is_file():
        raise FdppError(f"{args.model} does not exist; export a model first (python -m fdpp_rewrite export ...)")
    tokenizer = load_tokenizer_for(args.model, args.tokenizer)
    session = open_session(args.model)
    layout = CacheLayout.from_session(session, args.max_cache)
    started = time.perf_counter()
    new_ids = generate_ids(session, tokenizer, args.prompt, args.max_new_tokens, chat=args.chat,
                           system=args.system, layout=layout)
    seconds = time.perf_counter() - started
    print(tokenizer.decode(new_ids))
    backend = "CPU reference ops" if hasattr(session, "counters") else "onnxruntime CPU"
    print(f"[{len(new_ids)} tokens in {seconds:.1f} s, {len(new_ids) / seconds:.1f} tokens/s, {backend}]")
    return 0
