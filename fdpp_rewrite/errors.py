"""User-facing errors: one line that says what went wrong and what to do about it.

Two kinds reach the user. An FdppError, or an environment problem (permissions, a full disk, memory), is an
`error: ...` line and exit code 2; anything else is a bug in fdpp_rewrite (exit code 3, `internal error: ...`)."""

import errno


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


def run_script(main) -> None:
    """Exit with main()'s code, for the scripts in scripts/: an FdppError or an environment problem is one
    `error: ...` line on stderr and exit code 2, as in the CLI; anything else keeps its traceback (a bug)."""
    import sys

    try:
        code = main()
    except Exception as exc:  # noqa: BLE001 - sorted below: the user's problem, or a bug
        problem = exc if isinstance(exc, FdppError) else environment_error(exc)
        if problem is None:
            raise
        print(f"error: {problem}", file=sys.stderr)
        code = 2
    sys.exit(code)


def cannot_load(path, exc: BaseException) -> FdppError:
    """The error for a model file that onnx or onnxruntime cannot load (corrupt, truncated, data file missing)."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return FdppError(f"cannot load {path}: {first.rstrip('.')}; re-export or re-run rewrite")


# errno -> (what happened, what to do): the OSErrors that come from the user's machine, not from our code
_ENVIRONMENT_ERRNOS = {
    errno.EACCES: ("permission denied", "fix its permissions or choose another path (-o)"),
    errno.EPERM: ("operation not permitted", "fix its permissions or choose another path (-o)"),
    errno.EROFS: ("the file system is read-only", "choose a folder on a writable disk (-o)"),
    errno.ENOSPC: ("no space left on the device", "free some space or choose a folder on another disk (-o)"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space or choose a folder on another disk (-o)"),
}


def environment_error(exc: BaseException) -> FdppError | None:
    """The one-line error for an environment problem, or None when `exc` is not one (then it is a bug).

    e.g. OSError(ENOSPC) while writing model.onnx.data ->
    "cannot write model.onnx.data: no space left on the device; free some space or choose a folder on ..."
    """
    if isinstance(exc, MemoryError):
        return FdppError("out of memory; close other programs, or use a smaller model or fewer --layers")
    if not isinstance(exc, OSError) or exc.errno not in _ENVIRONMENT_ERRNOS:
        return None
    what, fix = _ENVIRONMENT_ERRNOS[exc.errno]
    where = f" {exc.filename}" if exc.filename else ""
    return FdppError(f"cannot write{where}: {what}; {fix}" if exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT)
                     else f"cannot access{where}: {what}; {fix}")
