"""Options that several commands take, declared once so they mean the same everywhere (one owner per option).

    add_force(parser, "the output")        --force: replace existing outputs
    add_engine_backend(parser)             --backend {cuda,cpu} for commands that load a built engine
    add_gemm_profile(parser)               --profile: where FlatGemm plans come from
"""

from __future__ import annotations

from pathlib import Path

ENGINE_BACKENDS = ("cuda", "cpu")  # what a built engine folder runs on


def add_force(parser, what: str = "existing outputs", otherwise: str = "refuse to overwrite") -> None:
    parser.add_argument("--force", action="store_true", help=f"replace {what} (default: {otherwise})")


def add_engine_backend(parser) -> None:
    parser.add_argument("--backend", choices=ENGINE_BACKENDS,
                        help="cuda (the GPU kernels) or cpu (the reference ops); default: the engine's own")


def add_gemm_profile(parser) -> None:
    parser.add_argument("--profile", type=Path, metavar="PROFILE_JSON",
                        help="GEMM profile whose M1/M2 and ImplB tiles every FlatGemm gets (default: the committed "
                             "profile of the GPU, engines/profiles/<gpu>.json, e.g. h200.json; rewrite stamps the "
                             "unprofiled default where it lacks a shape, a GPU build profiles such shapes itself)")


LOAD_KV_MEMORY_HELP = "run with a paged KV cache of this size (0.9 or 20GiB; default: the engine's own)"


def add_kv_memory(parser, text: str = LOAD_KV_MEMORY_HELP) -> None:
    """--kv-memory: a paged KV cache of this size, a fraction of the GPU memory free after the weights (0.9) or an
    amount (20GiB); `build` writes it into the engine, the loading commands (run, bench, serve) override it."""
    parser.add_argument("--kv-memory", metavar="X", help=text)
