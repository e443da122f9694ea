"""The request bodies of /v1/completions and /v1/chat/completions, and OpenAI's error object.

Types are strict: a value of another JSON type is refused, never coerced (`"max_tokens": "5"`, `"stream": "yes"`);
an integer is still taken where a number is. Every field OpenAI's API defines for these endpoints that the server
cannot honour is still accepted at its neutral value (n=1, frequency_penalty=0, echo=false, ...), so ordinary
clients work; any other value, an unknown field, or a value out of range is a 400 naming the field. Limits that
depend on the engine (prompt length, max_tokens against the max sequence, top_k against the vocabulary) are checked
in app.py after tokenization.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

MAX_STOP_STRINGS = 4  # as OpenAI's API
MAX_SEED = 2**63 - 1
# field -> the values it may take here (what OpenAI's API does by default)
NEUTRAL = {"n": (1,), "best_of": (None, 1), "frequency_penalty": (0,), "presence_penalty": (0,), "echo": (False,),
           "suffix": (None, ""), "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {})}


class APIError(Exception):
    """A refusal: the HTTP status and OpenAI's error object (app.py turns it into the response)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.body, self.headers = status, error_body(message, kind, param, code), headers


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    user: str | None = None
    n: int = 1
    best_of: int | None = None
    frequency_penalty: float = 0
    presence_penalty: float = 0
    echo: bool = False
    suffix: str | None = None
    logprobs: Any = None
    top_logprobs: int | None = None
    logit_bias: dict | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop):
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise ValueError(f"stop takes a string or up to {MAX_STOP_STRINGS} non-empty strings")
        return stops

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, options):
        if options and set(options) - {"include_usage"}:
            raise ValueError("stream_options takes only include_usage (usage is sent with every response)")
        return options

    @model_validator(mode="after")
    def _neutral_only(self):
        for name, allowed in NEUTRAL.items():
            value = getattr(self, name)
            if value not in allowed:
                shown = " or ".join(repr(a) for a in allowed if a is not None) or "null"
                raise PydanticCustomError("unsupported", f"{name}={value!r} is not supported by this server; omit "
                                          f"it or pass {shown}", {"param": name})
        return self

    @property
    def stops(self) -> list[str]:
        return self.stop or []


class CompletionRequest(Sampling):
    prompt: Any

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        """A string or a list of token ids; a list of one of those (n prompts at once are not supported)."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty")
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in prompt):
            return prompt
        raise ValueError("prompt must be one non-empty string or one non-empty list of token ids")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # not OpenAI's: true reads special-token text in message content (e.g. "<|im_end|>") as that token; by default
    # it is plain text, so a user cannot end their turn or open another role's
    allow_special_tokens: bool = False

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens
