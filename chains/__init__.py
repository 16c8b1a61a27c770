"""LCEL chain builders (rewrite, answer, chat and ask graphs) — see issue 3."""
