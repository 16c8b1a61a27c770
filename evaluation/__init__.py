"""Evaluation: retrieval and answer metrics (the eval CLI builds on these)."""
