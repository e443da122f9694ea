"""`python -m fdpp_rewrite generate model.onnx --prompt "..." [--chat] [--max-new-tokens N]`

Greedy decoding through any session object with onnxruntime's `run(output_names, feeds)`: one prefill step
for the prompt, then one step per token, the updated KV caches fed back as the next step's inputs. The command
prints each token as soon as it is chosen, before the next one is computed."""

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fdpp_rewrite.errors import FdppError, cannot_load
from fdpp_rewrite.onnx_files import load_structure
from fdpp_rewrite.progress import Progress

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
                  stop_ids=(), on_token=None) -> list[int]:
    """The new token ids (stop token excluded) after greedy decoding from prompt_ids, batch 1. `on_token(id)` is
    called with each new token as soon as it is chosen, before the next step runs."""
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
        if on_token is not None:
            on_token(next_id)
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
                 system: str | None = None, layout: CacheLayout | None = None, on_token=None) -> list[int]:
    """Like generate(), but the new token ids (what `generate` decodes); `on_token` as in greedy_decode."""
    layout = layout or CacheLayout.from_session(session)
    stop_ids = {tokenizer.eos_id} if tokenizer.eos_id is not None else set()
    return greedy_decode(session, prompt_ids(tokenizer, prompt, chat=chat, system=system), max_new_tokens, layout,
                         stop_ids, on_token)


def prompt_ids(tokenizer, prompt: str, *, chat: bool = False, system: str | None = None) -> list[int]:
    """The token ids the model reads: the prompt, or with chat=True the conversation in the chat template."""
    _check_system(chat, system)
    if chat:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return tokenizer.encode(prompt)


def _check_system(chat: bool, system: str | None) -> None:
    if system and not chat:
        raise FdppError("--system is a message for the chat template; add --chat or drop --system")


class TokenPrinter:
    """Prints the text of the tokens as they come (flushed at once). A character split over several byte-level
    tokens is held back until it is whole: e.g. "é" as two tokens decodes to "\ufffd" after the first.
    `lstrip`: drop the whitespace an answer starts with (a chat template's newline)."""

    def __init__(self, tokenizer, stream=None, lstrip: bool = False):
        self.tokenizer = tokenizer
        self.stream = stream or sys.stdout
        self.lstrip = lstrip
        self.ids: list[int] = []
        self.printed = 0  # characters of the decoded text already written
        self.first_at = None  # time.perf_counter() when the first token came

    def __call__(self, token_id: int) -> None:
        self.first_at = self.first_at or time.perf_counter()
        self.ids.append(token_id)
        text = self._text()
        if text.endswith("\ufffd"):
            return
        self.stream.write(text[self.printed:])
        self.stream.flush()
        self.printed = len(text)

    def finish(self) -> None:
        self.stream.write(self._text()[self.printed:] + "\n")
        self.stream.flush()

    def _text(self) -> str:
        text = self.tokenizer.decode(self.ids)
        return text.lstrip() if self.lstrip else text


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


def open_session(onnx_path, structure=None):
    """onnxruntime's session for an exported model, or the CPU reference session for a rewrite (fdpp ops).
    `structure`: the model already read without its weights (load_structure), to skip reading it again."""
    from fdpp_rewrite.quiet import quiet_onnxruntime, session_options

    path = Path(onnx_path)
    structure = structure if structure is not None else load_structure(path)
    ort = quiet_onnxruntime()
    if _has_fdpp_nodes(structure):  # fdpp ops: onnxruntime does not know them, the CPU reference ops run them
        from fdpp_rewrite.ref_session import make_reference_session

        return make_reference_session(path)
    try:
        return ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types for unreadable models
        raise cannot_load(path, exc) from None


def _has_fdpp_nodes(model) -> bool:
    return any(node.domain == "fdpp" for node in model.graph.node)


def _interface(structure) -> tuple[int | str | None, int | None]:
    """(cache length: an int, or a symbol for a dynamic one; vocabulary size) from the graph's declarations."""
    def dims(value):
        return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]

    inputs = {value.name: value for value in structure.graph.input}
    outputs = {value.name: value for value in structure.graph.output}
    if "key_cache.0" not in inputs or "logits" not in outputs:
        raise FdppError("the model has no key_cache.0 input or no logits output; generate runs models written by "
                        "`fdpp_rewrite export` (or their rewrites)")
    cache_dims, logits_dims = dims(inputs["key_cache.0"]), dims(outputs["logits"])
    cache = cache_dims[2] if len(cache_dims) == 4 else None
    vocab = logits_dims[-1] if logits_dims and isinstance(logits_dims[-1], int) and logits_dims[-1] > 0 else None
    return cache, vocab


def check_options(args) -> None:
    """Refuse options that are wrong whatever the model, before anything is read."""
    if args.max_new_tokens <= 0:
        raise FdppError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    _check_system(args.chat, args.system)


def check_max_cache(args, structure) -> int | None:
    """Refuse a --max-cache the model would ignore (its cache length is fixed) or needs and lacks (a dynamic
    one), before any work; returns the --max-cache to use."""
    cache, _ = _interface(structure)
    if isinstance(cache, int) and cache > 0:
        if args.max_cache is not None:
            raise FdppError(f"--max-cache applies to models exported with --max-cache 0; {args.model} has a fixed "
                            f"cache of {cache} tokens: drop --max-cache")
        return None
    if args.max_cache is None:
        raise FdppError(f"{args.model} has a dynamic cache length (exported with --max-cache 0); pass --max-cache N")
    if args.max_cache <= 0:
        raise FdppError(f"--max-cache must be positive, got {args.max_cache}")
    return args.max_cache


def check_prompt(ids: list[int], structure, model) -> None:
    """Every prompt token exists in the model's vocabulary (else the tokenizer is another model's)."""
    _, vocab = _interface(structure)
    beyond = [i for i in ids if vocab is not None and i >= vocab]
    if beyond:
        raise FdppError(f"the prompt has token id {max(beyond)}, beyond the vocabulary of {vocab} of {model}: the "
                        "tokenizer belongs to another model; pass --tokenizer with this model's own")


def add_arguments(parser):
    parser.add_argument("model", type=Path, help="an ONNX model written by `fdpp_rewrite export`, or its "
                                                      "rewrite (run on the CPU reference ops)")
    parser.add_argument("--prompt", required=True, help="the prompt (or, with --chat, the user message)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate at most")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--system", help="a system message for --chat (default: none)")
    parser.add_argument("--tokenizer", help="tokenizer source (preset, GGUF, checkpoint dir); "
                                            "default: the one saved beside the model")
    parser.add_argument("--max-cache", type=int, help="cache length, only for models exported with --max-cache 0 "
                                                      "(default: the model's fixed length)")


def run(args) -> int:
    progress = Progress()
    check_options(args)
    if not args.model.exists():
        raise FdppError(f"{args.model} does not exist; export a model first (python -m fdpp_rewrite export ...)")
    structure = load_structure(args.model)
    max_cache = check_max_cache(args, structure)
    with progress.stage("load tokenizer"):
        tokenizer = load_tokenizer_for(args.model, args.tokenizer)
        ids = prompt_ids(tokenizer, args.prompt, chat=args.chat, system=args.system)
    check_prompt(ids, structure, args.model)
    with progress.stage("load model"):
        session = open_session(args.model, structure)
        layout = CacheLayout.from_session(session, max_cache)
    del structure
    printer = TokenPrinter(tokenizer)
    started = time.perf_counter()
    stop_ids = {tokenizer.eos_id} if tokenizer.eos_id is not None else set()
    new_ids = greedy_decode(session, ids, args.max_new_tokens, layout, stop_ids, on_token=printer)
    seconds = time.perf_counter() - started
    printer.finish()
    backend = "CPU reference ops" if hasattr(session, "counters") else "onnxruntime CPU"
    first = f"; first token after {printer.first_at - started:.1f} s" if printer.first_at else ""
    print(f"[{len(new_ids)} tokens in {seconds:.1f} s, {len(new_ids) / seconds:.1f} tokens/s, {backend}{first}]")
    return 0
