"""All-pairs (pairwise) test grids: every value pair of any two axes that some valid combination holds appears in at
least one generated case, with far fewer cases than the cartesian product. Deterministic (a greedy pick in the
product's order), so test ids are stable between runs and machines.

    all_pairs({"m": [1, 9, 64], "dtype": ["float16", "bfloat16"], "impl": ["impla", "implb"]},
              valid=lambda c: c["impl"] != "impla" or c["m"] <= 8)
"""

import itertools

import numpy as np
import pytest


def all_pairs(axes: dict, valid=None) -> list:
    """Tuples of values, one per axis in the order of `axes`, covering every (axis, value) x (axis, value) pair that
    occurs in a combination `valid(dict)` accepts (every combination when valid is None); each single value too."""
    names = list(axes)
    values = [list(axes[name]) for name in names]
    candidates = [combo for combo in itertools.product(*(range(len(v)) for v in values))
                  if valid is None or valid({n: values[i][j] for i, (n, j) in enumerate(zip(names, combo))})]
    if not candidates:
        raise ValueError(f"no valid combination of {names}")
    slots = [(a, b) for a in range(len(names)) for b in range(a, len(names))]  # (a, a): the single values
    offsets = np.cumsum([0] + [len(values[a]) * len(values[b]) for a, b in slots])
    pair_ids = np.array([[offsets[s] + combo[a] * len(values[b]) + combo[b] for s, (a, b) in enumerate(slots)]
                         for combo in candidates])
    uncovered = np.zeros(offsets[-1], dtype=bool)
    uncovered[pair_ids.ravel()] = True  # only pairs some valid combination holds need covering
    chosen = []
    while uncovered.any():
        best = int(np.argmax(uncovered[pair_ids].sum(axis=1)))  # first of the best: deterministic
        chosen.append(best)
        uncovered[pair_ids[best]] = False
    return [tuple(values[i][j] for i, j in enumerate(candidates[c])) for c in sorted(chosen)]


def pairwise_params(axes: dict, valid=None, ids: dict = None) -> list:
    """all_pairs as pytest.param entries for @pytest.mark.parametrize(",".join(axes), ...), each with an id made of
    its values (ids maps an axis to a function naming a value, for values whose str is not a good name)."""
    ids = ids or {}
    name = [ids.get(axis, _name) for axis in axes]
    return [pytest.param(*case, id="-".join(f(v) for f, v in zip(name, case))) for case in all_pairs(axes, valid)]


def _name(value) -> str:
    return str(value).replace("torch.", "")
