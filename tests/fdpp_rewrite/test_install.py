"""The package as a user installs it: the wheel carries the contracts, profiles and calibrations, declares its
dependencies and the `fdpp` script, and works from a fresh venv in another directory (export, rewrite,
build --backend cpu, run); the installed rewrite reads the packaged engines/profiles/h200.json where it covers the
shapes, and the cuda build's plan resolution (fdpp_rewrite.gemm_plans) finds the packaged H200 profile for a
device named "NVIDIA H200", with no GPU; plus the lookups of fdpp_rewrite.resources in this checkout.

Dependencies come from this interpreter (venv --system-site-packages, pip --no-index --no-deps). The wheel is
built from a copy of the checkout's files (tracked and new, not ignored), so that no build output of an earlier
run (build/python) can slip into it."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import fdpp_rewrite
from fdpp_rewrite import resources
from fdpp_rewrite.contracts import OP_NAMES

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def run(args, cwd, env=None):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


# --- metadata ------------------------------------------------------------------------------------------------

def test_version_lives_in_the_package_only():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fdpp_rewrite.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", fdpp_rewrite.__version__)


def test_console_script_is_the_cli_main():
    from fdpp_rewrite import cli

    assert PYPROJECT["project"]["scripts"] == {"fdpp": "fdpp_rewrite.cli:main"} and callable(cli.main)


def test_requirements_txt_is_the_declared_dependencies():
    """CI installs requirements.txt; it must be pyproject's dependencies and extras, line for line."""
    project = PYPROJECT["project"]
    declared = set(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared |= set(extra)
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    listed = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert listed == declared


# --- resources in a checkout ---------------------------------------------------------------------------------

def test_checkout_reads_the_canonical_files():
    assert resources.SOURCE_ROOT == ROOT and resources.data_root() == ROOT
    assert set(OP_NAMES) <= set(resources.contract_ops())
    for op in resources.contract_ops():
        assert resources.contract_path(op) == ROOT / "plugins" / f"{op}Plugin" / "contract.json"
    assert resources.profile_path("h200.json").is_file()
    assert resources.calibration_path("smollm2-135m").is_file()
    assert resources.display_path(resources.profile_path("h200.json")) == "engines/profiles/h200.json"


def test_plugin_library_lookup(monkeypatch, tmp_path):
    monkeypatch.setenv("FDPP_PLUGIN_LIB", str(tmp_path / "mine.so"))
    assert resources.plugin_library_path() == tmp_path / "mine.so"  # an explicit choice wins
    monkeypatch.delenv("FDPP_PLUGIN_LIB")
    assert resources.plugin_library_path() == ROOT / "build" / "libfdpp_plugins.so"


# --- the wheel in a fresh venv -------------------------------------------------------------------------------

def _canonical_data_files() -> set:
    return {str(path.relative_to(ROOT)) for pattern in resources.DATA_GLOBS for path in ROOT.glob(pattern)}


def _copy_checkout(target: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel, and a venv that has it installed: {"wheel", "venv", "python", "fdpp", "work", "env"}."""
    if shutil.which("git") is None:
        pytest.skip("copies the checkout's files with git ls-files")
    tmp_path = tmp_path_factory.mktemp("install")
    source, dist = tmp_path / "src", tmp_path / "dist"
    _copy_checkout(source)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
         str(source)], cwd=tmp_path)
    (wheel,) = dist.glob("fdpp_rewrite-*.whl")
    # A venv that sees the installed dependencies (torch, onnx, ...) but not this checkout; without pip of its own,
    # so that its setuptools does not shadow the one torch needs. --no-index: every declared dependency must be
    # there already, the package itself comes from the wheel.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-index", "--no-deps", str(wheel)],
        cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "FDPP_PLUGIN_LIB")}
    return {"wheel": wheel, "venv": venv, "python": python, "fdpp": str(venv / "bin" / "fdpp"), "work": work,
            "env": env}


def test_wheel_in_a_fresh_venv_from_another_directory(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    packaged = {name[len("fdpp_rewrite/data/"):] for name in names if name.startswith("fdpp_rewrite/data/")}
    assert packaged == _canonical_data_files() and any(p.endswith("contract.json") for p in packaged)
    assert "fdpp_rewrite/cli.py" in names and "fdpp_rewrite/passes/flat_gemm.py" in names

    work, env, fdpp, python, venv = (installed[key] for key in ("work", "env", "fdpp", "python", "venv"))
    assert "export" in run([fdpp, "--help"], cwd=work, env=env)
    assert fdpp_rewrite.__version__ in run([str(python), "-m", "fdpp_rewrite", "--version"], cwd=work, env=env)
    where = run([str(python), "-c", "import fdpp_rewrite.resources as r; print(r.SOURCE_ROOT, r.data_root())"],
                cwd=work, env=env).split()
    assert where[0] == "None" and Path(where[1]).is_relative_to(venv)  # the wheel's data, not the checkout

    run([fdpp, "export", "tiny-llama", "-o", "x.onnx"], cwd=work, env=env)
    log = run([fdpp, "rewrite", "x.onnx"], cwd=work, env=env)
    assert (work / "x.onnx").is_file() and (work / "x.fdpp.onnx").is_file()
    assert "h200.json has no entry" in log  # the packaged h200 profile was read (it lacks tiny-llama's shapes)

    run([str(python), "-m", "fdpp_rewrite", "build", "x.fdpp.onnx", "-o", "engine", "--backend", "cpu"], cwd=work,
        env=env)
    manifest = json.loads((work / "engine" / "manifest.json").read_text())
    assert manifest["backend"] == "cpu" and manifest["profile"] == "unprofiled-default"
    plans = json.loads((work / "engine" / "plan.json").read_text())["gemm_plans"]
    assert plans and all({"m1", "m2", "implb", "implc"} <= set(plan) for plan in plans.values())
    out = run([str(python), "-m", "fdpp_rewrite", "run", "engine", "--token-ids", "1,2,3", "--max-new-tokens", "3"],
              cwd=work, env=env)
    assert "3 tokens" in out and "cpu backend" in out


# Run in the installed package: the plans a cuda build of the rewritten 1-layer smollm2 gets on an H200, and the
# plan of a node no rewrite stamped for the H200, both without measuring anything.
RESOLVE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import fdpp_rewrite
    from fdpp_rewrite.engine.build import gemm_shapes, read_graph
    from fdpp_rewrite.gemm_plans import GemmNode, gemm_nodes, resolve_cuda_plans
    from fdpp_rewrite.profiles import UNPROFILED_DEFAULT

    def refuse(shape):
        raise SystemExit(f"profiled {shape}: the packaged profile should cover it")

    plan, arrays = read_graph(Path(sys.argv[1]))
    stamped = resolve_cuda_plans(gemm_nodes(plan, gemm_shapes(plan, arrays)), "NVIDIA H200", measure=refuse)
    node = GemmNode((22016, 4096, "float16"), "silu_mul", dict(UNPROFILED_DEFAULT.attributes(), epilogue="silu_mul"))
    packaged = resolve_cuda_plans({"gate_up": node}, "NVIDIA H200", measure=refuse)
    print(json.dumps({"package": fdpp_rewrite.__file__, "stamped_source": stamped.source,
                      "stamped_plans": len(stamped.plans), "packaged_source": packaged.source,
                      "packaged_file": str(packaged.profile_file), "gate_up": packaged.plans["gate_up"]}))
""")


def test_the_installed_rewrite_and_cuda_plans_use_the_packaged_h200_profile(installed):
    work, env, python = installed["work"], installed["env"], installed["python"]
    fdpp = [str(python), "-m", "fdpp_rewrite"]
    run(fdpp + ["export", "smollm2-135m", "--dtype", "float16", "--layers", "1", "--max-cache", "16",
                "--random-init", "-o", "smol/model.onnx"], cwd=work, env=env)
    log = run(fdpp + ["rewrite", "smol/model.onnx"], cwd=work, env=env)
    assert "profile: engines/profiles/h200.json" in log and "unprofiled" not in log
    facts = json.loads(run([str(python), "-c", RESOLVE, "smol/model.fdpp.onnx"], cwd=work, env=env).splitlines()[-1])
    package = Path(facts["package"]).parent
    assert package.is_relative_to(installed["venv"])
    assert facts["stamped_source"] == "h200.json (NVIDIA H200)" and facts["stamped_plans"] == 5  # 4 + lm_head
    assert facts["packaged_file"] == str(package / "data" / "engines" / "profiles" / "h200.json")
    assert facts["packaged_source"] == "engines/profiles/h200.json"
    assert (facts["gate_up"]["m2"], facts["gate_up"]["implb"]["loader"]) == (16, "pair")  # the stored silu_mul plan


def test_sdist_carries_the_data_files(tmp_path):
    """A wheel built from the sdist (what `python -m build` does) needs the data at the canonical paths."""
    import tarfile

    run([sys.executable, str(ROOT / "setup.py"), "-q", "sdist", "-d", str(tmp_path)], cwd=ROOT)
    (archive,) = tmp_path.glob("fdpp_rewrite-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    assert _canonical_data_files() <= names and "fdpp_rewrite/resources.py" in names and "setup.py" in names
