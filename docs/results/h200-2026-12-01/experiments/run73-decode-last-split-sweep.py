"""Sweep: decode kernel-combine vs last-split combine vs cuDNN, B1 (and some B2/B4), various L. Graph timing."""
import sys, json
sys.path.insert(0, "scripts")
import torch
import bench_attention as ba

rows = []
shapes = []
for L in (4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536):
    shapes.append((1, 32, 8, L))
for L in (2048, 4096, 8192, 16384):
    shapes.append((1, 32, 32, L))
for (B, H, Hk, L) in ((2, 32, 8, 16384), (2, 32, 8, 32768), (4, 32, 8, 8192), (1, 32, 4, 32768), (1, 40, 8, 32768), (1, 32, 8, 32768)):
    shapes.append((B, H, Hk, L))
for (B, H, Hk, L) in shapes:
    dim = 128
    kv_bytes = 2 * B * Hk * L * dim * 2
    sets = []
    for _ in range(ba.copies_for(kv_bytes)):
        q = torch.randn(B, H, 1, dim, device="cuda", dtype=torch.float16)
        k = torch.randn(B, Hk, L, dim, device="cuda", dtype=torch.float16)
        sets.append((q, k, torch.randn_like(k), torch.full((B,), L - 1, dtype=torch.int64, device="cuda")))
    row = {"B": B, "H": H, "Hkv": Hk, "L": L}
    ours = [ba.Ours(q, k, v, p, softmax="unified", decode_combine="kernel") for q, k, v, p in sets]
    row["splits"], row["cluster"] = ours[0].splits, ours[0].cluster
    variants = [("kernel_us", ours),
                ("cudnn_us", [ba.sdpa("cudnn", q, k, v, gqa=H != Hk) for q, k, v, _ in sets])]
    if ours[0].splits > 1:
        variants.append(("last_us", [ba.Ours(q, k, v, p, softmax="unified", decode_combine="last_split", semaphores=True)
                                     for q, k, v, p in sets]))
    ba.time_variants(row, variants, False)
    k_ = row.get("kernel_us"); l_ = row.get("last_us"); c_ = row.get("cudnn_us")
    print(f"B{B} H{H}/{Hk} L{L} splits {row['splits']} cl {row['cluster']}: kernel {k_:.2f} last {l_ or 0:.2f} cudnn {c_:.2f}"
          f"  last/kernel {(l_ or 0)/k_:.3f}  cudnn/kernel {c_/k_:.3f} cudnn/last {c_/(l_ or 1e9):.3f}", flush=True)
    rows.append(row)
    del sets, ours, variants
    torch.cuda.empty_cache()
json.dump(rows, open(sys.argv[1], "w"), indent=1)
