"""The engine on graphs torch.onnx.export writes from transformers' models (tests/helpers/hf_exports.py, decode with
cache, dynamo=True and dynamo=False), cpu backend: build + Engine.generate give transformers' own greedy tokens and
onnxruntime's on the original graph, a batch of two lengths gives each sequence's tokens alone, the present Concat
is an in-place write into the engine's cache, the slot methods work, and bad graphs are one-line errors."""

import io

import numpy as np
import onnx
import pytest
import torch

from fdpp_rewrite.engine.build import build_engine
from fdpp_rewrite.engine.hf_interface import BUFFER_PREFIX
from fdpp_rewrite.engine.runtime import Engine
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.rewrite import rewrite_file

pytest.importorskip("transformers")
pytest.importorskip("onnxscript")  # the dynamo exporter needs it
hf_exports = pytest.importorskip("hf_exports")

FAMILIES = hf_exports.FAMILIES  # RoPE from position_ids (llama, mistral, qwen2), OPT's positions from the mask
CASES = [(family, exporter) for family in FAMILIES for exporter in ("dynamo", "torchscript")]
PROMPTS = [[1, 5, 9, 22, 7, 64, 3], [3, 4, 100]]
NEW_TOKENS = 12
MAX_SEQ = 48  # under the tiny configs' 64 positions


@pytest.fixture(scope="module")
def exports(hf_export, tmp_path_factory):
    """(family, exporter, kind) -> (original, rewritten) paths: the session's export (tests/conftest.py, shared
    with the rewriter's and compare's tests), rewritten here on first use."""
    folder = tmp_path_factory.mktemp("hf-engine")
    made = {}

    def get(family, exporter, kind="decode"):
        key = (family, exporter, kind)
        if key not in made:
            original = hf_export(family, exporter == "dynamo", kind == "decode")
            rewritten = rewrite_file(original, output=folder / f"{original.stem}.fdpp.onnx", stream=io.StringIO())
            made[key] = original, rewritten
        return made[key]

    return get


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def built(request, exports, tmp_path_factory):
    family, exporter = request.param
    original, rewritten = exports(family, exporter)
    engine_dir = tmp_path_factory.mktemp("engine") / "engine"
    build_engine(rewritten, engine_dir, backend="cpu", max_batch=4, max_seq=MAX_SEQ, stream=io.StringIO())
    return family, original, engine_dir


@pytest.fixture(scope="module")
def engine(built):
    return Engine(built[2])


def transformers_greedy(family, prompt, steps):
    """transformers' own greedy generate on the model the export came from (same seed, same weights)."""
    model = hf_exports._model(family, "eager")  # noqa: SLF001 - the helper's model, as it was exported
    model.generation_config.eos_token_id = None  # the engine here has no stop ids: never stop early
    out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.int64))
    return out[0, len(prompt):].tolist()


def onnxruntime_greedy(path, prompt, steps):
    """(tokens, logits of each step [steps, V]): greedy decoding of the original (standard-op) graph in
    onnxruntime, feeding back its presents."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    metas = {m.name: m for m in session.get_inputs()}
    past_names = [n for n in metas if n.startswith("past_key_values.")]
    kv_heads, head_dim = metas[past_names[0]].shape[1], metas[past_names[0]].shape[3]
    past = {n: np.zeros((1, kv_heads, 0, head_dim), np.float32) for n in past_names}
    ids, tokens, step_logits = list(prompt), [], []
    step_ids = ids
    for _ in range(steps):
        start = len(ids) - len(step_ids)
        feed = {"input_ids": np.array([step_ids], np.int64), "attention_mask": np.ones((1, len(ids)), np.int64),
                "position_ids": np.arange(start, len(ids), dtype=np.int64)[None], **past}
        if "cache_position" in metas:
            feed["cache_position"] = np.arange(start, len(ids), dtype=np.int64)
        names = ["logits"] + [n.replace("past_key_values", "present") for n in past_names]
        logits, *presents = session.run(names, feed)
        past = dict(zip(past_names, presents))
        step_logits.append(logits[0, -1])
        tokens.append(int(logits[0, -1].argmax()))
        ids.append(tokens[-1])
        step_ids = [tokens[-1]]
    return tokens, np.stack(step_logits)


def test_the_build_lowers_every_present_concat(built, engine):
    """RoPE models: each layer's RoPE and cache Concats become one RopeAppend writing the engine's caches, the
    kernels of an fdpp export's layer; OPT and GPT-2 (learned positions): each present Concat becomes a CacheAppend."""
    plan = engine.plan
    writers = {o: n["op"] for n in plan["nodes"] if n["op"] in ("CacheAppend", "RopeAppend") for o in n["outputs"]}
    presents = [name.replace("past_key_values", "present") for name in engine.cache_names]
    assert plan["interface"] == "hf" and engine.manifest["interface"] == "hf"
    expected = "CacheAppend" if built[0] in ("opt", "gpt2") else "RopeAppend"
    assert [writers.get(p) for p in presents] == [expected] * len(presents)
    ops = [n["op"] for n in plan["nodes"]]
    if expected == "RopeAppend":  # no rotation is left as ops
        assert ops.count("RopeAppend") == hf_exports.LAYERS and not {"Sin", "Cos", "Neg"} & set(ops)
    assert engine.num_layers == hf_exports.LAYERS and engine.vocab_size == hf_exports.VOCAB


def test_greedy_tokens_equal_transformers_and_onnxruntime(built, engine):
    """The tokens, and every step's logits (the tiny random GPT-2 and OPT repeat one token, so the logits are what
    tells there), against onnxruntime on the original graph."""
    from fdpp_rewrite.engine.runtime import Sampler

    family, original, _ = built
    captured, greedy = [], Sampler()

    def record(logits):
        captured.append(logits[0].float().numpy())
        return greedy(logits)

    tokens = engine.generate([PROMPTS[0]], NEW_TOKENS, sampler=record).tokens[0]
    assert tokens == transformers_greedy(family, PROMPTS[0], NEW_TOKENS)
    expected_tokens, expected_logits = onnxruntime_greedy(original, PROMPTS[0], NEW_TOKENS)
    assert tokens == expected_tokens
    np.testing.assert_allclose(np.stack(captured), expected_logits, atol=2e-4, rtol=2e-4)


def test_batch_of_two_lengths_equals_each_alone(built, engine):
    family = built[0]
    together = engine.generate(PROMPTS, NEW_TOKENS).tokens
    assert together == [transformers_greedy(family, p, NEW_TOKENS) for p in PROMPTS]
    assert together == [engine.generate([p], NEW_TOKENS).tokens[0] for p in PROMPTS]


def test_cache_written_in_place(engine):
    """The presents of a decode step are views of the engine's cache allocation, and the step writes each
    sequence's new row at its own length: no cache is copied."""
    engine.reset()
    for slot, prompt in enumerate(PROMPTS):
        engine.prefill(slot, prompt)
    pointers = [cache.data_ptr() for cache in engine.caches]
    before = [cache.clone() for cache in engine.caches]
    from fdpp_rewrite.engine.interpreter import trace

    lengths = engine.past_len[:2]
    engine.step_ids[:2, 0] = torch.tensor([11, 12])
    feeds = engine.feeds(engine.step_ids[:2], lengths, slice(0, 2), engine.decode_buckets(2)[1])
    presents = [name.replace("past_key_values", "present") for name in engine.cache_names]
    outputs, _ = trace(engine.nodes, presents, feeds, engine.weights, engine.host_values, engine.backend)
    assert [cache.data_ptr() for cache in engine.caches] == pointers
    for name, present, cache, old in zip(engine.cache_names, presents, engine.caches, before):
        assert outputs[present].data_ptr() == cache.data_ptr()  # the present is the cache view itself
        assert outputs[present].shape[2] == feeds[BUFFER_PREFIX + name].shape[2]
        changed = (cache != old).any(dim=-1).any(dim=1)  # [slot, row]: rows the step wrote
        assert changed.nonzero().tolist() == [[b, len(p)] for b, p in enumerate(PROMPTS)]


def test_slots_chunked_prefill_and_decode_equal_generate(engine):
    """The server's path: a prompt prefilled in two chunks into slot 1 and decoded with decode_slots, next to a
    sequence in slot 0, gives the tokens generate gives it alone."""
    prompt, other = PROMPTS[0], PROMPTS[1]
    alone = engine.generate([prompt], 6).tokens[0]
    engine.reset()
    engine.prefill_chunk(0, other)
    engine.prefill_chunk(1, prompt[:4])
    logits = engine.prefill_chunk(1, prompt[4:])
    tokens = [int(logits.argmax())]
    for _ in range(5):
        logits = engine.decode_slots([1], torch.tensor([tokens[-1]]))
        tokens.append(int(logits[0].argmax()))
    assert tokens == alone
    assert engine.lengths[:2] == [len(other), len(prompt) + 5]


def test_cli_build_and_run(exports, tmp_path, capsys):
    from fdpp_rewrite.cli import main

    _, rewritten = exports("llama", "dynamo")
    engine_dir = tmp_path / "engine"
    assert main(["build", str(rewritten), "-o", str(engine_dir), "--backend", "cpu", "--max-seq", "32"]) == 0
    assert main(["run", str(engine_dir), "--token-ids", ",".join(map(str, PROMPTS[0])), "--max-new-tokens",
                 "5"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert [int(t) for t in printed.split(",")] == transformers_greedy("llama", PROMPTS[0], 5)


def test_a_prefill_only_export_is_refused(exports, tmp_path):
    _, rewritten = exports("llama", "torchscript", "prefill")
    with pytest.raises(FdppError, match="prefill-only Hugging Face export .* decode-with-cache export") as error:
        build_engine(rewritten, tmp_path / "engine", backend="cpu", stream=io.StringIO())
    assert "\n" not in str(error.value)


def _edited(rewritten, tmp_path, edit):
    model = onnx.load(str(rewritten))
    edit(model.graph)
    path = tmp_path / "edited.fdpp.onnx"
    onnx.save(model, str(path))
    return path


def _extra_input(graph):
    graph.input.append(onnx.helper.make_tensor_value_info("token_type_ids", onnx.TensorProto.INT64, ["b", "s"]))


def _present_through_another_op(graph):
    concat = next(n for n in graph.node if "present.0.key" in n.output)
    concat.output[0] = "concat_out"
    graph.node.append(onnx.helper.make_node("Neg", ["concat_out"], ["present.0.key"]))


@pytest.mark.parametrize("edit, message", [
    (_extra_input, "takes the input 'token_type_ids'; the engine feeds a Hugging Face graph only"),
    (_present_through_another_op, "present.0.key is not Concat"),
])
def test_graphs_the_engine_cannot_feed_are_one_line_errors(exports, tmp_path, edit, message):
    _, rewritten = exports("llama", "dynamo")
    with pytest.raises(FdppError, match=message) as error:
        build_engine(_edited(rewritten, tmp_path, edit), tmp_path / "engine", backend="cpu", stream=io.StringIO())
    assert "\n" not in str(error.value)


def test_gather_nd_and_flatten_equal_the_onnx_reference():
    """The two standard ops only these exports need (dynamo's GatherND, TorchScript's Flatten), negative indices
    included, against onnx's reference evaluator."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from fdpp_rewrite.engine import ops

    data = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    indices = np.array([[0, -1], [1, 0], [-2, 2]], np.int64)
    graph = helper.make_graph(
        [helper.make_node("GatherND", ["data", "indices"], ["gathered"]),
         helper.make_node("Flatten", ["data"], ["flat"], axis=2)], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [2, 3, 4]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [3, 2])],
        [helper.make_tensor_value_info("gathered", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("flat", TensorProto.FLOAT, None)])
    gathered, flat = ReferenceEvaluator(helper.make_model(graph)).run(None, {"data": data, "indices": indices})
    got = ops.LOWERINGS["GatherND"]({}, {})(torch.from_numpy(data), torch.from_numpy(indices))
    np.testing.assert_array_equal(got.numpy(), gathered)
    np.testing.assert_array_equal(ops.LOWERINGS["Flatten"]({"axis": 2}, {})(torch.from_numpy(data)).numpy(), flat)
