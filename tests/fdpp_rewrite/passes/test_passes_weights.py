"""Weights during a rewrite: lazy reads from the input's data file, lazy concatenation, and the store that
streams the output's weights to its data file."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from rewrite_graphs import TinyConfig, build_tiny_model

from fdpp_rewrite.passes.weights import (ALIGNMENT, ConcatValues, ExternalValues, WeightStore, attach_external_data,
                                         concat_constant, load_values)
from fdpp_rewrite.rewrite import rewrite_file


def test_store_streams_big_tensors_aligned(tmp_path):
    store = WeightStore(tmp_path / "w.data")
    big = np.arange(3000, dtype=np.float32).reshape(60, 50)
    small = np.arange(10, dtype=np.float16)
    a, b, c = store.constant("a", big), store.constant("small", small), store.constant("c", big * 2)
    assert isinstance(a._values, ExternalValues) and isinstance(b.values, np.ndarray)  # small stays inline
    offsets = [int(next(e.value for e in t._values.tensor.external_data if e.key == "offset")) for t in (a, c)]
    assert offsets[0] == 0 and offsets[1] % ALIGNMENT == 0 and offsets[1] >= big.nbytes
    np.testing.assert_array_equal(load_values(a), big)  # readable while the file is still open
    np.testing.assert_array_equal(load_values(c), big * 2)
    store.close()


def test_in_memory_store_and_discard(tmp_path):
    assert isinstance(WeightStore().constant("a", np.ones((100, 100))).values, np.ndarray)
    store = WeightStore(tmp_path / "partial.data")
    store.constant("a", np.ones((100, 100), np.float32))
    store.discard()
    assert not (tmp_path / "partial.data").exists()


def test_concat_is_lazy_and_exact():
    parts = [gs.Constant("p0", np.ones((4, 3), np.float32)), gs.Constant("p1", np.zeros((4, 5), np.float32))]
    fused = concat_constant("fused", parts, axis=1)
    assert isinstance(fused._values, ConcatValues) and list(fused.shape) == [4, 8] and fused.dtype == np.float32
    np.testing.assert_array_equal(load_values(fused), np.concatenate([parts[0].values, parts[1].values], axis=1))
    assert onnx.numpy_helper.to_array(fused._values.tensor).shape == (4, 8)


def test_external_weights_are_read_without_caching(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(build_tiny_model(TinyConfig(layers=1)), str(path), save_as_external_data=True, location="m.onnx.data")
    graph = gs.import_onnx(onnx.load(str(path), load_external_data=False))
    assert attach_external_data(graph, str(tmp_path)) > 0
    weight = next(t for t in graph.tensors().values() if isinstance(t, gs.Constant) and len(t.shape) == 2
                  and isinstance(t._values, ExternalValues))
    values = load_values(weight)
    assert values.shape == tuple(weight.shape) and isinstance(weight._values, ExternalValues)  # still lazy


def test_streamed_rewrite_writes_each_weight_once(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(build_tiny_model(TinyConfig(layers=2, hidden=64, intermediate=160, vocab=300)), str(path),
              save_as_external_data=True, location="m.onnx.data")
    output = rewrite_file(path, stream=open("/dev/null", "w"))
    size_in = (tmp_path / "m.onnx.data").stat().st_size
    size_out = (tmp_path / "m.fdpp.onnx.data").stat().st_size
    tensors = len(onnx.load(str(output), load_external_data=False).graph.initializer)
    assert size_out <= size_in + tensors * ALIGNMENT  # transposed and fused, but nothing written twice
    external = [t for t in onnx.load(str(output), load_external_data=False).graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external and {e.value for t in external for e in t.external_data if e.key == "location"} == \
        {"m.fdpp.onnx.data"}  # every weight in the output's own file, none left in the input's
