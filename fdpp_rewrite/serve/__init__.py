"""An OpenAI-compatible HTTP server for engines built by `build`, with continuous batching.

    python -m fdpp_rewrite serve engines/m --host 127.0.0.1 --port 8000

Modules: scheduler.py (the thread that owns the engine: admission into KV slots, chunked prefill, decode steps,
retirement), text.py (token ids -> streamed text, stop strings), metrics.py (Prometheus text), schemas.py (the
request bodies and their limits), app.py (the FastAPI endpoints), server.py (the `serve` command). docs/serving.md
describes the API and the limits.
"""
