"""Measuring the engine: the bench and its peers, the exactness checks, the round trace.

`bench.py` (timed passes, isolated component costs, the table and plots), `peers.py` (transformers
and llama.cpp on the same weights), `exactness.py` (greedy identity, exact-distribution checks and
their negative controls), `trace_html.py` (the round-trace page). These modules use the engine
through its public seams; nothing in the engine, the proposers or the server imports them.
"""
