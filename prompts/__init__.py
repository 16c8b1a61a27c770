"""Versioned prompt files per domain and their loader — see issue 3."""
