"""`python -m fdpp_rewrite compare`: PASS on a faithful rewrite, FAIL (exit 1) on a corrupted one."""

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from rewrite_graphs import TinyConfig, build_tiny_model

from fdpp_rewrite import cli
from fdpp_rewrite.compare_inputs import exporter_steps, generic_steps
from fdpp_rewrite.compare_onnx import compare_models
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.rewrite import rewrite_model

ALL_COMMANDS = dict(cli.COMMANDS)


def run_compare(monkeypatch, *argv):
    monkeypatch.setattr(cli, "COMMANDS", {"compare": ALL_COMMANDS["compare"]})
    return cli.main(["compare", *argv])


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("compare")
    model = build_tiny_model(TinyConfig(layers=2))
    rewritten = rewrite_model(model, stream=io.StringIO()).model
    onnx.save(model, str(folder / "tiny.onnx"))
    onnx.save(rewritten, str(folder / "tiny.fdpp.onnx"))
    return folder / "tiny.onnx", folder / "tiny.fdpp.onnx", rewritten


def corrupted(rewritten, tmp_path, op, name, value, drop_input=None):
    """A copy of the rewrite with one attribute of the first `op` node changed (that node chosen among those
    with input `drop_input` when given, and that input removed so the node stays valid)."""
    model = onnx.ModelProto()
    model.CopyFrom(rewritten)
    candidates = [n for n in model.graph.node if n.op_type == op]
    if drop_input is not None:
        candidates = [n for n in candidates if len(n.input) == drop_input + 1]
    node = candidates[0]
    if drop_input is not None:
        del node.input[drop_input]
    attr = next(a for a in node.attribute if a.name == name)
    attr.CopyFrom(helper.make_attribute(name, value))
    path = tmp_path / "corrupted.fdpp.onnx"
    onnx.save(model, str(path))
    return path


def test_faithful_rewrite_passes(monkeypatch, tiny_pair, capsys):
    original, rewritten, _ = tiny_pair
    assert run_compare(monkeypatch, str(original), str(rewritten), "--batch", "3") == 0
    out = capsys.readouterr().out
    for step in ("prefill", "decode", "chunk"):
        assert f"{step:8} logits" in out
    assert out.count("PASS") == 3 * 5 + 1 and "FAIL" not in out  # 3 steps x 5 outputs, then the verdict


@pytest.mark.parametrize("op, name, value, drop_input", [
    ("AsyncSoftmaxAttention", "scale", 0.5, None),       # the true scale is 1/sqrt(8)
    ("AsyncSoftmaxAttention", "mask_mode", "none", 3),   # no mask: reads the noise in the unwritten cache slots
    ("FlatGemm", "epilogue", "none", 2),                 # the o projection (x, weight, residual) loses its residual
])
def test_corrupted_rewrite_fails(monkeypatch, tiny_pair, tmp_path, capsys, op, name, value, drop_input):
    original, _, rewritten = tiny_pair
    path = corrupted(rewritten, tmp_path, op, name, value, drop_input)
    assert run_compare(monkeypatch, str(original), str(path)) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("FAIL") and "logits" in out


def test_phi_changes_speed_not_results(tiny_pair, tmp_path):
    """A phi far from the scores sends every row to the fallback: still exact, and the fallback is counted."""
    original, _, rewritten = tiny_pair
    report = compare_models(original, corrupted(rewritten, tmp_path, "AsyncSoftmaxAttention", "phi", 500.0))
    assert report.passed and report.fallback_rows > 0
    assert compare_models(original, rewritten).fallback_rows == 0


def test_float16_model_passes(tmp_path):
    model = build_tiny_model(TinyConfig(dtype="float16", layout="4d"))
    report = compare_models(model, rewrite_model(model, stream=io.StringIO()).model)
    assert report.passed and report.dtype == "float16" and len(report.rows) == 15


def test_second_model_must_be_the_rewrite(monkeypatch, tiny_pair, capsys):
    original, _, _ = tiny_pair
    assert run_compare(monkeypatch, str(original), str(original)) == 2
    assert "no fdpp nodes" in capsys.readouterr().err


def test_batch_must_mix_sequences(tiny_pair):
    original, rewritten, _ = tiny_pair
    with pytest.raises(FdppError, match="at least 2"):
        compare_models(original, rewritten, batch=1)


def test_exporter_steps_are_realistic(tiny_pair):
    original, _, _ = tiny_pair
    session = ort.InferenceSession(str(original))
    steps = exporter_steps(session, vocab=61, batch=3, prefill=6, rng=np.random.default_rng(0))
    prefill, decode, chunk = steps
    assert prefill["input_ids"].shape == (3, 6) and (prefill["past_len"] == 0).all()
    assert decode["input_ids"].shape == (3, 1) and len(set(decode["past_len"])) > 1
    assert chunk["input_ids"].shape == (3, 3) and len(set(chunk["past_len"])) > 1
    for feed in steps:
        assert feed["input_ids"].min() >= 0 and feed["input_ids"].max() < 61
    cache = decode["key_cache.0"]
    assert np.abs(cache[:, :, :6]).sum() > 0 and np.abs(cache[:, :, 6:]).sum() > 0  # prefill values, then noise
    np.testing.assert_array_equal(decode["key_cache.1"], chunk["key_cache.1"])


def test_generic_steps_for_other_graphs():
    class Meta:
        def __init__(self, name, type_, shape):
            self.name, self.type, self.shape = name, type_, shape

    class Session:
        def __init__(self, metas):
            self.metas = metas

        def get_inputs(self):
            return self.metas

    session = Session([Meta("input_ids", "tensor(int64)", ["batch", "seq"]),
                       Meta("attention_mask", "tensor(int64)", ["batch", "seq"]),
                       Meta("position_ids", "tensor(int64)", ["batch", "seq"])])
    (feed,) = generic_steps(session, vocab=50, batch=2, seq=5, rng=np.random.default_rng(0))
    assert feed["input_ids"].shape == (2, 5) and feed["input_ids"].max() < 50
    assert (feed["attention_mask"] == 1).all() and (feed["position_ids"][1] == np.arange(5)).all()
    with pytest.raises(FdppError, match="token_type_ids"):
        generic_steps(Session([Meta("token_type_ids", "tensor(int64)", ["batch", "seq"])]), 50, 2, 5,
                      np.random.default_rng(0))


@pytest.mark.parametrize("prefill, message", [("0", "--prefill must be at least 1, got 0"),
                                              ("-2", "--prefill must be at least 1, got -2"),
                                              ("22", "pass --prefill at most 21")])
def test_bad_prefill_is_one_line(monkeypatch, tiny_pair, capsys, prefill, message):
    original, rewritten, _ = tiny_pair
    assert run_compare(monkeypatch, str(original), str(rewritten), "--prefill", prefill) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_dynamic_cache_fits_the_prefill():
    """A cache input with a symbolic length gets max(32, prefill + 3) slots."""
    class Meta:
        def __init__(self, name, shape, type_):
            self.name, self.shape, self.type = name, shape, type_

    class Session:
        def get_inputs(self):
            return [Meta("input_ids", ["b", "s"], "tensor(int64)"), Meta("past_len", ["b"], "tensor(int64)"),
                    Meta("key_cache.0", ["b", 2, "max_cache", 4], "tensor(float)")]

        def run(self, names, feeds):
            return [np.zeros_like(feeds["key_cache.0"])]

    steps = exporter_steps(Session(), vocab=10, batch=2, prefill=40, rng=np.random.default_rng(0))
    assert steps[0]["key_cache.0"].shape == (2, 2, 43, 4)


@pytest.mark.parametrize("which", ["original", "rewritten"])
def test_missing_external_data_is_one_line(monkeypatch, tiny_pair, tmp_path, capsys, which):
    original, rewritten, _ = tiny_pair
    broken = tmp_path / f"{which}.onnx"
    source = onnx.load(str(original if which == "original" else rewritten))
    onnx.save(source, str(broken), save_as_external_data=True, location=f"{which}.onnx.data", size_threshold=0)
    (tmp_path / f"{which}.onnx.data").unlink()
    argv = [str(broken), str(rewritten)] if which == "original" else [str(original), str(broken)]
    assert run_compare(monkeypatch, *argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot load {broken}: " in err[0] and "re-export or re-run rewrite" in err[0]


def test_truncated_rewrite_is_one_line_in_the_reference_session(tiny_pair, tmp_path):
    from fdpp_rewrite.ref_session import make_reference_session

    _, rewritten, _ = tiny_pair
    broken = tmp_path / "broken.fdpp.onnx"
    broken.write_bytes(rewritten.read_bytes()[:200])
    with pytest.raises(FdppError, match=f"cannot load {broken}: .*re-export or re-run rewrite"):
        make_reference_session(broken)


# --- Hugging Face decode-with-cache graphs: inputs from the declared names and shapes ------------------------

class FakeMeta:
    def __init__(self, name, shape, type_="tensor(int64)"):
        self.name, self.shape, self.type = name, shape, type_


class FakeDecodeSession:
    """The interface of a decode-with-cache graph; run() returns presents one step longer than the past, and
    records what it was fed."""

    def __init__(self, past_shape=("batch", 2, "past", 64), outputs=("logits", "present.0.key", "present.0.value"),
                 extra=()):
        cache = "tensor(float)"
        self.inputs = [FakeMeta("input_ids", ["batch", "seq"]), FakeMeta("attention_mask", ["batch", "total"]),
                       FakeMeta("position_ids", ["batch", "seq"]),
                       FakeMeta("past_key_values.0.key", list(past_shape), cache),
                       FakeMeta("past_key_values.0.value", list(past_shape), cache), *extra]
        self.outputs = [FakeMeta(name, None, cache) for name in outputs]
        self.fed = []

    def get_inputs(self):
        return self.inputs

    def get_outputs(self):
        return self.outputs

    def run(self, names, feed):
        self.fed.append(feed)
        seq = feed["input_ids"].shape[1]
        return [np.concatenate([feed[n.replace("present", "past_key_values")],
                                np.ones((feed["input_ids"].shape[0], 2, seq, 64), np.float32)], axis=2)
                for n in names]


def test_hf_decode_steps_put_past_and_total_lengths_where_they_belong():
    from fdpp_rewrite.compare_inputs import HF_DECODE_STEPS, HF_PADDED_DECODE_STEPS, hf_steps

    session = FakeDecodeSession(extra=[FakeMeta("cache_position", ["seq"])])
    names, feeds = hf_steps(session, vocab=50, batch=3, prefill=6, rng=np.random.default_rng(0))
    assert names == ["prefill", "decode1", "decode2", "decode3", "padded-prefill", "padded-decode1",
                     "padded-decode2"]
    assert len(names) == 2 + HF_DECODE_STEPS + HF_PADDED_DECODE_STEPS
    for feed in feeds:
        seq = feed["input_ids"].shape[1]
        past = feed["past_key_values.0.key"].shape[2]
        assert feed["attention_mask"].shape == (3, past + seq)  # the mask covers the cache and the new tokens
        assert feed["position_ids"].shape == (3, seq) and feed["past_key_values.0.value"].shape == (3, 2, past, 64)
        np.testing.assert_array_equal(feed["cache_position"], np.arange(past, past + seq))
    assert [f["past_key_values.0.key"].shape[2] for f in feeds] == [0, 6, 7, 8, 0, 6, 7]
    np.testing.assert_array_equal(feeds[1]["position_ids"], [[6]] * 3)
    padded = feeds[names.index("padded-decode1")]
    np.testing.assert_array_equal(padded["attention_mask"][:, :3], [[1, 1, 1], [0, 0, 1], [0, 1, 1]])
    np.testing.assert_array_equal(padded["position_ids"], [[6], [4], [5]])  # positions count real tokens only
    assert session.fed == feeds  # each step ran on the presents the step before returned


@pytest.mark.parametrize("session, message", [
    (FakeDecodeSession(outputs=("logits", "present.0.key")), "returns no present.0.value"),
    (FakeDecodeSession(past_shape=("batch", 2, 16, 64)), "fixed past length 16"),
    (FakeDecodeSession(past_shape=("batch", "heads", "past", 64)), "static kv_heads and head_dim"),
    (FakeDecodeSession(extra=[FakeMeta("token_type_ids", ["batch", "seq"])]), "input 'token_type_ids'"),
])
def test_hf_interface_that_does_not_fit_is_one_line(session, message):
    from fdpp_rewrite.compare_inputs import hf_steps

    with pytest.raises(FdppError, match=message):
        hf_steps(session, vocab=50, batch=2, prefill=6, rng=np.random.default_rng(0))


def test_onnxruntime_failure_on_derived_inputs_is_one_line():
    from fdpp_rewrite.compare_inputs import hf_steps

    class Failing(FakeDecodeSession):
        def run(self, names, feed):
            raise RuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions\nmore detail")

    with pytest.raises(FdppError, match=r"could not run the original model on the prefill inputs .*Got invalid "
                                        r"dimensions\); check its input names and dims$"):
        hf_steps(Failing(), vocab=50, batch=2, prefill=6, rng=np.random.default_rng(0))


def test_blank_padding_zeroes_the_padded_positions_only():
    from fdpp_rewrite.compare_inputs import blank_padding

    mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])
    logits, present = np.ones((2, 1, 5)), np.ones((2, 3, 4, 8))
    blanked = blank_padding({"attention_mask": mask}, {"logits": logits, "present.0.key": present})
    assert blanked["logits"].sum() == logits.sum()  # the new token is real in both rows
    assert (blanked["present.0.key"][1, :, :2] == 0).all() and blanked["present.0.key"].sum() == present.sum() - 48
    prefill = blank_padding({"attention_mask": mask}, {"logits": np.ones((2, 4, 5))})["logits"]
    assert (prefill[1, :2] == 0).all() and prefill.sum() == 30
    unpadded = {"logits": logits}
    assert blank_padding({"attention_mask": np.ones((2, 4))}, unpadded) is unpadded


def test_hf_prefill_must_leave_a_real_token_after_the_padding():
    from fdpp_rewrite.compare_inputs import hf_steps

    with pytest.raises(FdppError, match="--prefill must be at least 3 for the left-padded batch, got 2"):
        hf_steps(FakeDecodeSession(), vocab=50, batch=2, prefill=2, rng=np.random.default_rng(0))
