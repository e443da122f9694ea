"""User-facing errors: one line that says what went wrong and what to do about it."""


class FdppError(Exception):
    """A failure the user can act on. The CLI prints `error: <message>` and exits with code 2.

    Write the message as one line naming the fix, e.g.
    "unknown preset 'llama3' (known: llama2-7b, ...); pass a preset name or a checkpoint path".
    """


class NoGpuError(FdppError):
    """Raised where a command needs a CUDA GPU and none is visible."""


def require_gpu(what: str) -> None:
    """Raise NoGpuError unless torch sees a CUDA device; `what` names the step that needs it."""
    try:
        import torch
    except ImportError as exc:
        raise NoGpuError(f"{what} needs PyTorch with CUDA; install torch with CUDA support") from exc
    if not torch.cuda.is_available():
        raise NoGpuError(f"{what} needs a CUDA GPU and none is visible; run it on a machine with an NVIDIA GPU")


def cannot_load(path, exc: BaseException) -> FdppError:
    """The error for a model file that onnx or onnxruntime cannot load (corrupt, truncated, data file missing)."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return FdppError(f"cannot load {path}: {first.rstrip('.')}; re-export or re-run rewrite")
