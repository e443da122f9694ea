"""fdpp_rewrite: export LLMs to ONNX, swap attention and matmul subgraphs for FlashDecoding++ plugin nodes,
build and run engines. Start with `python -m fdpp_rewrite --help`."""

__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

# The source checkout's root, None in an installed package: for tests and development tools. Data files (contracts,
# profiles, calibrations) and the plugin library are found through fdpp_rewrite.resources, installed or not.
from fdpp_rewrite.resources import SOURCE_ROOT as REPO_ROOT  # noqa: E402

__all__ = ["REPO_ROOT", "__version__"]
