"""The SentencePiece BPE vocabulary of a GGUF file (tokenizer.ggml.model "llama", Gemma's): pieces merge in the
order of their scores, a space is "▁", unknown characters fall back to <0xNN> byte pieces, control pieces are
special and user-defined ones (Gemma's runs of newlines) match verbatim and decode as text."""

from fdpp_rewrite.tokenizer import Tokenizer

NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6
PIECES = [("<pad>", CONTROL, 0.0), ("<eos>", CONTROL, 0.0), ("<bos>", CONTROL, 0.0), ("<unk>", CONTROL, 0.0),
          ("<start_of_turn>", CONTROL, 0.0), ("\n\n", USER_DEFINED, 0.0), ("<0xC3>", BYTE, 0.0),
          ("<0xA9>", BYTE, 0.0), ("▁", NORMAL, -10.0), ("a", NORMAL, -10.0), ("b", NORMAL, -10.0),
          ("c", NORMAL, -10.0), ("ab", NORMAL, -1.0), ("▁a", NORMAL, -2.0), ("abc", NORMAL, -2.5),
          ("▁ab", NORMAL, -3.0)]


def _tokenizer():
    return Tokenizer.from_gguf_fields({
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": [p for p, _, _ in PIECES],
        "tokenizer.ggml.token_type": [t for _, t, _ in PIECES], "tokenizer.ggml.scores": [s for _, _, s in PIECES],
        "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": False})


def test_pieces_merge_by_score():
    tokenizer = _tokenizer()
    pieces = lambda text: [PIECES[i][0] for i in tokenizer.encode(text, add_bos=False)]  # noqa: E731
    assert pieces("ab") == ["ab"]  # no space prefix: "ab", not "▁ab"
    # "ab" merges first (-1); then "abc" (-2.5) beats "▁ab" (-3): the score, not the id or the length, decides
    assert pieces("ab abc") == ["ab", "▁", "abc"]
    assert pieces(" ab") == ["▁ab"]


def test_bytes_user_defined_and_control_pieces():
    tokenizer = _tokenizer()
    text = "ab\n\né<start_of_turn>"
    ids = tokenizer.encode(text)
    assert [PIECES[i][0] for i in ids] == ["<bos>", "ab", "\n\n", "<0xC3>", "<0xA9>", "<start_of_turn>"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<bos>" + text
    assert tokenizer.decode(ids) == "ab\n\né"  # control pieces skipped, the user-defined newlines kept
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.add_bos) == (2, 1, True)
