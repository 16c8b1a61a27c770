"""The embedder's backends: openvino-int8 (the default) gives fp32's vectors within noise, an
index records the backend that embedded it, and a run with the other one is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ragchains.factory import build_embedder, open_index
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder, resolve_model_path
from ragchains.retrievers.indexformat import current_generation, read_manifest
from ragchains.retrievers.openvinoembedder import (
    META_FILE,
    MODEL_FILE,
    export_dir,
    model_cache_root,
)
from ragchains.settings import Settings
from tests.servers import REPO
from tests.test_cli import run

SENTENCES = [
    "Employees receive 25 days of paid time off per calendar year.",
    "Passwords must be at least 14 characters long and rotated yearly.",
    "The hotel allowance is EUR 180 per night in Europe.",
    "How many vacation days do I get?",
    "Which sensors cost less than 100 dollars?",
    "Mitochondrial dysfunction is associated with neurodegenerative disease in mice.",
]


def test_int8_vectors_are_fp32_vectors_within_noise(embedder: SentenceTransformerEmbedder) -> None:
    assert embedder.backend == "openvino-int8"  # the default
    fp32 = SentenceTransformerEmbedder(embedder.name, backend="torch")
    int8, reference = embedder.encode(SENTENCES), fp32.encode(SENTENCES)
    assert int8.shape == reference.shape == (len(SENTENCES), 384)
    assert np.allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-4)
    cosines = (int8 * reference).sum(axis=1)
    assert cosines.min() > 0.97 and cosines.mean() > 0.985, cosines
    # The same questions find the same sentence first with either backend, where fp32's first
    # is clear of its second: the sensors question is near none of them (0.07 against 0.06,
    # an order int8's noise may swap on another CPU).
    found, wanted = int8[3:5] @ int8[:3].T, reference[3:5] @ reference[:3].T
    clear = [n for n, row in enumerate(wanted) if np.diff(np.sort(row)[-2:])[0] > 0.05]
    assert clear == [0]  # vacation days, and only it, has a clear first: paid time off
    assert [found[n].argmax() for n in clear] == [wanted[n].argmax() for n in clear] == [0]
    # Token counts (chunk sizes) are the model's own tokenizer's either way.
    assert embedder.count_tokens(SENTENCES[0]) == fp32.count_tokens(SENTENCES[0])


def test_the_export_is_complete_and_leaves_nothing_behind(
    embedder: SentenceTransformerEmbedder,
) -> None:
    embedder.encode(["load"])
    export = embedder.model.folder
    folder = model_cache_root()
    assert export.parent == folder and export == export_dir(resolve_model_path(embedder.name))
    assert (export / META_FILE).exists() and (export / MODEL_FILE).exists()
    assert (export / MODEL_FILE).with_suffix(".bin").stat().st_size > 10_000_000
    assert not list(folder.glob(".export-*")), "a half-made export was left in the cache"


def _manifest(index: Path) -> dict:
    return read_manifest(index, current_generation(index))


def test_an_index_records_its_backend_and_refuses_the_other(tmp_path: Path) -> None:
    index = tmp_path / "idx"
    doc = REPO / "samples" / "handbook" / "employee-handbook.md"
    made = run("ingest", doc, "--index", index)
    assert made.returncode == 0, made.stderr
    assert _manifest(index)["embedder"]["backend"] == "openvino-int8"

    torch_env = {"RAGCHAINS_EMBEDDING_BACKEND": "torch"}
    refused = run("retrieve", "--index", index, "paid time off", env=torch_env)
    assert refused.returncode != 0
    message = refused.stderr.strip()
    assert "Traceback" not in message and len(message.splitlines()) == 1, message
    assert "openvino-int8 backend" in message and "RAGCHAINS_EMBEDDING_BACKEND" in message

    before = current_generation(index)
    extended = run(
        "ingest", REPO / "samples" / "handbook" / "perks-policy.md", "--index", index, env=torch_env
    )
    assert extended.returncode != 0 and "openvino-int8 backend" in extended.stderr
    assert current_generation(index) == before  # nothing written

    # auto (the default) follows the index; a rebuild with torch records torch.
    assert run("retrieve", "--index", index, "paid time off").returncode == 0
    rebuilt = run("ingest", doc, "--index", index, "--rebuild", env=torch_env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert _manifest(index)["embedder"]["backend"] == "torch"
    found = run("retrieve", "--index", index, "paid time off", "--json")
    assert found.returncode == 0, found.stderr


def test_auto_follows_the_backend_an_index_was_embedded_with(
    tmp_path: Path, settings: Settings
) -> None:
    index = tmp_path / "idx"
    made = run(
        "ingest",
        REPO / "samples" / "handbook" / "employee-handbook.md",
        "--index",
        index,
        env={"RAGCHAINS_EMBEDDING_BACKEND": "torch"},
    )
    assert made.returncode == 0, made.stderr
    auto = build_embedder(settings)
    assert auto.requested_backend == "auto"
    open_index(index, auto).close()
    assert auto.backend == "torch"

    # An index written before backends were recorded was embedded with torch.
    manifest_file = current_generation(index) / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    del manifest["embedder"]["backend"]
    manifest_file.write_text(json.dumps(manifest))
    older = build_embedder(settings)
    open_index(index, older).close()
    assert older.backend == "torch"
    explicit = SentenceTransformerEmbedder(older.name, backend="openvino-int8")
    with pytest.raises(ValueError, match="torch backend"):
        open_index(index, explicit)


@pytest.mark.long
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_setup_exports_the_model_without_a_network(tmp_path: Path) -> None:
    """`make setup`'s export step, run with no network namespace at all: nothing it needs
    is downloaded. With ``make test-long`` (25 s): every set-up runs the export, offline in
    CI, and the suite checks the export itself in process
    (test_the_export_is_complete_and_leaves_nothing_behind)."""
    if os.geteuid() != 0:
        pytest.skip("a new network namespace needs root")
    env = {**os.environ, "RAGCHAINS_MODEL_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-m", "ragchains.retrievers.openvinoembedder"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    folder = Path(done.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "cache"
    meta = json.loads((folder / META_FILE).read_text())
    assert meta["dimension"] == 384 and meta["max_seq_length"] == 256
