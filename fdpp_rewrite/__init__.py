"""fdpp_rewrite: export LLMs to ONNX, swap attention and matmul subgraphs for FlashDecoding++ plugin nodes,
build and run engines. Start with `python -m fdpp_rewrite --help`."""

from pathlib import Path

__version__ = "0.1.0"

# The repository root: plugins/ (op contracts, the CUDA library's sources) and engines/ (profiles) live there.
REPO_ROOT = Path(__file__).resolve().parent.parent
