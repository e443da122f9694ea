"""The process group of a tensor-parallel engine (the ranks tensor_parallel.py's build wrote) at run time.

Loading a tensor-parallel engine folder makes the loading process rank 0 (its Engine holds a Leader); the Leader
starts N-1 follower processes (torch.multiprocessing, spawn), each loading its rank folder, and joins them in a
torch.distributed group (gloo on the cpu backend, NCCL on cuda: rank r on GPU r). Rank 0 runs the caller's code
(run, bench, serve); each state-changing Engine call (prefill, decode, ...; the methods marked @mirrored) is first
broadcast to the followers over a gloo control group, so every rank runs the same steps and only rank 0 samples
and prints.
"""

from __future__ import annotations

import functools
import os

from fdpp_rewrite.engine.tensor_parallel import rank_folder_name
from fdpp_rewrite.errors import FdppError

# NVLink multicast stays off in every process (the device notes: it can take a shared host's GPUs down)
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def mirrored(method):
    """A state-changing Engine call rank 0 of a tensor-parallel engine first broadcasts to the other ranks (not the
    calls it makes itself: prefill's chunks are part of the prefill the followers run)."""
    @functools.wraps(method)
    def call(self, *args):
        if self.leader is not None and not self._inside_call:
            self.leader.broadcast(method.__name__, args, self.active)
        self._inside_call += 1
        try:
            return method(self, *args)
        finally:
            self._inside_call -= 1
    return call


def set_multicast_off() -> None:
    os.environ.update(MULTICAST_OFF)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_group(backend: str, rank: int, size: int, port: int):
    """Join the engine's torch.distributed group; returns the gloo control group (the mirrored calls)."""
    import datetime

    import torch
    import torch.distributed as dist

    set_multicast_off()
    if backend == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if backend == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=size, timeout=datetime.timedelta(minutes=10))
    return dist.new_group(backend="gloo") if backend == "cuda" else dist.group.WORLD


def check_gpus(size: int) -> None:
    import torch

    count = torch.cuda.device_count()
    if size > count:
        raise FdppError(f"the engine is tensor-parallel over {size} GPUs and {count} are visible; run it on a machine "
                        f"with {size} GPUs (or rebuild with a smaller --tensor-parallel)")


def follower_main(engine_class, folder: str, rank: int, size: int, port: int, options: dict) -> None:
    """A follower rank: load its rank folder as an `engine_class` (the leader's Engine class, passed down so this
    module does not import the runtime), then run the calls rank 0 broadcasts until it says stop."""
    import torch.distributed as dist

    control = init_group(options["backend"], rank, size, port)
    engine, error = None, None
    try:
        engine = engine_class(os.path.join(folder, rank_folder_name(rank)), **options)
    except FdppError as exc:
        error = f"rank {rank}: {exc}"
    statuses = [None] * size
    dist.all_gather_object(statuses, error, group=control)
    if any(statuses):
        dist.destroy_process_group()
        return
    while True:
        message = [None]
        dist.broadcast_object_list(message, src=0, group=control)
        name, args, active = message[0]
        if name == "stop":
            break
        engine.active = active
        getattr(engine, name)(*[a.to(engine.device) if hasattr(a, "to") else a for a in args])
    dist.destroy_process_group()


class Leader:
    """Rank 0's side of a tensor-parallel engine: starts the followers, joins the group, broadcasts the calls."""

    def __init__(self, engine_class, folder, manifest: dict, options: dict):
        import atexit

        import torch.multiprocessing as mp

        self.size = int(manifest["tensor_parallel"])
        if options["backend"] == "cuda":
            check_gpus(self.size)
        set_multicast_off()  # before the followers start: they inherit the environment
        port = free_port()
        context = mp.get_context("spawn")
        self.followers = [context.Process(target=follower_main, daemon=True,
                                          args=(engine_class, str(folder), rank, self.size, port, options))
                          for rank in range(1, self.size)]
        for process in self.followers:
            process.start()
        self.control = init_group(options["backend"], 0, self.size, port)
        self.open = True
        atexit.register(self.close)

    def confirm(self, error: str | None) -> None:
        """Every rank reports whether it loaded; a failure anywhere is a one-line error here."""
        import torch.distributed as dist

        statuses = [None] * self.size
        dist.all_gather_object(statuses, error, group=self.control)
        failed = next((status for status in statuses if status), None)
        if failed:
            self.open = False
            self._finish()
            raise FdppError(failed)

    def broadcast(self, name: str, args: tuple, active: int) -> None:
        import torch.distributed as dist

        args = [a.cpu() if hasattr(a, "cpu") else a for a in args]
        dist.broadcast_object_list([(name, args, active)], src=0, group=self.control)

    def close(self) -> None:
        if self.open:
            self.open = False
            self.broadcast("stop", (), 0)
            self._finish()

    def _finish(self) -> None:
        import torch.distributed as dist

        for process in self.followers:
            process.join(timeout=60)
        if dist.is_initialized():
            dist.destroy_process_group()
