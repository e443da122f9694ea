"""Fixtures of the serve tests: a tiny-llama engine on the cpu backend that carries a tokenizer, as an engine
built from a real checkpoint does.

tiny-llama is random-init and has no tokenizer of its own, so the export gets a small byte-level BPE one made
here (256 byte tokens, merges of letter pairs, ChatML's two special tokens and a ChatML chat template: 397 ids,
the preset's vocabulary), written beside the export the way `export` writes a checkpoint's (model.tokenizer.json
+ the metadata's tokenizer fields); `build` then copies it into the engine folder."""

import io
import itertools
import json
import string

import pytest
from serve_server import RunningServer

PRESET, VOCAB = "tiny-llama", 397
MAX_BATCH, MAX_SEQ = 4, 512
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|im_start|>", "<|im_end|>"]


def byte_level_tokenizer():
    """A tokenizers.Tokenizer of exactly VOCAB ids: bytes, then letter-pair merges, then the special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    merges = []
    for a, b in itertools.product(string.ascii_lowercase, repeat=2):
        if len(vocab) == VOCAB - len(SPECIALS):
            break
        merges.append((a, b))
        vocab[a + b] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    assert backend.get_vocab_size(with_added_tokens=True) == VOCAB
    return backend


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory):
    from fdpp_rewrite.engine.build import build_engine
    from fdpp_rewrite.export import companion_paths, export_model
    from fdpp_rewrite.rewrite import rewrite_file

    folder = tmp_path_factory.mktemp("serve_engine")
    onnx_path = folder / "model.onnx"
    export_model(PRESET, onnx_path, dtype="float32", max_cache=MAX_SEQ, progress=False)
    _, metadata_path, tokenizer_path = companion_paths(onnx_path)
    byte_level_tokenizer().save(str(tokenizer_path))
    metadata = json.loads(metadata_path.read_text())
    metadata["tokenizer"] = {"file": tokenizer_path.name, "bos_id": None, "eos_id": VOCAB - 1,
                             "chat_template": CHAT_TEMPLATE, "add_bos": False}
    metadata_path.write_text(json.dumps(metadata))
    rewritten = rewrite_file(onnx_path, stream=io.StringIO())
    build_engine(rewritten, folder / "engine", backend="cpu", max_batch=MAX_BATCH, max_seq=MAX_SEQ,
                 stream=io.StringIO())
    return folder / "engine"


@pytest.fixture(scope="session")
def tokenizer(engine_dir):
    from fdpp_rewrite.engine.manifest import read_manifest
    from fdpp_rewrite.tokenizer import Tokenizer

    return Tokenizer.load(engine_dir, read_manifest(engine_dir)["tokenizer"])


@pytest.fixture(scope="session")
def server(engine_dir):
    running = RunningServer(engine_dir, max_queue=4, prefill_chunk=32)
    yield running
    running.close()
