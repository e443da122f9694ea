"""Each plugin folder's README.md agrees with its contract.json: version, inputs, outputs and every attribute's type,
default and allowed values (the README's tables are generated from the contract; this catches a contract change
that the README missed)."""

import json
import re
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
FOLDERS = sorted(p.parent for p in PLUGINS.glob("*Plugin/contract.json"))


def _value(v):
    return f'`"{v}"`' if isinstance(v, str) else f"`{json.dumps(v)}`"


def _allowed(spec):
    if "choices" in spec:
        return ", ".join(_value(c) for c in spec["choices"])
    if "range" in spec:
        lo, hi = spec["range"]
        return f"`{json.dumps(lo)}` .. `{json.dumps(hi)}`"
    return "any"


def _table(text, heading):
    """The rows of the markdown table under `### heading`, as lists of stripped cells (header and rule skipped)."""
    section = text.split(f"### {heading}\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in section.splitlines()[2:]]


def test_every_plugin_folder_has_a_readme():
    assert len(FOLDERS) == 4
    for folder in FOLDERS:
        assert (folder / "README.md").is_file(), f"{folder.name} has no README.md"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_readme_matches_contract(folder):
    contract = json.loads((folder / "contract.json").read_text())
    text = (folder / "README.md").read_text()
    assert re.match(rf"# fdpp::{contract['op']} \(contract version {contract['version']}\)\n", text)
    assert [row[1] for row in _table(text, "Inputs")] == [f"`{t['name']}`" for t in contract["inputs"]]
    assert [row[1] for row in _table(text, "Outputs")] == [f"`{t['name']}`" for t in contract["outputs"]]
    rows = {row[0]: row[1:4] for row in _table(text, "Attributes")}
    expected = {f"`{name}`": [spec["type"], "required" if spec.get("required") else _value(spec["default"]),
                              _allowed(spec)]
                for name, spec in contract["attributes"].items()}
    assert rows == expected
