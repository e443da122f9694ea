"""A script of scripts/ imported as a module, for the tests of its functions (scripts/ is not a package)."""

import importlib.util

from fdpp_rewrite import REPO_ROOT


def load_script(name: str):
    """scripts/<name>.py as a module (its main() does not run)."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
