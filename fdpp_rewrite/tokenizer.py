"""A small tokenizer wrapper over the `tokenizers` package: encode, decode, bos/eos ids and the chat template.

Built from a GGUF file's vocabulary (byte-level BPE, tokenizer.ggml.model "gpt2", or SentencePiece BPE, "llama"
as Gemma's GGUF files have it), from a Hugging Face
directory's tokenizer.json, or from the files the exporter writes beside a model (model.tokenizer.json plus
the fields in model.fdpp.json)."""

import json
from functools import cached_property
from pathlib import Path

from fdpp_rewrite.errors import FdppError

# GGUF token types (llama.cpp's llama_token_type): 1 = normal, 3 = control, 4 = user defined. Both of the last
# must match verbatim.
_NORMAL_TOKEN_TYPE, _CONTROL_TOKEN_TYPE, _USER_DEFINED_TOKEN_TYPE = 1, 3, 4
_SPECIAL_TOKEN_TYPES = (_CONTROL_TOKEN_TYPE, _USER_DEFINED_TOKEN_TYPE)


class Tokenizer:
    def __init__(self, backend, bos_id: int | None, eos_id: int | None, chat_template: str | None = None,
                 add_bos: bool = False):
        self.backend = backend  # a tokenizers.Tokenizer
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.chat_template = chat_template
        self.add_bos = add_bos
        self._plain = None  # a copy of backend that reads special-token text as plain text (made on first use)

    @cached_property
    def special_tokens(self) -> list[str]:
        """The text of every special token (e.g. "<|im_end|>")."""
        return [t.content for t in self.backend.get_added_tokens_decoder().values() if t.special]

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None, special: bool = True) -> list[int]:
        """special=False: special-token text in `text` is tokenized as plain text, not as the special token."""
        ids = (self.backend if special else self._plain_backend()).encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def _plain_backend(self):
        if self._plain is None:  # a copy: flipping the shared backend would race a decode on another thread
            from tokenizers import Tokenizer as Backend

            self._plain = Backend.from_str(self.backend.to_str())
            self._plain.encode_special_tokens = True
        return self._plain

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for a conversation, rendered with the model's own Jinja chat template."""
        if not self.chat_template:
            raise FdppError("this tokenizer has no chat template; drop --chat or use a chat model's tokenizer")
        import jinja2

        environment = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        try:
            template = environment.from_string(self.chat_template)
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=self._token_text(self.bos_id), eos_token=self._token_text(self.eos_id))
        except jinja2.TemplateError as exc:
            raise FdppError(f"cannot render the chat template: {exc}") from None

    def _token_text(self, token_id):
        return "" if token_id is None else (self.backend.id_to_token(token_id) or "")

    # -- construction --------------------------------------------------------------------------------------

    @classmethod
    def from_gguf_fields(cls, fields: dict):
        """From GGUF metadata (key -> value). None when the vocabulary is not byte-level BPE."""
        from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
        from tokenizers import Tokenizer as Backend

        if fields.get("tokenizer.ggml.model") == "llama" and fields.get("tokenizer.ggml.scores"):
            return cls._from_sentencepiece_fields(fields)
        if fields.get("tokenizer.ggml.model") != "gpt2":
            return None
        tokens = fields["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
        backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                     ignore_merges=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if fields.get("tokenizer.ggml.pre") == "smollm":
            # SmolLM splits every digit on its own before the GPT-2 regex
            backend.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"), byte_level])
        else:
            backend.pre_tokenizer = byte_level
        backend.decoder = decoders.ByteLevel()
        types = fields.get("tokenizer.ggml.token_type") or []
        special = [tokens[i] for i, t in enumerate(types) if t in _SPECIAL_TOKEN_TYPES]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        return cls(backend, fields.get("tokenizer.ggml.bos_token_id"), fields.get("tokenizer.ggml.eos_token_id"),
                   fields.get("tokenizer.chat_template"), bool(fields.get("tokenizer.ggml.add_bos_token", False)))

    @classmethod
    def _from_sentencepiece_fields(cls, fields: dict):
        """A SentencePiece BPE vocabulary (tokenizer.ggml.model "llama": pieces with scores, "▁" for a space,
        <0xNN> byte pieces), as Hugging Face's tokenizer.json writes Gemma's: each piece is a merge of two
        shorter pieces, the higher its score the earlier it merges. No space is prepended unless the file says
        add_space_prefix. Control pieces are special; user-defined ones (Gemma's runs of newlines and spaces)
        match verbatim but decode as text."""
        from tokenizers import AddedToken, decoders, models, normalizers
        from tokenizers import Tokenizer as Backend

        tokens, scores = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.scores"]
        types = fields.get("tokenizer.ggml.token_type") or [_NORMAL_TOKEN_TYPE] * len(tokens)
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = []
        for i, piece in enumerate(tokens):
            if types[i] != _NORMAL_TOKEN_TYPE:
                continue
            pairs = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
            merges += [(-scores[i], vocab[a], vocab[b], a, b) for a, b in pairs]
        merges.sort()
        unk = fields.get("tokenizer.ggml.unknown_token_id")
        backend = Backend(models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in merges], byte_fallback=True,
                                     fuse_unk=True, unk_token=None if unk is None else tokens[unk]))
        steps = [normalizers.Replace(" ", "▁")]
        if fields.get("tokenizer.ggml.add_space_prefix", False):
            steps.insert(0, normalizers.Prepend("▁"))
        backend.normalizer = normalizers.Sequence(steps)
        backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        backend.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                            for i, t in enumerate(types) if t == _USER_DEFINED_TOKEN_TYPE])
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                    for i, t in enumerate(types) if t == _CONTROL_TOKEN_TYPE])
        return cls(backend, fields.get("tokenizer.ggml.bos_token_id"), fields.get("tokenizer.ggml.eos_token_id"),
                   fields.get("tokenizer.chat_template"), bool(fields.get("tokenizer.ggml.add_bos_token", False)))

    @classmethod
    def from_hf_dir(cls, directory: Path, config: dict):
        """From a checkpoint's tokenizer.json (None when it has none)."""
        from tokenizers import Tokenizer as Backend

        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            return None
        try:
            backend = Backend.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for malformed files
            raise FdppError(f"cannot read {path}: {exc}") from None
        extra = {}
        tokenizer_config = Path(directory) / "tokenizer_config.json"
        if tokenizer_config.is_file():
            extra = json.loads(tokenizer_config.read_text())
        eos = config.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        template = extra.get("chat_template")
        return cls(backend, config.get("bos_token_id"), eos, template if isinstance(template, str) else None,
                   bool(extra.get("add_bos_token", False)))

    # -- the files beside an exported model -----------------------------------------------------------------

    def save(self, path: Path, file_name: str | None = None) -> dict:
        """Write the vocabulary to `path` (tokenizer.json format); return the fields to keep in the metadata.
        `file_name`: the name the file will have beside the model (when `path` is a temporary name)."""
        self.backend.save(str(path))
        return {"file": file_name or Path(path).name, "bos_id": self.bos_id, "eos_id": self.eos_id,
                "chat_template": self.chat_template, "add_bos": self.add_bos}

    @classmethod
    def load(cls, directory: Path, fields: dict):
        from tokenizers import Tokenizer as Backend

        path = Path(directory) / fields["file"]
        if not path.is_file():
            raise FdppError(f"tokenizer file {path} is missing; re-export the model or pass --tokenizer")
        return cls(Backend.from_file(str(path)), fields.get("bos_id"), fields.get("eos_id"),
                   fields.get("chat_template"), bool(fields.get("add_bos", False)))
