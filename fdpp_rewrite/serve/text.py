"""A sequence's new tokens as text deltas, with stop strings found across token boundaries.

    stream = TextStream(tokenizer, prompt_ids, stops=["\\n\\n"])
    delta, stopped = stream.push(token)   # the text safe to send now; True once a stop string appeared
    rest = stream.flush()                 # at the end: the text held back

Decoding: each push decodes only a short window of ids (a few tokens of context + the new ones) and sends what
the new ones added, so a step costs the same at token 10 and token 10000, and tokenizers whose decoders depend on
the neighbouring tokens (a SentencePiece leading space) still produce the text the whole sequence decodes to. A
window that ends inside a UTF-8 character (decodes to U+FFFD) waits for the next token.

Stop strings: the text that could still become a stop string (a suffix of the text that is a prefix of one) is held
back; once a stop string appears, the text before it is the completion's end (the stop string itself is not sent, as
in OpenAI's API). `kept_tokens` counts the tokens of the text sent (usage's completion_tokens): a token that only
spells the stop string, or comes after it, is not counted; one that spells text before it is. An engine without a
tokenizer streams the ids as comma-separated text, like `run`.
"""

from __future__ import annotations

import bisect

CONTEXT_TOKENS = 5  # prompt tokens decoded with the first new token (its leading space depends on them)
REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer, prompt_ids: list[int], stops: list[str] = ()):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-CONTEXT_TOKENS:]) if tokenizer is not None else []
        self.prefix = 0              # ids[prefix:read] were decoded already: the context of the next delta
        self.read = len(self.ids)
        self.stops = [s for s in stops if s]
        self.longest_stop = max((len(s) for s in self.stops), default=0)
        self.text = ""               # everything decoded so far
        self.sent = 0                # text[:sent] has been returned
        self.stopped = False
        self.ends: list[int] = []    # len(text) once each pushed token was decoded

    def push(self, token: int) -> tuple[str, bool]:
        """Add one generated token; returns (text to send now, whether a stop string ended the completion)."""
        if self.stopped:
            return "", True
        if self.tokenizer is None:
            self.text += ("," if self.ids else "") + str(token)
            self.ids.append(token)
        else:
            self.ids.append(token)
            self.text += self._decode_new()
        self.ends.append(len(self.text))
        return self._release(final=False)

    @property
    def kept_tokens(self) -> int:
        """The tokens pushed, less those after the end of the sent text when a stop string ended it."""
        if not self.stopped:
            return len(self.ends)
        return 0 if self.sent == 0 else bisect.bisect_left(self.ends, self.sent) + 1

    def flush(self) -> str:
        """The rest of the text at the end of the completion (a held-back prefix of a stop string, or a window
        that ended inside a character)."""
        if self.stopped:
            return ""
        if self.tokenizer is not None and self.read < len(self.ids):
            self.text += self._decode_new(final=True)
        return self._release(final=True)[0]

    def _decode_new(self, final: bool = False) -> str:
        decode = self.tokenizer.decode
        before = decode(self.ids[self.prefix:self.read])
        after = decode(self.ids[self.prefix:])
        if len(after) <= len(before) or (after.endswith(REPLACEMENT) and not final):
            return ""  # nothing printable yet (a special token, or half of a character)
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]

    def _release(self, final: bool) -> tuple[str, bool]:
        if self.stops:
            # the sent text holds no start of a stop string: every such suffix was held back
            found = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
            if found:
                end = min(found)
                delta, self.sent, self.stopped = self.text[self.sent:end], end, True
                return delta, True
        end = len(self.text) if final else len(self.text) - self._held_back()
        delta, self.sent = self.text[self.sent:end], end
        return delta, False

    def _held_back(self) -> int:
        """Length of the longest suffix of the unsent text that is a proper prefix of a stop string."""
        unsent = self.text[self.sent:]
        for length in range(min(len(unsent), self.longest_stop - 1), 0, -1):
            tail = unsent[-length:]
            if any(s.startswith(tail) for s in self.stops):
                return length
        return 0
