"""Read bandwidth the anchor's way: torch.sum over 2 GiB, CUDA events, median of 20 after 3 warm-ups."""
import statistics, torch
x = torch.empty(2**30, dtype=torch.float16, device="cuda").normal_()
for view, t in (("fp16", x), ("fp32", x.view(torch.float32))):
    for _ in range(3):
        t.sum()
    ts = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); t.sum(); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    print(f"read bw torch.sum 2 GiB {view}: median {2**31 / statistics.median(ts) / 1e12:.3f} TB/s, best {2**31 / min(ts) / 1e12:.3f}")
