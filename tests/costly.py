"""Calls that cost what they are told to, for tests of the parsing budgets: imported by the
worker processes that run them, so nothing heavy is imported here."""

from __future__ import annotations

import time


def allocate(megabytes: int) -> int:
    return len(bytearray(megabytes * 2**20))


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds
