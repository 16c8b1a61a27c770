"""The product files one served chat turn runs code from, from its route to its last token.

The README's *Layout* names the path a reader follows; this counts it on the real app: one
streamed /chat turn with a history (so the rewrite runs) over an index folder, every
function call recorded in every thread while the request runs, start-up excluded.

    python scripts/turn_files.py [--index .index/samples]
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
QUESTION = "How many vacation days do employees get?"
HISTORY = [{"type": "human", "content": "hi"}, {"type": "ai", "content": "Hello."}]


class Calls:
    """Calls into the repository's product files (not tests, scripts or the venv)."""

    def __init__(self) -> None:
        self.recording = False
        self.files: Counter[str] = Counter()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.recording and event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(REPO):
                relative = path.relative_to(REPO)
                if relative.parts[0] not in (".venv", "tests", "scripts", "build"):
                    self.files[relative.as_posix()] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, default=REPO / ".index" / "samples")
    args = parser.parse_args()
    from fastapi.testclient import TestClient

    from ragchains.server import create_app
    from ragchains.settings import Settings

    calls = Calls()
    # Before the client starts its thread: threads started later inherit the profiler.
    sys.setprofile(calls)
    threading.setprofile(calls)
    app = create_app(Settings(_env_file=None, index=args.index))  # type: ignore[call-arg]
    body = {"input": {"question": QUESTION, "chat_history": HISTORY}}
    with TestClient(app) as client:
        client.post("/chat/invoke", json=body).raise_for_status()  # first-call work excluded
        calls.recording = True
        with client.stream("POST", "/chat/stream", json=body) as reply:
            for _ in reply.iter_lines():
                pass
        calls.recording = False
    sys.setprofile(None)
    threading.setprofile(None)
    for name, count in sorted(calls.files.items()):
        print(f"{count:6d}  {name}")
    print(f"{len(calls.files)} product files")


if __name__ == "__main__":
    main()
