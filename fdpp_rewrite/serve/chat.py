"""A conversation -> prompt token ids, with the model's chat template, and message content as plain text.

    ids = encode_chat(tokenizer, [{"role": "user", "content": "Hi"}], allow_special=False)

The template's own special tokens (`<|im_start|>`, `<|im_end|>`) are tokens; the same text inside a message is
not, unless the request passes allow_special_tokens: else a user could close their turn and open a system one.
A conversation whose content holds no special-token text is encoded in one piece, exactly as `run --chat` does.
One that does is rendered again with each content between markers; the template's pieces are encoded as usual,
the contents with special-token text read as plain text.
"""

from __future__ import annotations

import uuid

from fdpp_rewrite.errors import FdppError
from fdpp_rewrite.serve.schemas import APIError


def encode_chat(tokenizer, messages: list[dict], allow_special: bool) -> list[int]:
    text = render(tokenizer, messages)
    specials = [t for t in tokenizer.special_tokens if any(t in m["content"] for m in messages)]
    if allow_special or not specials:
        return tokenizer.encode(text)
    marker = f"\ue000{uuid.uuid4().hex}\ue001"  # private-use characters: no template or user writes them
    if any(marker in m["content"] for m in messages):
        raise APIError(400, "the message content holds the server's content marker; resend the request",
                       param="messages")
    pieces = render(tokenizer, [{**m, "content": marker + m["content"] + marker} for m in messages]).split(marker)
    if len(pieces) != 2 * len(messages) + 1 or "".join(pieces) != text:
        # the template changes or moves the content: where it lies in the prompt is unknown
        raise APIError(400, f"the message content holds the special token {specials[0]!r}, and this model's chat "
                            "template does not place content verbatim, so it cannot be read as plain text; remove "
                            "it, or pass allow_special_tokens: true to have it read as the token", param="messages")
    ids = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    for index, piece in enumerate(pieces):
        if piece:
            ids += tokenizer.encode(piece, add_bos=False, special=index % 2 == 0)  # odd pieces: content
    return ids


def render(tokenizer, messages: list[dict]) -> str:
    try:
        return tokenizer.apply_chat_template(messages)
    except FdppError as exc:
        raise APIError(400, str(exc), param="messages") from None
