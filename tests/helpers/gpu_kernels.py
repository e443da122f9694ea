"""The GPU kernels a call launches, counted the way fdpp_rewrite.engine.bench.count_kernels counts a decode step."""


def kernels_launched(fn) -> list:
    """Names of the GPU kernels fn launches, copies and memsets left out."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return [n for n in names if not n.startswith(("Memcpy", "Memset"))]
