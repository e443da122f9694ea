"""An OpenAI-compatible HTTP server for engines built by `build`, with continuous batching.

    python -m fdpp_rewrite serve engines/m --host 127.0.0.1 --port 8000

Modules: scheduler.py (the thread that owns the engine: admission into KV slots, chunked prefill, decode steps,
retirement, draining at shutdown), text.py (token ids -> streamed text, stop strings), metrics.py (Prometheus
text), schemas.py (the request bodies, their limits and OpenAI's error object), body.py (bytes -> a request model:
UTF-8, JSON, strict types, no lone surrogates), chat.py (a conversation -> token ids, content as plain text),
app.py (the FastAPI endpoints), guard.py (the ASGI layer in front: API key, body size and body timeout),
protocol.py (uvicorn's h11 protocol with the header timeout and the connection cap), limits.py (those limits and
their defaults), server.py (the `serve` command). docs/serving.md describes the API, the limits and deploying.
"""
