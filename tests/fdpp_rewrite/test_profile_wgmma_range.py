"""The plan's third range in profiles: the profiler's m3 from an entry's implb_wgmma record
(profile_plan.wgmma_range, complete_entry), and the reader's checks of a stored range (fdpp_rewrite.profiles)."""

import json

import pytest

from fdpp_rewrite.dispatch import implb_range
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.profile_plan import complete_entry, wgmma_range
from fdpp_rewrite.profiles import load_profile
from fdpp_rewrite.schemas import PROFILE_SCHEMA

WGMMA = {"n_tile": 64, "k_tile": 64, "stages": 4, "split_k": 4, "loader": "wgmma"}
ROWS = {"n_tile": 16, "k_tile": 1024, "stages": 3, "split_k": 1, "loader": "rows"}


def entry(m2=16, ours=(10.0, 11.0, 15.0, 30.0), theirs=(12.0, 12.0, 16.0, 28.0), curve_m=(16, 24),
          curve_lt=(11.9, 11.9), m1=0):
    """[4096, 4096] in short: the wgmma record at M 32..256 and cuBLASLt's curve below it."""
    return {"n": 4096, "k": 4096, "dtype": "float16", "m1": m1, "m2": m2, "implb": dict(ROWS), "implc": "cublaslt",
            "curves": {"m": list(curve_m), "cublaslt_us": list(curve_lt)},
            "implb_wgmma": {"m": [32, 64, 128, 256], "config": dict(WGMMA), "implb_wgmma_us": list(ours),
                            "cublaslt_us": list(theirs), "candidates": []}}


def test_m3_is_the_last_timed_m_up_to_which_wgmma_wins_everywhere():
    # The docstring's example: wins at 32, 64, 128 (and at M = 24 of the curve, at its M = 32 time), loses at 256.
    assert wgmma_range(entry()) == {"m3": 128, "wgmma": WGMMA}


@pytest.mark.parametrize("changed, m3", [
    ({"ours": (10.0, 13.0, 15.0, 30.0)}, 32),          # loses at 64: stops there even though it wins at 128
    ({"ours": (13.0, 11.0, 15.0, 20.0)}, None),        # loses at the first timed M above m2
    ({"ours": (10.0, 11.0, 15.0, 20.0)}, 256),         # wins everywhere: the kernel's last row
    ({"curve_lt": (11.9, 9.0)}, None),                 # cuBLASLt at M = 24 beats wgmma's M = 32 time
    ({"m2": 64}, 128),                                 # only M above m2 count (and 32 is not above it)
    ({"m2": 64, "ours": (99.0, 99.0, 15.0, 30.0)}, 128),
    ({"ours": (10.0, None, 15.0, 20.0)}, 32),          # no time at 64: no claim past 32
    ({"m2": 100}, None),                               # m2 above the first config's 64: no range after it
])
def test_m3_choice(changed, m3):
    got = wgmma_range(entry(**changed))
    assert got == ({} if m3 is None else {"m3": m3, "wgmma": WGMMA})


def test_no_record_no_range():
    plain = entry()
    del plain["implb_wgmma"]
    assert wgmma_range(plain) == {} and wgmma_range(dict(entry(), implb_wgmma=None)) == {}


def test_complete_entry_stores_the_range_and_gives_it_to_the_silu_mul_plan():
    stored = complete_entry(entry(m2=8, curve_m=(8, 9, 16, 24), curve_lt=(45.0, 45.0, 45.8, 46.0),
                                  ours=(40.0, 41.0, 42.0, 60.0), theirs=(46.0, 47.0, 48.0, 55.0)))
    assert (stored["m3"], stored["wgmma"]) == (128, WGMMA)
    assert [implb_range(m, stored) for m in (8, 9, 128, 129)] == ["implb", "wgmma", "wgmma", "cublaslt"]
    assert stored["silu_mul"] is None  # no implb_search: the silu_mul nodes run the entry's plan, range included
    silu_search = {"m": [1, 2, 4, 8, 16], "top": [{"config": ROWS, "us": [44.0, 44.5, 44.9, 45.0, 45.9]}]}
    with_search = complete_entry(dict(stored, implb_search=silu_search,
                                      curves={"m": [1, 2, 4, 8, 16], "implb_us": [44.0, 44.5, 44.9, 45.0, 58.3],
                                              "cublaslt_us": [44.7, 45.0, 45.0, 45.4, 45.8]}))
    assert with_search["silu_mul"]["m2"] == 16 and with_search["silu_mul"]["m3"] == with_search["m3"]
    assert complete_entry(with_search) == with_search  # recomputed from the record, not stacked


def write_profile(path, shapes):
    path.write_text(json.dumps({"schema": PROFILE_SCHEMA, "gpu": "NVIDIA H200", "shapes": shapes}))
    return path


DROP = "drop"  # stored(key=DROP): the entry without that key


def stored(**change):
    base = {"n": 4096, "k": 4096, "dtype": "float16", "m1": 0, "m2": 16, "implb": dict(ROWS, loader="pair",
            stages=2), "implc": "cublaslt", "silu_mul": None, "m3": 128, "wgmma": dict(WGMMA)}
    base.update(change)
    return {key: value for key, value in base.items() if value != DROP}


def test_a_stored_range_reaches_the_choice_the_nodes_and_the_plan(tmp_path):
    choice = load_profile(write_profile(tmp_path / "h200.json", [stored()])).lookup(4096, 4096, "float16")
    assert (choice.m3, choice.implb_wgmma_stages, choice.implb_wgmma_split_k) == (128, 4, 4)
    attrs = choice.attributes()
    assert (attrs["m3"], attrs["implb_wgmma_stages"], attrs["implb_wgmma_split_k"]) == (128, 4, 4)
    plan = choice.plan()
    assert (plan["m3"], plan["wgmma"]) == (128, WGMMA)


def test_an_absent_range_is_m3_equal_to_m2_and_no_attributes(tmp_path):
    choice = load_profile(write_profile(tmp_path / "h200.json", [stored(m3=DROP, wgmma=DROP)])).lookup(
        4096, 4096, "float16")
    assert choice.m3 == 0 and not choice.has_wgmma_range
    assert not {"m3", "implb_wgmma_stages", "implb_wgmma_split_k"} & set(choice.attributes())
    assert "m3" not in choice.plan() and "wgmma" not in choice.plan()
    assert implb_range(17, choice.attributes()) == "cublaslt"


@pytest.mark.parametrize("change, message", [
    ({"wgmma": DROP}, "one of 'm3' and 'wgmma' without the other"),
    ({"m3": DROP}, "one of 'm3' and 'wgmma' without the other"),
    ({"m3": 8}, "m3 must be >= m2"),
    ({"m3": 300}, "m3.*outside \\[0, 256\\]"),
    ({"m3": 64.0}, "m3 must be an integer"),
    ({"m2": 100, "implb": {"n_tile": 16, "k_tile": 256, "stages": 3, "split_k": 1}}, "m2 must be <= 64"),
    ({"wgmma": dict(WGMMA, loader="rows")}, "wgmma.loader must be \"wgmma\""),
    ({"wgmma": dict(WGMMA, n_tile=16)}, "wgmma.n_tile must be 64"),
    ({"wgmma": dict(WGMMA, stages=1)}, "implb_wgmma_stages.*outside \\[2, 8\\]"),
    ({"wgmma": {"stages": 4}}, "must be an object with n_tile"),
    ({"silu_mul": {"m1": 0, "m2": 16, "implb": dict(ROWS), "m3": 12, "wgmma": dict(WGMMA)}},
     "silu_mul.*m3 must be >= m2"),
])
def test_a_bad_stored_range_is_a_one_line_error(tmp_path, change, message):
    path = write_profile(tmp_path / "bad.json", [stored(**change)])
    with pytest.raises(FdppError, match=message) as info:
        load_profile(path)
    assert "\n" not in str(info.value) and "is malformed" in str(info.value)
