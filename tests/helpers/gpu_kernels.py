"""The GPU kernels a call launches, counted the way fdpp_rewrite.engine.bench.count_kernels counts a decode step; and
CUDA-graph capture of a call for the kernels' graph tests."""


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


def capture_graph(calls):
    """A CUDA graph of calls() captured on a side stream (as torch requires), ready to replay."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            calls()
    torch.cuda.current_stream().wait_stream(stream)
    return graph
