"""`build --backend migraphx` on a machine without AMD MIGraphX: one `error:` line naming what to install, exit code
2, nothing written (fdpp_rewrite/engine/migraphx_build.py)."""

import importlib.util

import pytest
from cli_output import error_line

from fdpp_rewrite import cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("migraphx") is not None,
                                reason="MIGraphX is installed here: the missing-module error cannot happen")


def test_build_without_migraphx_names_what_to_install(tmp_path, capsys):
    out = tmp_path / "engine"
    code = cli.main(["build", str(tmp_path / "model.fdpp.onnx"), "-o", str(out), "--backend", "migraphx"])
    line = error_line(capsys.readouterr().err)
    assert code == 2
    assert "MIGraphX's Python module `migraphx`" in line and "install it" in line
    assert not out.exists()


def test_build_without_migraphx_still_refuses_to_overwrite_first(tmp_path, capsys):
    out = tmp_path / "engine"
    out.mkdir()
    code = cli.main(["build", str(tmp_path / "model.fdpp.onnx"), "-o", str(out), "--backend", "migraphx"])
    assert code == 2
    assert "pass --force" in error_line(capsys.readouterr().err)
