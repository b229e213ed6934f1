"""The OpenAI-compatible server (`flashtree serve`).

protocol.py: wire schemas and request validation; async_engine.py: the one thread that drives
the engine; metrics.py: Prometheus metrics; app.py: FastAPI routes, SSE and the CLI entry.
"""
