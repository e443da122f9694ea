"""Reading an ONNX file the user named, with the one-line errors every command shares: a missing file, a folder,
an empty (0-byte) or truncated file and any other file that is not an ONNX model are refused here, before a
pass, a session or polygraphy sees them; so is an external data file (model.onnx.data) that is missing or shorter
than the tensors the model says it holds."""

from __future__ import annotations

from pathlib import Path

from fdpp_rewrite.errors import FdppError

HINT = "export one with `python -m fdpp_rewrite export <preset>`"
BROKEN = "re-export it (`python -m fdpp_rewrite export`) or re-run rewrite"
FIND_DATA = "copy it beside the model again, re-export or re-run rewrite"  # a missing or cut-short .data file


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
    check_external_data(path, model)
    return model


def check_external_data(path: Path, model) -> None:
    """Every external tensor of `model` (read from `path`) lies inside its data file.

    e.g. a model.onnx.data cut short by a failed copy ->
    FdppError("cannot load model.onnx: its weights file model.onnx.data is truncated (it has 1000000 bytes, ...")
    """
    import onnx

    sizes = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        fields = {entry.key: entry.value for entry in tensor.external_data}
        data = path.parent / fields.get("location", "")
        if data not in sizes:
            if not data.is_file():
                raise FdppError(f"cannot load {path}: it keeps its weights in {data}, which is missing; {FIND_DATA}")
            sizes[data] = data.stat().st_size
        end = int(fields.get("offset", 0)) + _external_length(tensor, fields)
        if end > sizes[data]:
            raise FdppError(f"cannot load {path}: its weights file {data} is truncated (it has {sizes[data]} bytes, "
                            f"tensor '{tensor.name}' ends at byte {end}); {FIND_DATA}")


def _external_length(tensor, fields: dict) -> int:
    """Bytes of an external tensor: its `length` entry, else its element count times the element size."""
    if "length" in fields:
        return int(fields["length"])
    from onnx import helper

    count = 1
    for dim in tensor.dims:
        count *= dim
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
