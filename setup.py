"""The wheel carries the op contracts, the committed GPU profiles and the calibrations as fdpp_rewrite/data/,
copied at build time from where the repository keeps them (docs/design.md's layout), at the same relative paths:
    plugins/FlatGemmPlugin/contract.json -> fdpp_rewrite/data/plugins/FlatGemmPlugin/contract.json
An editable install copies nothing: it reads the checkout (fdpp_rewrite.resources.data_root). The rest of the
package's metadata is in pyproject.toml."""

import glob
import importlib.util
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))


def _data_files() -> list:
    """Checkout-relative paths of the data files, by the globs in fdpp_rewrite/resources.py (loaded on its own:
    the package's dependencies need not be installed to build it)."""
    spec = importlib.util.spec_from_file_location("_fdpp_resources", os.path.join(HERE, "fdpp_rewrite", "resources.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    files = sorted({os.path.relpath(path, HERE) for pattern in module.DATA_GLOBS
                    for path in glob.glob(os.path.join(HERE, pattern))})
    if not any(path.endswith("contract.json") for path in files):
        raise SystemExit(f"no op contracts under {HERE}/plugins: build from a source checkout")
    return files


class build_py_with_data(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            data = os.path.join(self.build_lib, "fdpp_rewrite", "data")
            shutil.rmtree(data, ignore_errors=True)  # no file of an earlier build survives into this wheel
            for path in _data_files():
                target = os.path.join(self.build_lib, "fdpp_rewrite", "data", path)
                self.mkpath(os.path.dirname(target))
                self.copy_file(os.path.join(HERE, path), target)


class sdist_with_data(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for path in _data_files():  # so that a wheel built from the sdist finds them at the same paths
            target = os.path.join(base_dir, path)
            self.mkpath(os.path.dirname(target))
            self.copy_file(os.path.join(HERE, path), target)


# build/python: setuptools' scratch space, beside (not inside) the CMake build's files in build/
setup(cmdclass={"build_py": build_py_with_data, "sdist": sdist_with_data},
      options={"build": {"build_base": "build/python"}})
