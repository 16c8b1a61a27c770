"""The stages of a turn as the observers (traces, metrics) see them in LCEL's callbacks.

A stage is a run named in ``STAGES`` below the chain's own run, with no stage above it: the
chat chain's ``rewrite``, ``retrieve``, ``compress``, ``requery`` and ``answer`` (the ask
chain has no ``rewrite`` or ``requery``), and the served stages on their own routes."""

from __future__ import annotations

# The run names of the chains' stages (chains.graph), in the order a chat turn runs them.
STAGES = ("rewrite", "retrieve", "compress", "requery", "answer")
