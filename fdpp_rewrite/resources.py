"""Where the package's data files and the plugin library are, in a source checkout and in an installed wheel.

The canonical files live where the repository's layout puts them: the op contracts at
plugins/<Op>Plugin/contract.json, the GPU profiles at engines/profiles/*.json, the calibrations at
engines/calibration/*.json. A wheel carries copies of them under fdpp_rewrite/data/ with the same relative paths
(setup.py copies them at build time), so every lookup is `data_root() / <canonical relative path>`:

    data_root() / "plugins" / "FlatGemmPlugin" / "contract.json"
        checkout:  <repo>/plugins/FlatGemmPlugin/contract.json
        installed: <site-packages>/fdpp_rewrite/data/plugins/FlatGemmPlugin/contract.json
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PLUGIN_LIBRARY = "libfdpp_plugins.so"
# What the wheel carries under fdpp_rewrite/data/, as globs relative to the checkout root (setup.py reads them).
DATA_GLOBS = ("plugins/*Plugin/contract.json", "engines/profiles/*.json", "engines/calibration/*.json")


def _source_root() -> Path | None:
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() and (root / "plugins").is_dir() else None


# The repository root when the package runs from a source checkout (or an editable install of one), else None.
SOURCE_ROOT = _source_root()


def data_root() -> Path:
    """The folder the canonical relative paths resolve against: the checkout itself, or the installed copy."""
    if SOURCE_ROOT is not None:
        return SOURCE_ROOT
    return Path(str(resources.files("fdpp_rewrite") / "data"))


def contract_path(op: str) -> Path:
    return data_root() / "plugins" / f"{op}Plugin" / "contract.json"


def contract_ops() -> list[str]:
    """Ops that have a contract file, found by glob (a new plugin folder's contract is picked up as it is)."""
    return sorted(path.parent.name[: -len("Plugin")] for path in data_root().glob("plugins/*Plugin/contract.json"))


def profile_path(name: str) -> Path:
    """A committed GPU profile by file name, e.g. profile_path("h200.json")."""
    return data_root() / "engines" / "profiles" / name


def calibration_path(model: str) -> Path:
    """A committed calibration by model name, e.g. calibration_path("smollm2-135m")."""
    return data_root() / "engines" / "calibration" / f"{model}.json"


def display_path(path) -> str:
    """A data file as the repository names it (engines/profiles/h200.json), installed or not; other paths as given."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(data_root().resolve()))
    except ValueError:
        return str(path)


def engines_dir() -> Path:
    """Where commands write their outputs by default (new profiles, demo work folders): engines/ of the checkout,
    or ./engines of the current directory for an installed package (never inside site-packages)."""
    return (SOURCE_ROOT if SOURCE_ROOT is not None else Path.cwd()) / "engines"


def plugin_library_path() -> Path:
    """libfdpp_plugins.so: $FDPP_PLUGIN_LIB when set (an explicit choice wins), else fdpp_rewrite/lib/ next to the
    package when a copy was installed there, else build/ of the source checkout. The path may not exist; the
    loader says how to build it."""
    env = os.environ.get("FDPP_PLUGIN_LIB")
    if env:
        return Path(env)
    bundled = PACKAGE_DIR / "lib" / PLUGIN_LIBRARY
    if bundled.is_file() or SOURCE_ROOT is None:
        return bundled
    return SOURCE_ROOT / "build" / PLUGIN_LIBRARY
