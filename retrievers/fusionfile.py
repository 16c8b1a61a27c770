"""An index folder's ``fusion.json``: how the hybrid retriever fuses BM25 and dense there, as
``ragchains eval tune --apply`` recommends. It sits beside the generations, so ingests keep it;
a file this release cannot read stops the load with what to do about it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragchains.retrievers.fusion import FUSION_FIELDS, FusionConfig
from ragchains.retrievers.indexformat import IndexLoadError, current_generation

FUSION_FILE = "fusion.json"
FUSION_FORMAT = "ragchains-fusion"
FUSION_FORMAT_VERSION = 1


class FusionFileError(IndexLoadError):
    pass


def write_fusion(
    index_dir: str | Path, config: FusionConfig, provenance: dict[str, Any] | None = None
) -> Path:
    """Write ``fusion.json`` into an existing index folder (atomically); return its path.

    It sits beside the generations, so re-ingesting keeps it; ``provenance`` (what it was
    tuned on, and how well it did) is stored with it for people, never read back.
    """
    root = Path(index_dir)
    current_generation(root)  # an index folder, not any folder
    path = root / FUSION_FILE
    tmp = root / f".{FUSION_FILE}.{uuid.uuid4().hex[:8]}"
    tmp.write_text(fusion_json(config, provenance), encoding="utf-8")
    os.replace(tmp, path)
    return path


def fusion_json(config: FusionConfig, provenance: dict[str, Any] | None = None) -> str:
    """The text of a fusion.json file."""
    body: dict[str, Any] = {
        "format": FUSION_FORMAT,
        "format_version": FUSION_FORMAT_VERSION,
        **config.model_dump(),
    }
    if provenance:
        body["tuned"] = provenance
    return json.dumps(body, indent=2, default=str) + "\n"


def read_fusion(index_dir: str | Path) -> FusionConfig | None:
    """The fusion ``fusion.json`` in the index folder sets, or None when there is none.

    Fields it leaves out take the built-in defaults.
    """
    path = Path(index_dir) / FUSION_FILE
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FusionFileError(f"{path} is not valid JSON ({exc}); fix or delete it") from exc
    if not isinstance(body, dict) or body.get("format") != FUSION_FORMAT:
        raise FusionFileError(f"{path} is not a {FUSION_FORMAT} file; fix or delete it")
    if body.get("format_version") != FUSION_FORMAT_VERSION:
        raise FusionFileError(
            f"{path} has format version {body.get('format_version')!r}; this ragchains reads "
            f"version {FUSION_FORMAT_VERSION} only. Delete it or run `ragchains eval tune` again."
        )
    try:
        return FusionConfig(**{k: v for k, v in body.items() if k in FUSION_FIELDS})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors()
        )
        raise FusionFileError(f"{path}: {problems}; fix or delete it") from None
