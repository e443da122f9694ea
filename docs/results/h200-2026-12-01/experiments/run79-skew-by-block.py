"""EXPERIMENT (notes-gemm.md, runs 80-84): run 79's per-CTA records by octile of the block index.

    python3 run79-skew-by-block.py DIR    # DIR holds run79-rows-trace.py's <shape>_m<M>_<loader>.npy files
"""
import sys
from pathlib import Path

import numpy as np


def launches(recs, ctas):
    """The records of one replay split into its launches (one weight copy, in start order), by release time."""
    out = []
    for w in np.unique(recs["w"]):
        r = recs[recs["w"] == w]
        r = r[np.argsort(r["g0"])]
        out += [r[i:i + ctas] for i in range(0, len(r), ctas)]
    return sorted(out, key=lambda r: int(r["g1"].min()))


def main(folder: Path):
    for path in sorted(folder.glob("*.npy")):
        recs = np.load(path)
        ctas = len(np.unique(recs["block"]))
        rel = {"start": [], "unit 0 ready": [], "end": []}
        ends_by_block = []
        for a in launches(recs, ctas)[5:55]:
            release = float(a["g1"].min())
            order = np.argsort(a["block"])
            for key, field in (("start", "g0"), ("unit 0 ready", "g2"), ("end", "g3")):
                rel[key].append((a[field][order].astype(float) - release) / 1000)
            ends_by_block.append(rel["end"][-1])
        g = ctas // 8
        print(f"{path.name} ({ctas} CTAs), us from the release, mean per block octile:")
        for key, rows in rel.items():
            rows = np.array(rows)
            print(f"  {key:13}", " ".join(f"{rows[:, j * g:(j + 1) * g].mean():6.2f}" for j in range(8)))
        e = np.array(ends_by_block)
        corr = np.corrcoef(e[0::2].mean(0), e[1::2].mean(0))[0, 1]
        print(f"  split-half correlation of the per-block mean end: {corr:.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
