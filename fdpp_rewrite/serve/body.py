"""A request body (bytes, already bounded by the size limit in guard.py) -> a request model from schemas.py, or an
APIError(400) whose message names the field.

    request = await parse_body(raw, CompletionRequest)

The body must be UTF-8 JSON holding one object; no string in it may hold a lone UTF-16 surrogate (`"\\ud800"`
parses to a Python str that no tokenizer, and no UTF-8 response, can carry). A large body is parsed and validated
on a worker thread, so the event loop keeps answering /health and streaming meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import re

from pydantic import ValidationError

from fdpp_rewrite.serve.schemas import APIError

MAX_SHOWN = 80  # characters of a refused value quoted in the message (a prompt may be megabytes)
PARSE_INLINE_BYTES = 64 * 1024  # bodies up to this are parsed on the event loop (well under a millisecond)
# a JSON escape of a UTF-16 surrogate; without one, no decoded string can hold a surrogate (raw UTF-8 cannot)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# where a field takes one of several types, pydantic puts the type tried into the error's location
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|dict|list|none)$|\[")


async def parse_body(raw: bytes, model):
    if len(raw) <= PARSE_INLINE_BYTES:
        return parse(raw, model)
    return await asyncio.to_thread(parse, raw, model)


def parse(raw: bytes, model):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"the request body is not valid UTF-8 JSON (byte {exc.start} cannot start or continue "
                            "a UTF-8 character)") from None
    try:
        fields = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise APIError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column "
                            f"{exc.colno})") from None
    if not isinstance(fields, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(fields).__name__}")
    if _SURROGATE_ESCAPE.search(text):
        check_unicode(fields)
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        message, param = validation_message(exc.errors())
        raise APIError(400, message, param=param) from None


def check_unicode(value, where: tuple = ()) -> None:
    """APIError naming the first field whose text holds a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            name = ".".join(map(str, where)) or "a field name"
            raise APIError(400, f"{name}: the text holds a lone UTF-16 surrogate (U+{ord(value[exc.start]):04X} at "
                                f"character {exc.start}); send valid Unicode text",
                           param=str(where[0]) if where else None) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key, where)
            check_unicode(item, where + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_unicode(item, where + (index,))


def validation_message(errors: list) -> tuple[str, str | None]:
    """Pydantic's errors as (one-line message naming the field, the field)."""
    error = errors[0]
    loc = [str(part) for part in error.get("loc", ()) if not _UNION_MEMBER.search(str(part))]
    param = (error.get("ctx") or {}).get("param") or (loc[0] if loc else None)
    where = ".".join(loc)
    if error["type"] == "extra_forbidden":
        return f"unknown field {where!r}; remove it (see docs/serving.md for the fields this server takes)", param
    if error["type"] == "missing":
        missing = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "missing"]
        return f"the request lacks the required field{'s' if len(missing) > 1 else ''} {', '.join(missing)}", param
    message = error["msg"].removeprefix("Value error, ")
    if error["type"] == "unsupported" or not where:
        return message, param
    shown = repr(error.get("input"))
    if len(shown) > MAX_SHOWN:
        shown = shown[:MAX_SHOWN - 3] + "..."
    return f"{where}: {message} (got {shown})", param
