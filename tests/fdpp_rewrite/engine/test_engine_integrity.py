"""Engine artifacts that cannot be silently wrong (issue 42): the manifest and plan against their schemas, the
weights against their sha256 (and the stamp that spares the hash), `verify`, `build --force` that replaces only an
engine folder, leftovers of killed builds, and the CLI's one-line errors for truncated external data and bad
sampling options. Each failure: one `error:` line, exit 2, nothing of the user's deleted. A tiny engine, cpu
backend."""

import io
import json
import os
import shutil
import subprocess
import sys

import pytest
from cli_output import error_line

from fdpp_rewrite import REPO_ROOT, cli
from fdpp_rewrite.engine import manifest as engine_manifest
from fdpp_rewrite.engine.build import build_engine
from fdpp_rewrite.engine.manifest import STAMP, read_manifest, read_plan, schema_problem, verify_weights
from fdpp_rewrite.errors import FdppError

POSITIONS = 512  # tiny-llama's max_position


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(the rewritten model, its engine folder) of tiny-llama (2 layers), cpu backend."""
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp("integrity")
    model = folder / "model" / "model.onnx"
    export_model("tiny-llama", model, dtype="float32", max_cache=32, progress=False)
    rewritten = rewrite_file(model, stream=io.StringIO())
    engine = folder / "engine"
    build_engine(rewritten, engine, backend="cpu", max_batch=3, max_seq=32, stream=io.StringIO())
    return rewritten, engine


@pytest.fixture
def engine(made, tmp_path):
    """A fresh copy of the engine, to edit."""
    copy = tmp_path / "engine"
    shutil.copytree(made[1], copy)
    return copy


def edit_json(path, change):
    data = json.loads(path.read_text())
    data = change(data)
    path.write_text(json.dumps(data))


def one_error(capsys, argv) -> str:
    assert cli.main(argv) == 2, argv
    return error_line(capsys.readouterr().err)


def listing(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- the manifest ---------------------------------------------------------------------------------------------

def _set(key, value):
    def change(manifest):
        *parents, last = key.split(".")
        target = manifest
        for part in parents:
            target = target[part]
        target[last] = value
        return manifest
    return change


def _drop(key):
    def change(manifest):
        del manifest[key]
        return manifest
    return change


@pytest.mark.parametrize("change, words", [
    (_set("max_batch", "eight"), 'max_batch is "eight", expected an integer >= 1'),
    (_set("max_batch", -1), "max_batch is -1, expected an integer >= 1"),
    (_set("max_batch", True), "max_batch is true, expected an integer >= 1"),
    (_set("max_seq", 0), "max_seq is 0, expected an integer >= 2"),
    (_set("max_seq", 600), f"max_seq 600 exceeds the model's {POSITIONS} positions"),
    (_set("num_layers", "2"), 'num_layers is "2", expected an integer >= 1'),
    (_set("backend", "tpu"), 'backend is "tpu", expected a string (one of cuda, cpu)'),
    (_set("dtype", "float64"), 'dtype is "float64", expected a string (one of float32, float16, bfloat16)'),
    (_set("format_version", "1"), 'format_version is "1", expected an integer >= 1'),
    (_set("weights_sha256", "abc"), 'weights_sha256 is "abc", expected a sha256 hex digest'),
    (_drop("weights_sha256"), "weights_sha256 is missing"),
    (_drop("max_seq"), "max_seq is missing, expected an integer >= 2"),
    (_set("model.config.max_position", "many"), 'model.config.max_position is "many"'),
    (_set("backend", "cuda"), "gpu is null, expected an object for a cuda engine"),
    (_set("kv_cache", {"layout": "ring", "block_size": 64, "kv_memory": "0.9"}),
     'kv_cache.layout is "ring", expected a string (one of paged)'),
    (_set("kv_cache", {"layout": "paged", "block_size": 32, "kv_memory": "0.9"}),
     "kv_cache.block_size is 32, this version's KV blocks hold 64 tokens"),
    (_set("kv_cache", {"layout": "paged", "block_size": 64}), "kv_cache.kv_memory is missing, expected a string"),
    (_set("kv_cache", {"layout": "paged", "block_size": 64, "kv_memory": "lots"}),
     "kv_cache.kv_memory: --kv-memory lots"),
])
@pytest.mark.parametrize("command", ["run", "verify"])
def test_edited_manifest_is_one_line(engine, capsys, change, words, command):
    edit_json(engine / "manifest.json", change)
    before = listing(engine)
    argv = ["run", str(engine), "--token-ids", "1,2", "--max-new-tokens", "2"] if command == "run" else \
        ["verify", str(engine)]
    line = one_error(capsys, argv)
    assert line.startswith(f"error: {engine / 'manifest.json'}: ") and words in line, line
    assert line.endswith(f"rebuild the engine (build MODEL -o {engine} --force)"), line
    assert listing(engine) == before


def test_manifest_that_is_not_an_object(engine, capsys):
    (engine / "manifest.json").write_text("[]")
    assert "is not an fdpp engine manifest; rebuild" in one_error(capsys, ["verify", str(engine)])


def test_max_seq_within_the_positions_loads(engine):
    edit_json(engine / "manifest.json", _set("max_seq", POSITIONS))
    assert read_manifest(engine)["max_seq"] == POSITIONS


def test_schema_problem_names_nested_and_missing_fields():
    schema = engine_manifest.MANIFEST_SCHEMA
    assert schema_problem({"format": "fdpp-engine"}, schema) == "format_version is missing, expected an integer >= 1"
    assert schema_problem([], schema) == "the file is [], expected an object"


# -- plan.json ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    (lambda plan: [], "the file is [], expected an object"),
    (_drop("nodes"), "nodes is missing, expected a list"),
    (_set("num_layers", 5), "num_layers is 5, but the manifest says 2"),
    (_set("dtype", "float16"), 'dtype is "float16", but the manifest says "float32"'),
    (lambda plan: dict(plan, nodes=[{"op": "MatMul"}]), "nodes[0].name is missing"),
    (lambda plan: dict(plan, cache_inputs=plan["cache_inputs"][:1]), "cache_inputs has 1 names, expected 2 per"),
    (lambda plan: dict(plan, gemm_plans={}), "gemm_plans lacks FlatGemm"),
])
def test_edited_plan_is_one_line(engine, capsys, change, words):
    edit_json(engine / "plan.json", change)
    line = one_error(capsys, ["verify", str(engine)])
    assert line.startswith(f"error: {engine / 'plan.json'}: ") and words in line and "rebuild the engine" in line, line
    with pytest.raises(FdppError, match="rebuild the engine"):
        read_plan(engine, read_manifest(engine))  # what the Engine's load calls


# -- the weights ----------------------------------------------------------------------------------------------

def corrupt(path):
    """Flip one byte in the middle: the same size."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_verify_checks_everything_and_stamps(engine, capsys):
    assert cli.main(["verify", str(engine)]) == 0
    out = capsys.readouterr().out
    sha = read_manifest(engine)["weights_sha256"]
    assert f"max seq 32 of the model's {POSITIONS} positions" in out and "plan.json: " in out
    assert f"sha256 {sha} matches the manifest" in out and out.strip().endswith(f"verified {engine}")
    assert json.loads((engine / STAMP).read_text())["sha256"] == sha


def test_corrupted_weights_are_refused(engine, capsys):
    manifest = read_manifest(engine)
    verify_weights(engine, manifest)  # a full check: it writes the stamp
    assert (engine / STAMP).is_file()
    size = (engine / "weights.safetensors").stat().st_size
    corrupt(engine / "weights.safetensors")
    assert (engine / "weights.safetensors").stat().st_size == size
    with pytest.raises(FdppError, match="does not match the sha256 in its manifest .* rebuild the engine"):
        verify_weights(engine, manifest)  # the stamp no longer matches the file: hashed again
    line = one_error(capsys, ["verify", str(engine)])
    assert line.startswith(f"error: {engine / 'weights.safetensors'} does not match the sha256"), line
    assert (engine / "weights.safetensors").stat().st_size == size  # refused, not removed


def test_the_stamp_spares_the_hash_until_the_file_changes(engine, monkeypatch):
    from fdpp_rewrite.gpu import device

    manifest = read_manifest(engine)
    hashed = []
    real = device.sha256_file
    monkeypatch.setattr(device, "sha256_file", lambda path: hashed.append(path) or real(path))
    verify_weights(engine, manifest)
    verify_weights(engine, manifest)
    assert len(hashed) == 1  # the second load trusted the stamp
    os.utime(engine / "weights.safetensors", ns=(1, 1))  # any change to the file's stat
    verify_weights(engine, manifest)
    assert len(hashed) == 2
    edited = dict(manifest, weights_sha256="0" * 64)  # a stamp vouches only for the sha it matched
    with pytest.raises(FdppError, match="does not match the sha256"):
        verify_weights(engine, edited)


def test_a_read_only_engine_still_verifies(engine, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(engine_manifest.os, "replace", refuse)
    verify_weights(engine, read_manifest(engine))
    assert not (engine / STAMP).exists() and not list(engine.glob(f"{STAMP}*"))


# -- build --force --------------------------------------------------------------------------------------------

def build(capsys, model, output, *extra):
    return cli.main(["build", str(model), "-o", str(output), "--backend", "cpu", "--max-seq", "32", *extra])


def test_force_refuses_a_folder_of_the_users_files(made, capsys):
    model = made[0]
    before = listing(model.parent)
    assert build(capsys, model, model.parent, "--force") == 2
    line = error_line(capsys.readouterr().err)
    assert line == (f"error: {model.parent} is not an engine folder (no fdpp manifest.json in it) and not empty; "
                    "choose another -o (--force replaces only an engine folder or an empty one)")
    assert listing(model.parent) == before
    assert not [p for p in model.parent.parent.iterdir() if p.name.startswith(".")]


def test_force_refuses_an_engine_folder_holding_other_files(made, engine, capsys):
    (engine / "notes.txt").write_text("mine")
    assert build(capsys, made[0], engine, "--force") == 2
    assert "holds notes.txt, which is not part of an engine; choose another -o" in error_line(capsys.readouterr().err)
    assert (engine / "notes.txt").read_text() == "mine" and (engine / "weights.safetensors").is_file()


def test_force_refuses_a_file_and_the_current_folder(made, capsys, tmp_path, monkeypatch):
    target = tmp_path / "file.txt"
    target.write_text("mine")
    assert build(capsys, made[0], target, "--force") == 2
    assert "is a file, not an engine folder; choose another -o" in error_line(capsys.readouterr().err)
    assert target.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]
    monkeypatch.chdir(tmp_path)
    for output in (".", tmp_path.parent):
        assert build(capsys, made[0], output, "--force") == 2
        assert "is the current folder or holds it; choose another -o" in error_line(capsys.readouterr().err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_force_replaces_an_engine_folder_or_an_empty_one(made, engine, capsys, tmp_path):
    verify_weights(engine, read_manifest(engine))  # a stamp is part of an engine folder
    assert build(capsys, made[0], engine) == 2  # without --force: refused
    assert "exists; pass --force to replace it" in error_line(capsys.readouterr().err)
    assert build(capsys, made[0], engine, "--force", "--max-batch", "2") == 0
    assert read_manifest(engine)["max_batch"] == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build(capsys, made[0], empty, "--force") == 0
    read_manifest(empty)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_leftovers_of_a_killed_build_are_removed(made, capsys, tmp_path):
    output = tmp_path / "eng"
    dead = tmp_path / f".eng.building-{dead_pid()}"
    (dead / "rank_0").mkdir(parents=True)
    (dead / "weights.safetensors").write_bytes(b"x" * 1000)
    swapped = tmp_path / f".eng.replaced-{dead_pid()}"
    swapped.mkdir()
    alive = tmp_path / f".eng.building-{os.getppid()}"  # a build still running: kept
    alive.mkdir()
    assert build(capsys, made[0], output) == 0
    err = capsys.readouterr().err
    assert f"warning: removed {dead}, a temporary folder left by an interrupted build" in err
    assert f"warning: removed {swapped}," in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "eng"])


def test_a_killed_build_leaves_only_its_own_temporary_folder(made, tmp_path):
    """SIGKILL during a build (here: the build sleeps inside the write): the next build removes what it left."""
    marker = tmp_path / "writing"
    script = ("import sys, time; from pathlib import Path; from fdpp_rewrite.engine import build\n"
              "def replace(tmp, output, force):\n"
              "    Path(sys.argv[1]).write_text(str(tmp)); time.sleep(120)\n"
              "build.replace_folder = replace\n"
              "from fdpp_rewrite import cli; sys.exit(cli.main(sys.argv[2:]))")
    argv = ["build", str(made[0]), "-o", str(tmp_path / "eng"), "--backend", "cpu", "--max-seq", "32"]
    child = subprocess.Popen([sys.executable, "-c", script, str(marker), *argv], cwd=REPO_ROOT)
    try:
        for _ in range(600):
            if marker.exists() or child.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"])
        assert marker.exists(), "the build never reached its write"
    finally:
        child.kill()
        child.wait()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert left == [f".eng.building-{child.pid}"]
    result = subprocess.run([sys.executable, "-m", "fdpp_rewrite", *argv], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert "a temporary folder left by an interrupted build" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eng", "writing"]


# -- other CLI cases ------------------------------------------------------------------------------------------

def test_rewrite_of_truncated_external_data(made, capsys, tmp_path):
    source = made[0].parent / "model.onnx"
    shutil.copy(source, tmp_path / "model.onnx")
    data = (made[0].parent / "model.onnx.data").read_bytes()
    (tmp_path / "model.onnx.data").write_bytes(data[: len(data) // 3])
    line = one_error(capsys, ["rewrite", str(tmp_path / "model.onnx")])
    assert line.startswith(f"error: cannot load {tmp_path / 'model.onnx'}: its weights file "
                           f"{tmp_path / 'model.onnx.data'} is truncated (it has {len(data) // 3} bytes, "), line
    assert line.endswith("copy it beside the model again, re-export or re-run rewrite"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


@pytest.mark.parametrize("option, value, words", [
    ("--temperature", "nan", "expected a number >= 0, got nan"),
    ("--temperature", "inf", "expected a number >= 0, got inf"),
    ("--temperature", "-1", "expected a number >= 0, got -1"),
    ("--top-p", "0", "expected a number > 0 and <= 1, got 0"),
    ("--top-p", "1.5", "expected a number > 0 and <= 1, got 1.5"),
    ("--top-p", "nan", "expected a number > 0 and <= 1, got nan"),
    ("--top-k", "-1", "expected an integer >= 0, got -1"),
    ("--max-new-tokens", "0", "expected an integer >= 1, got 0"),
    ("--max-new-tokens", "2.5", "expected an integer >= 1, got '2.5'"),
])
def test_sampling_options_are_refused_as_arguments(made, capsys, option, value, words):
    with pytest.raises(SystemExit) as info:
        cli.main(["run", str(made[1]), "--token-ids", "1,2", option, value])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert error_line(err) == f"error: argument {option}: {words}; see `python -m fdpp_rewrite run --help`"


def test_verify_checks_every_rank_of_a_tensor_parallel_engine(capsys, tmp_path):
    from fdpp_rewrite.export import export_model
    from fdpp_rewrite.rewrite import rewrite_file

    model = tmp_path / "qwen2.onnx"
    export_model("tiny-qwen2", model, dtype="float32", max_cache=32, progress=False)  # 4 query heads, 2 KV heads
    engine = tmp_path / "tp"
    build_engine(rewrite_file(model, stream=io.StringIO()), engine, backend="cpu", max_batch=2, max_seq=32,
                 tensor_parallel=2, stream=io.StringIO())
    assert cli.main(["verify", str(engine)]) == 0
    out = capsys.readouterr().out
    assert all(f"{engine / rank / 'weights.safetensors'}: " in out for rank in ("rank_0", "rank_1")), out
    corrupt(engine / "rank_1" / "weights.safetensors")
    line = one_error(capsys, ["verify", str(engine)])
    assert line.startswith(f"error: {engine / 'rank_1' / 'weights.safetensors'} does not match the sha256"), line
    with pytest.raises(FdppError, match="rank_1/weights.safetensors does not match"):
        verify_weights(engine, read_manifest(engine))
    edit_json(engine / "rank_0" / "manifest.json", _set("max_batch", 0))
    line = one_error(capsys, ["verify", str(engine)])
    assert "rank_0/manifest.json: max_batch is 0, expected an integer >= 1" in line, line
