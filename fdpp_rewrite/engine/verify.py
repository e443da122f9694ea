"""`verify ENGINE`: check an engine folder in full and say what was checked.

    python -m fdpp_rewrite verify engines/m

The manifest against its schema (types, ranges, max_seq within the model's positions), plan.json against its
schema and the manifest, the tokenizer file the manifest names, and weights.safetensors hashed in full against the
manifest's weights_sha256; each rank folder of a tensor-parallel engine in turn. The first problem is one
`error:` line, exit 2.

Loading an engine (run, bench, serve) checks the same, but skips the hash while the stamp of an earlier full check,
.weights.verified, still matches the weights file (engine/manifest.py); this command always hashes, and renews the
stamp.
"""

from __future__ import annotations

from pathlib import Path

from fdpp_rewrite.engine.manifest import PLAN, TOKENIZER, WEIGHTS, hash_weights, read_manifest, read_plan
from fdpp_rewrite.errors import FdppError

FAST_PATH = ("Loading an engine skips the weights hash while the stamp of an earlier full check "
             "(.weights.verified in the folder: the file's size, mtime, ctime, inode and sha256) still matches the "
             "weights file; any change to the file makes the next load hash it again. This command always hashes in "
             "full and renews the stamp.")


def add_arguments(parser) -> None:
    parser.add_argument("engine", type=Path, help="an engine folder written by `build`")
    parser.epilog = FAST_PATH


def verify_folder(folder: Path, manifest: dict) -> list[str]:
    """Check one folder that holds weights (an engine, or one rank of a tensor-parallel engine); returns what was
    checked, one line each."""
    plan = read_plan(folder, manifest)
    lines = [f"{folder / PLAN}: {len(plan['nodes'])} nodes, {len(plan['gemm_plans'])} GEMM plans, "
             f"{plan['num_layers']} layers, {plan['dtype']}"]
    tokenizer = manifest.get("tokenizer")
    if tokenizer:
        if not (folder / tokenizer["file"]).is_file():
            raise FdppError(f"{folder} lacks {tokenizer['file']}, which its manifest names; rebuild the engine")
        lines.append(f"{folder / tokenizer['file']}: present")
    elif (folder / TOKENIZER).is_file():
        lines.append(f"{folder / TOKENIZER}: present (not named by the manifest: unused)")
    size = (folder / WEIGHTS).stat().st_size
    digest = hash_weights(folder, manifest)
    lines.append(f"{folder / WEIGHTS}: {size} bytes, sha256 {digest} matches the manifest")
    return lines


def verify_engine(folder: Path) -> list[str]:
    """Check an engine folder in full (see the module docstring); returns what was checked, one line each."""
    from fdpp_rewrite.engine.tensor_parallel import rank_folder_name

    folder = Path(folder)
    manifest = read_manifest(folder)
    config = (manifest.get("model") or {}).get("config") or {}
    positions = f" of the model's {config['max_position']} positions" if config.get("max_position") else ""
    lines = [f"{folder / 'manifest.json'}: format {manifest['format_version']}, {manifest['backend']} backend, "
             f"{manifest['dtype']}, {manifest['num_layers']} layers, max batch {manifest['max_batch']}, max seq "
             f"{manifest['max_seq']}{positions}"]
    if not manifest.get("tensor_parallel"):
        return lines + verify_folder(folder, manifest)
    for rank in range(manifest["tensor_parallel"]):
        rank_path = folder / rank_folder_name(rank)
        lines += verify_folder(rank_path, read_manifest(rank_path))
    return lines


def run(args) -> int:
    for line in verify_engine(args.engine):
        print(line)
    print(f"verified {args.engine}")
    return 0
