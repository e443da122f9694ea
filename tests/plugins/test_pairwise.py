"""The all-pairs grid helper (tests/helpers/pairwise.py) that the GPU kernel tests parametrize with."""

import itertools

import pytest

from pairwise import all_pairs, pairwise_params

AXES = {"impl": ["impla", "implb", "cublaslt"], "m": [1, 7, 9, 64, 100], "epilogue": ["none", "bias", "silu_mul"],
        "dtype": ["float16", "bfloat16"]}
LIMIT = {"impla": 8, "implb": 64, "cublaslt": 100}


def _valid(c):
    return c["m"] <= LIMIT[c["impl"]]


def _pairs(cases):
    names = list(AXES)
    return {((a, case[a]), (b, case[b])) for case in cases for a, b in itertools.combinations(range(len(names)), 2)}


def test_every_valid_pair_is_covered_by_valid_cases_only():
    cases = all_pairs(AXES, valid=_valid)
    valid = [c for c in itertools.product(*AXES.values()) if _valid(dict(zip(AXES, c)))]
    assert all(_valid(dict(zip(AXES, case))) for case in cases)  # no case that would skip by construction
    assert _pairs(cases) == _pairs(valid)
    assert ("impla", 9) not in {(case[0], case[1]) for case in cases}
    assert len(cases) < len(valid) / 2


def test_the_grid_is_deterministic_and_near_the_pair_bound():
    cases = all_pairs(AXES)
    assert cases == all_pairs(AXES)
    assert 15 <= len(cases) <= 20  # at least |m| x |impl| = 15 pairs need a case each


def test_one_axis_lists_each_value_and_no_valid_case_is_an_error():
    assert all_pairs({"x": [1, 2, 3]}) == [(1,), (2,), (3,)]
    with pytest.raises(ValueError, match="no valid combination"):
        all_pairs({"x": [1], "y": [2]}, valid=lambda c: False)


def test_params_carry_readable_ids():
    params = pairwise_params({"shape": [(40, 200)], "dtype": ["float16"]}, ids={"shape": lambda s: f"{s[0]}x{s[1]}"})
    assert [p.id for p in params] == ["40x200-float16"] and params[0].values == ((40, 200), "float16")
