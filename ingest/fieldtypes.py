"""The filterable fields of an index or store, one type each, from its chunks' metadata."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ragchains.ingest.errors import IngestError
from ragchains.ingest.report import IngestReport
from ragchains.retrievers.access import mixed_type_problem
from ragchains.retrievers.filters import BASE_FIELDS
from ragchains.retrievers.indexformat import Chunk

# file_id: the file's sha256, for opening the original (GET /files/{file_id}), not a filter.
NOT_FILTERABLE = frozenset({"citation", "content_hash", "chunk_index", "location", "file_id"})


def resolve_field_types(
    chunks: Sequence[Chunk], report: IngestReport, groups_of: Mapping[str, tuple[str, ...]]
) -> dict[str, str]:
    """One type per field over the whole index; a field typed differently in two files
    becomes a string field (its values stringified) and the run says so, unless that type
    would tell a caller of files it may not read (``groups_of``: each source's groups)."""
    seen: dict[str, set[str]] = {}
    by_label: dict[str, dict[tuple[str, ...], set[str]]] = {}
    for chunk in chunks:
        label = groups_of.get(chunk.metadata["source"], ())
        for key, value in chunk.metadata.items():
            if key in NOT_FILTERABLE or value is None:
                continue
            kind = (
                "boolean"
                if isinstance(value, bool)
                else "number"
                if isinstance(value, int | float)
                else "string"
            )
            seen.setdefault(key, set()).add(kind)
            by_label.setdefault(key, {}).setdefault(label, set()).add(kind)
    fields: dict[str, str] = {}
    for key, kinds in seen.items():
        if len(kinds) == 1:
            fields[key] = next(iter(kinds))
            continue
        problem = mixed_type_problem(key, by_label[key])
        if problem:
            raise IngestError(problem)
        fields[key] = "string"
        report.notes.append(
            f"field {key!r} holds {' and '.join(sorted(kinds))} values in different files; "
            "it is filterable as a string"
        )
        for chunk in chunks:
            value = chunk.metadata.get(key)
            if value is not None and not isinstance(value, str):
                chunk.metadata[key] = str(value)
    for key, kind in BASE_FIELDS.items():
        fields.setdefault(key, kind)
    return fields
