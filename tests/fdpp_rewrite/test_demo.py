"""`fdpp demo` picks its pipeline by what the machine has, and its GPU path runs the CLI's own commands in order.
(The CPU pipeline end to end is tests/fdpp_rewrite/test_readme.py's main-job test.)"""

import pytest

from fdpp_rewrite import cli, demo


def recorded_steps(monkeypatch):
    """Replace cli.run_command by one that parses argv with the real command's parser (so a wrong option fails
    here) and records it instead of running it."""
    steps = []

    def run_command(argv):
        cli.build_parser(argv[0]).parse_args(argv)
        steps.append(argv)
        return 0

    monkeypatch.setattr(cli, "run_command", run_command)
    return steps


def demo_args(tmp_path, *extra):
    parser = cli.Parser()
    demo.add_arguments(parser)
    return parser.parse_args(["--workdir", str(tmp_path), *extra])


def test_gpu_path_runs_export_rewrite_build_run_and_bench(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "why_no_gpu_engine", lambda: None)
    steps = recorded_steps(monkeypatch)
    assert demo.run(demo_args(tmp_path, "--max-new-tokens", "20")) == 0
    assert [s[0] for s in steps] == ["export", "rewrite", "build", "run", "bench"]
    export, rewrite, build, run, bench = steps
    assert export[export.index("--dtype") + 1] == "float16"
    assert build[1] == rewrite[rewrite.index("-o") + 1] == str(tmp_path / "smollm2-135m-fp16.fdpp.onnx")
    assert "--chat" in run and run[run.index("--max-new-tokens") + 1] == "20"
    assert bench[bench.index("--kernels") + 1:] == ["fdpp", "torch"]
    out = capsys.readouterr().out
    assert "answer: " in out and "compare verdict" not in out


def test_gpu_path_reuses_a_built_engine(monkeypatch, tmp_path):
    monkeypatch.setattr(demo, "why_no_gpu_engine", lambda: None)
    for name in ("smollm2-135m-fp16.onnx", "smollm2-135m-fp16.fdpp.onnx", "smollm2-135m-engine/manifest.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    steps = recorded_steps(monkeypatch)
    demo.run(demo_args(tmp_path))
    assert [s[0] for s in steps] == ["run", "bench"]
    steps.clear()
    demo.run(demo_args(tmp_path, "--force"))
    assert [s[0] for s in steps] == ["export", "rewrite", "build", "run", "bench"]
    assert all("--force" in s for s in steps[:3])


class SilentTokenizer:
    def decode(self, ids):
        return "".join(f" t{i}" for i in ids)


def test_cpu_path_runs_export_rewrite_compare_then_generates(monkeypatch, tmp_path, capsys):
    """The CPU pipeline's commands, parsed by the real parsers (test_readme.py's main-job test runs them on a
    reused export; this pins the export the demo itself would run)."""
    from fdpp_rewrite import generate, ref_session
    from fdpp_rewrite.resources import calibration_path

    steps = recorded_steps(monkeypatch)
    generated = []
    monkeypatch.setattr(generate, "load_tokenizer_for", lambda path: SilentTokenizer())
    monkeypatch.setattr(ref_session, "make_reference_session", lambda path: ("reference", path))
    monkeypatch.setattr(generate, "generate_ids", lambda session, tokenizer, prompt, **kw: generated.append(
        (session, prompt, kw["max_new_tokens"], kw["chat"])) or [kw["on_token"](7)])
    assert demo.run(demo_args(tmp_path, "--device", "cpu", "--max-new-tokens", "5")) == 0
    assert [s[0] for s in steps] == ["export", "rewrite", "compare"]
    export, rewrite, compare = steps
    original, rewritten = tmp_path / "smollm2-135m.onnx", tmp_path / "smollm2-135m.fdpp.onnx"
    assert export[1:] == ["smollm2-135m", "--dtype", "float32", "-o", str(original)]
    assert rewrite[rewrite.index("-o") + 1] == str(rewritten) and rewrite[1] == str(original)
    assert rewrite[rewrite.index("--calibration") + 1] == str(calibration_path("smollm2-135m"))
    assert compare[1:] == [str(original), str(rewritten)]
    assert generated == [(("reference", rewritten), demo.DEFAULT_PROMPT, 5, True)]
    out = capsys.readouterr().out
    assert "answer: t7\n" in out and "compare verdict for smollm2-135m: PASS" in out


def test_auto_without_gpu_says_so_and_runs_the_cpu_pipeline(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "why_no_gpu_engine", lambda: "no CUDA GPU is visible to torch")
    chosen = []
    monkeypatch.setattr(demo, "_run_cpu", lambda args, workdir, name: chosen.append(name) or 0)
    assert demo.run(demo_args(tmp_path)) == 0
    assert chosen == ["smollm2-135m"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "no CUDA GPU" in lines[0] and "CPU pipeline" in lines[0]


def test_device_cpu_skips_the_gpu_check(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "why_no_gpu_engine", lambda: pytest.fail("--device cpu must not look for a GPU"))
    monkeypatch.setattr(demo, "_run_cpu", lambda args, workdir, name: 0)
    assert demo.run(demo_args(tmp_path, "--device", "cpu")) == 0
    assert capsys.readouterr().out == ""


def test_device_cuda_without_gpu_is_one_line_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(demo, "why_no_gpu_engine", lambda: "no CUDA GPU is visible to torch")
    workdir = tmp_path / "work"
    assert cli.main(["demo", "--device", "cuda", "--workdir", str(workdir)]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith("error: --device cuda needs the GPU engine, but no CUDA GPU") and err.count("\n") == 1
    assert not workdir.exists()
