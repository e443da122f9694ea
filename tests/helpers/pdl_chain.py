"""The check every programmatic-dependent-launch chain test makes: a chain of kernels whose intermediates it
poisons with NaN, run with PDL, must give the result of the same chain without PDL bit for bit, eagerly many times
and replayed from a CUDA graph."""

from gpu_kernels import capture_graph


def assert_pdl_chain_exact(chain, out, graph_chains: int = 4) -> None:
    """chain(pdl: bool) launches the chain (NaN into its intermediates first) and writes out."""
    import torch

    chain(pdl=False)
    torch.cuda.synchronize()
    expected = out.clone()
    assert not torch.isnan(expected).any()
    for _ in range(20):
        out.fill_(float("nan"))
        chain(pdl=True)
    torch.cuda.synchronize()
    assert torch.equal(out, expected), "with PDL a kernel of the chain read a stale input"

    def chains():
        for _ in range(graph_chains):
            chain(pdl=True)

    graph = capture_graph(chains)
    for _ in range(5):
        out.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected), "the replayed chain with PDL differs from the plain launches"
