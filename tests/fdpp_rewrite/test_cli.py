"""The command line as a user meets it: help, unknown commands, one-line errors."""

import subprocess
import sys

from fdpp_rewrite import cli


def run_cli(*argv):
    return subprocess.run([sys.executable, "-m", "fdpp_rewrite", *argv], capture_output=True, text=True)


def test_help_lists_every_command():
    result = run_cli("--help")
    assert result.returncode == 0
    for name in cli.COMMANDS:
        assert name in result.stdout


def test_every_command_has_help():
    for name in cli.COMMANDS:
        result = run_cli(name, "--help")
        assert result.returncode == 0, f"{name} --help failed: {result.stderr}"
        assert "usage:" in result.stdout


def test_no_command_prints_help_and_fails():
    result = run_cli()
    assert result.returncode == 2
    assert "usage:" in result.stdout


def test_unknown_preset_is_one_line_error():
    result = run_cli("export", "no-such-model", "-o", "/tmp/fdpp-never-written.onnx")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "Traceback" not in result.stderr


def test_extension_tables_add_commands(monkeypatch, capsys):
    """A module named in cli.EXTENSIONS adds its COMMANDS (e.g. build, run, bench); one not installed is skipped."""
    import types

    table = types.ModuleType("fdpp_test_extension")
    table.COMMANDS = {"hello": ("fdpp_test_hello", "say hello")}
    command = types.ModuleType("fdpp_test_hello")
    command.add_arguments = lambda parser: parser.add_argument("--name", default="world", help="whom to greet")
    command.run = lambda args: print(f"hello {args.name}") or 0
    monkeypatch.setitem(sys.modules, "fdpp_test_extension", table)
    monkeypatch.setitem(sys.modules, "fdpp_test_hello", command)
    monkeypatch.setattr(cli, "EXTENSIONS", ("fdpp_rewrite.not_installed.cli", "fdpp_test_extension"))
    assert "hello" in cli.all_commands() and "export" in cli.all_commands()
    assert "hello" in cli.build_parser().description
    assert cli.main(["hello", "--name", "fdpp"]) == 0
    assert capsys.readouterr().out == "hello fdpp\n"
