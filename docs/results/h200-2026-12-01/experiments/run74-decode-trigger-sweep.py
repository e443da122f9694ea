"""Sweep: when the decode split kernel lets the next grid launch (FDPP_ATTN_TRIGGER_AHEAD), with the plan's
combine and with the last-split combine; cuDNN beside. Graph timing."""
import os, sys, json
sys.path.insert(0, "scripts")
import torch
import bench_attention as ba

def with_env(value, call):
    def run():
        os.environ["FDPP_ATTN_TRIGGER_AHEAD"] = str(value)
        return call()
    return run

shapes = [(1, 32, 32, 1024), (1, 32, 32, 8192), (1, 32, 32, 32768), (8, 32, 32, 1024), (8, 32, 32, 8192),
          (8, 32, 32, 32768), (1, 32, 8, 1024), (1, 32, 8, 8192), (1, 32, 8, 32768), (8, 32, 8, 1024),
          (8, 32, 8, 8192), (8, 32, 8, 32768), (1, 32, 8, 16384), (1, 32, 4, 32768)]
triggers = [int(t) for t in sys.argv[2].split(",")] if len(sys.argv) > 2 else [-1, 0, 2, 6]
rows = []
for (B, H, Hk, L) in shapes:
    dim = 128
    kv_bytes = 2 * B * Hk * L * dim * 2
    sets = []
    for _ in range(ba.copies_for(kv_bytes)):
        q = torch.randn(B, H, 1, dim, device="cuda", dtype=torch.float16)
        k = torch.randn(B, Hk, L, dim, device="cuda", dtype=torch.float16)
        sets.append((q, k, torch.randn_like(k), torch.full((B,), L - 1, dtype=torch.int64, device="cuda")))
    row = {"B": B, "H": H, "Hkv": Hk, "L": L}
    plan = [ba.Ours(q, k, v, p, softmax="unified") for q, k, v, p in sets]
    row["splits"], row["cluster"] = plan[0].splits, plan[0].cluster
    variants = [("cudnn_us", [ba.sdpa("cudnn", q, k, v, gqa=H != Hk) for q, k, v, _ in sets])]
    last = None
    if plan[0].splits > 1 and not plan[0].cluster:
        last = [ba.Ours(q, k, v, p, softmax="unified", decode_combine="last_split", semaphores=True) for q, k, v, p in sets]
    for t in triggers:
        variants.append((f"plan_t{t}_us", [with_env(t, c) for c in plan]))
        if last:
            variants.append((f"last_t{t}_us", [with_env(t, c) for c in last]))
    ba.time_variants(row, variants, False)
    os.environ.pop("FDPP_ATTN_TRIGGER_AHEAD", None)
    c = row["cudnn_us"]
    parts = " ".join(f"{k[:-3]}={v:.2f}({c / v:.3f})" for k, v in row.items() if k.endswith("_us") and k != "cudnn_us" and v)
    print(f"B{B} {H}/{Hk} L{L} s{row['splits']}{'c' if row['cluster'] else ''} cudnn {c:.2f}: {parts}", flush=True)
    rows.append(row)
    del sets, plan, last, variants
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
