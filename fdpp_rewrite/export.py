"""`python -m fdpp_rewrite export <preset | checkpoint dir | file.gguf> -o model.onnx`

Writes three files beside each other:
    model.onnx         the graph (standard ops, opset 17); weights live in
    model.onnx.data    one external data file, streamed layer by layer (tensors 4096-byte aligned)
    model.fdpp.json    what the graph was made from: source, preset, dtype, cache length, config, origin,
                       and the tokenizer (model.tokenizer.json) when the source has one

All are written under temporary names and renamed when complete (fdpp_rewrite.atomic): an export that fails, is
interrupted or killed leaves no file with these names.
"""

import datetime
import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from fdpp_rewrite.atomic import AtomicOutputs, existing_folder, rename_external_data
from fdpp_rewrite.cli_args import add_force
from fdpp_rewrite.dtypes import NAMES, itemsize
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.models import PRESETS, check_source
from fdpp_rewrite.progress import Progress

METADATA_SCHEMA = "fdpp-export/1"
DEFAULT_MAX_CACHE = 2048


def add_arguments(parser):
    parser.add_argument("source", help=f"a preset ({', '.join(PRESETS)}), a Hugging Face checkpoint directory "
                                       "(config.json + *.safetensors, tokenizer.json optional) or a llama or "
                                       "gemma3 .gguf file")
    parser.add_argument("-o", "--output", type=Path,
                        help="the .onnx file to write (default: engines/<name>/model.onnx)")
    parser.add_argument("--dtype", choices=NAMES, default="float16",
                        help="weight and activation dtype (default: float16, the GPU target; bfloat16 for the GPU "
                             "when activations outgrow float16's 65504, e.g. gemma3; float32 for the CPU)")
    parser.add_argument("--max-cache", type=int, default=None,
                        help=f"KV cache length, a static input dimension (default: {DEFAULT_MAX_CACHE} or the model's "
                             "position limit if smaller; 0: a dynamic dimension)")
    parser.add_argument("--max-position", type=int, help="raise the model's position limit (RoPE models) to time "
                        "long contexts with random weights; a trained model is untested past its own limit "
                        "(default: the model's own)")
    parser.add_argument("--layers", type=int, help="keep only the first N layers, 1 up to the model's own count "
                                                   "(for tests; default: all of them)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random init (presets without weights)")
    parser.add_argument("--random-init", action="store_true",
                        help="random weights even for a preset whose trained weights are installed "
                             "(smollm2-135m, gemma3-270m)")
    add_force(parser, "existing output files")


@dataclass
class ExportResult:
    onnx_path: Path
    data_path: Path
    metadata_path: Path
    num_params: int
    total_bytes: int
    origin: str
    seconds: float


def companion_paths(onnx_path: Path) -> tuple[Path, Path, Path]:
    """(external data, metadata, tokenizer) file paths that belong to an exported model."""
    onnx_path = Path(onnx_path)
    stem = onnx_path.name[:-5] if onnx_path.name.endswith(".onnx") else onnx_path.name
    return (onnx_path.with_name(onnx_path.name + ".data"), onnx_path.with_name(stem + ".fdpp.json"),
            onnx_path.with_name(stem + ".tokenizer.json"))


def default_output(source: str) -> Path:
    name = Path(source).stem if Path(source).suffix else Path(source).name
    return Path("engines") / (name or "model") / "model.onnx"


def export_model(source: str, output: Path, *, dtype: str = "float16", max_cache: int | None = None,
                 num_layers: int | None = None, seed: int = 0, random_init: bool = False, force: bool = False,
                 progress: bool | Progress = True, command: str | None = None,
                 max_position: int | None = None) -> ExportResult:
    """Export `source` to `output` (see the module docstring). max_cache: the static cache length; None: 2048
    or the model's position limit if smaller; 0: a symbolic (dynamic) cache length.

    Everything is checked before the work starts; the files are written under temporary names and renamed
    when all are complete (fdpp_rewrite.atomic), so a failed or killed export leaves none of them behind."""
    started = time.perf_counter()
    progress = progress if isinstance(progress, Progress) else Progress(enabled=progress)
    output = Path(output)
    if output.suffix != ".onnx":
        raise FdppError(f"output {output} must end in .onnx")
    if max_cache is not None and max_cache < 0:
        raise FdppError(f"--max-cache must be positive (or 0 for a dynamic length), got {max_cache}")
    data_path, metadata_path, tokenizer_path = companion_paths(output)
    outputs = AtomicOutputs([data_path, tokenizer_path, metadata_path, output], force=force)
    outputs.check()
    check_source(str(source))

    from fdpp_rewrite.models import load_model

    with progress.stage("load model"):
        model = load_model(source, dtype=dtype, num_layers=num_layers, seed=seed, random_init=random_init)
    config = model.config
    if max_position is not None:
        if config.learned_positions:
            raise FdppError(f"--max-position: {source} has a learned position table of {config.max_position} rows; "
                            "it cannot be raised (only RoPE models can)")
        if max_position < config.max_position:
            raise FdppError(f"--max-position {max_position} is below the model's {config.max_position}; pass a larger "
                            "value or leave it out")
        config = model.config = replace(config, max_position=max_position)
    if max_cache is None:
        max_cache = min(DEFAULT_MAX_CACHE, config.max_position)
    reason = config.position_limit_reason()
    if max_cache and max_cache > config.max_position:
        raise FdppError(f"--max-cache {max_cache} exceeds the {config.max_position} positions this model supports"
                        f"{f' ({reason})' if reason else ''}; pass --max-cache {config.max_position} or less")
    if not max_cache and config.window_unmasked:
        raise FdppError(f"a dynamic cache length (--max-cache 0) could outgrow {config.family}'s sliding window of "
                        f"{config.sliding_window} tokens, which the exported graph does not mask; "
                        f"pass --max-cache {config.max_position} or less")
    _check_disk_space(output.parent, config, dtype)

    import onnx

    from fdpp_rewrite.onnx_builder import build_decoder
    from fdpp_rewrite.onnx_graph import ExternalDataWriter

    with outputs:
        data_temp = outputs.temp(data_path)
        external = ExternalDataWriter(data_temp)
        try:
            with progress.stage("export layers", total=config.num_layers, unit="layer") as stage:
                proto, num_params = build_decoder(config, model.weights, dtype, max_cache or None, external,
                                                  on_layer=stage.update)
        finally:
            external.close()
        rename_external_data(proto, data_temp.name, data_path.name)
        _add_metadata_props(proto, model, dtype, max_cache)
        with progress.stage("write model"):
            onnx.save_model(proto, str(outputs.temp(output)))
            tokenizer_fields = None
            if model.tokenizer is not None:
                tokenizer_fields = model.tokenizer.save(outputs.temp(tokenizer_path), file_name=tokenizer_path.name)
            metadata = {
                "schema": METADATA_SCHEMA, "source": model.source, "preset": model.preset, "dtype": dtype,
                "max_cache": max_cache or None, "num_layers": config.num_layers, "origin": model.origin,
                "parameters": num_params, "data_file": data_path.name, "tokenizer": tokenizer_fields,
                "config": config.to_dict(), "created": datetime.datetime.now().isoformat(timespec="seconds"),
                "command": command,
            }
            outputs.temp(metadata_path).write_text(json.dumps(metadata, indent=2) + "\n")
    total = output.stat().st_size + data_path.stat().st_size
    return ExportResult(output, data_path, metadata_path, num_params, total, model.origin,
                        time.perf_counter() - started)


def _add_metadata_props(proto, model, dtype, max_cache):
    props = {"fdpp.config": json.dumps(model.config.to_dict()), "fdpp.source": model.source,
             "fdpp.origin": model.origin, "fdpp.dtype": dtype, "fdpp.max_cache": str(max_cache or "dynamic")}
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value


def _check_disk_space(directory: Path, config, dtype: str):
    from fdpp_rewrite.models.names import parameter_count

    extra = config.vocab_size * config.hidden_size if config.tie_embeddings else 0  # the lm_head copy
    needed = (parameter_count(config) + extra) * itemsize(dtype)  # every weight in the model dtype
    free = shutil.disk_usage(existing_folder(directory)).free
    if needed > free:
        raise FdppError(f"the export needs {_size(needed)} and {existing_folder(directory)} has {_size(free)} free; "
                        "free space or choose another -o")


def read_metadata(onnx_path: Path) -> dict:
    """The model.fdpp.json written beside an exported model. For a rewritten model (model.fdpp.onnx) that has
    none of its own, the metadata of the model it was rewritten from (model.onnx) is used."""
    onnx_path = Path(onnx_path)
    _, metadata_path, _ = companion_paths(onnx_path)
    if not metadata_path.is_file() and onnx_path.name.endswith(".fdpp.onnx"):
        _, original, _ = companion_paths(onnx_path.with_name(onnx_path.name[: -len(".fdpp.onnx")] + ".onnx"))
        metadata_path = original if original.is_file() else metadata_path
    if not metadata_path.is_file():
        raise FdppError(f"{metadata_path} is missing: {onnx_path} was not written by `fdpp_rewrite export` "
                        "(pass --tokenizer to name the tokenizer source)")
    try:
        metadata = json.loads(metadata_path.read_text())
    except json.JSONDecodeError as exc:
        raise FdppError(f"{metadata_path} is not valid JSON ({exc}); re-export the model") from None
    if metadata.get("schema") != METADATA_SCHEMA:
        raise FdppError(f"{metadata_path} has schema {metadata.get('schema')!r}, expected {METADATA_SCHEMA}")
    metadata["_directory"] = str(metadata_path.parent)
    return metadata


def _size(num_bytes: int) -> str:
    """e.g. 1.73 GiB, 3.3 MiB, 12 KiB"""
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.2f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB" if num_bytes >= 2**20 else f"{num_bytes / 2**10:.0f} KiB"


def _command_line(args, output: Path) -> str:
    parts = ["python -m fdpp_rewrite export", args.source, "-o", str(output), "--dtype", args.dtype,
             "--seed", str(args.seed)]
    if args.max_cache is not None:
        parts += ["--max-cache", str(args.max_cache)]
    if args.layers:
        parts += ["--layers", str(args.layers)]
    if args.max_position:
        parts += ["--max-position", str(args.max_position)]
    if args.random_init:
        parts.append("--random-init")
    return " ".join(parts)


def run(args) -> int:
    output = args.output or default_output(args.source)
    result = export_model(args.source, output, dtype=args.dtype, max_cache=args.max_cache, num_layers=args.layers,
                          seed=args.seed, random_init=args.random_init, force=args.force,
                          command=_command_line(args, output), max_position=args.max_position)
    print(f"wrote {result.onnx_path} + {result.data_path.name} ({_size(result.total_bytes)}, "
          f"{result.num_params:,} parameters, {args.dtype}) in {result.seconds:.1f} s")
    print(f"weights: {result.origin}")
    print(f"metadata: {result.metadata_path}")
    return 0
