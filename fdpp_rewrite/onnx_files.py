"""Reading an ONNX file the user named, with the one-line errors every command shares: a missing file, a folder,
an empty (0-byte) or truncated file and any other file that is not an ONNX model are refused here, before a
pass, a session or polygraphy sees them."""

from __future__ import annotations

from pathlib import Path

from fdpp_rewrite.errors import FdppError

HINT = "export one with `python -m fdpp_rewrite export <preset>`"
BROKEN = "re-export it (`python -m fdpp_rewrite export`) or re-run rewrite"


def load_structure(path, hint: str = HINT):
    """The model at `path` without its external weight data (passes and checks read weights one at a time).

    e.g. a 0-byte model.onnx -> FdppError("model.onnx is not an ONNX model (the file is empty); re-export it ...")
    `hint`: what to do about a missing file.
    """
    import onnx

    path = Path(path)
    if path.is_dir():
        raise FdppError(f"{path} is a folder, not an ONNX model; pass the .onnx file inside it")
    if not path.is_file():
        raise FdppError(f"no ONNX file at {path}; {hint}")
    if path.stat().st_size == 0:
        raise FdppError(f"{path} is not an ONNX model (the file is empty); {BROKEN}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except OSError:
        raise  # unreadable (permissions, I/O): the CLI's environment errors say so
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and its kin: the bytes are not a model
        raise FdppError(f"{path} is not an ONNX model (truncated, or another kind of file); {BROKEN}") from None
    # protobuf parses many byte strings without complaint; a real model has an IR version and a graph
    if model.ir_version <= 0 or not (model.graph.node and model.graph.output):
        raise FdppError(f"{path} is not an ONNX model (no IR version or no graph in it); {BROKEN}")
    return model
