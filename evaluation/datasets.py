"""Readers for the evaluation data: BEIR folders, QA ground truth, conversational rewrites.

Each reader checks what it reads and raises ``DatasetError`` naming the file and line, so the
CLI can print one line instead of a traceback.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any


class DatasetError(ValueError):
    """Evaluation data is missing or malformed; the message names the file."""


def _jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file."""
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 (closed by the with below)
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror or exc}") from exc
    with fh:
        try:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DatasetError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
                if not isinstance(item, dict):
                    raise DatasetError(f"{path}:{number}: expected a JSON object")
                yield number, item
        except UnicodeDecodeError as exc:
            raise DatasetError(f"{path}: not UTF-8 text ({exc.reason})") from exc


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- BEIR
@dataclass
class BeirDataset:
    """A BEIR folder: documents (id, title, text), the queries that have judgments, qrels."""

    folder: Path
    doc_ids: list[str]
    titles: list[str]
    texts: list[str]
    queries: dict[str, str]  # query id -> text, only queries judged in the split
    qrels: dict[str, dict[str, float]]  # query id -> doc id -> grade
    split: str = "test"

    @property
    def name(self) -> str:
        return self.folder.resolve().name

    @property
    def corpus_path(self) -> Path:
        return self.folder / "corpus.jsonl"

    @cached_property
    def corpus_sha256(self) -> str:
        """Identifies the corpus an index was built from (read once per run)."""
        return file_sha256(self.corpus_path)

    def document_text(self, row: int) -> str:
        """Title and text, as BEIR's evaluations index a document."""
        return f"{self.titles[row]}\n{self.texts[row]}".strip()


def load_beir(folder: Path, split: str = "test") -> BeirDataset:
    """Read corpus.jsonl, queries.jsonl and qrels/<split>.tsv of a BEIR folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"no dataset folder at {folder}")
    for needed in ("corpus.jsonl", "queries.jsonl", f"qrels/{split}.tsv"):
        if not (folder / needed).is_file():
            raise DatasetError(
                f"{folder} is not a BEIR dataset: {needed} is missing "
                "(expected corpus.jsonl, queries.jsonl and qrels/<split>.tsv)"
            )
    doc_ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    seen: set[str] = set()
    corpus = folder / "corpus.jsonl"
    for number, doc in _jsonl(corpus):
        if "_id" not in doc or not isinstance(doc.get("text"), str):
            raise DatasetError(f"{corpus}:{number}: a document needs '_id' and 'text'")
        doc_id = str(doc["_id"])
        if doc_id in seen:
            raise DatasetError(f"{corpus}:{number}: document id {doc_id!r} repeats")
        seen.add(doc_id)
        doc_ids.append(doc_id)
        titles.append(str(doc.get("title") or ""))
        texts.append(doc["text"])
    if not doc_ids:
        raise DatasetError(f"{corpus} holds no documents")

    qrels: dict[str, dict[str, float]] = {}
    qrels_path = folder / "qrels" / f"{split}.tsv"
    with open(qrels_path, encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh, delimiter="\t")
        wanted = {"query-id", "corpus-id", "score"}
        if not wanted <= set(reader.fieldnames or []):
            raise DatasetError(f"{qrels_path}: header must name query-id, corpus-id and score")
        for number, row in enumerate(reader, start=2):
            try:
                grade = float(row["score"])
            except (TypeError, ValueError):
                raise DatasetError(f"{qrels_path}:{number}: score is not a number") from None
            qrels.setdefault(row["query-id"], {})[row["corpus-id"]] = grade

    queries: dict[str, str] = {}
    for _, query in _jsonl(folder / "queries.jsonl"):
        qid = str(query.get("_id"))
        if qid in qrels and isinstance(query.get("text"), str):
            queries[qid] = query["text"]
    missing = sorted(set(qrels) - set(queries))
    if missing:
        raise DatasetError(
            f"{folder}: {len(missing)} judged queries are not in queries.jsonl "
            f"(first: {missing[0]!r})"
        )
    qrels = {qid: qrels[qid] for qid in queries}
    return BeirDataset(folder, doc_ids, titles, texts, queries, qrels, split)


# ----------------------------------------------------------------------------- QA ground truth
@dataclass
class QAItem:
    """One question with its reference answer and the citation labels it should cite.

    ``answerable`` false means the right reply is "I don't know" (``kind`` says why).
    ``conversation``: the questions of one conversation share it and are asked in file
    order, each after the ones before it and the target's own answers to them (a chat
    target); ``domain`` is the prompt domain the question is asked in, if not the run's.
    ``standalone``: a follow-up written self-contained, as a person would rewrite it (the
    gold its searched queries are compared with); ``expect``: short phrases any one of
    which, in an answer, shows it holds the fact; ``expect_all``: phrases every one of which
    it must say (the items a list question asks for); ``files``: the files (paths under the
    collection's root) that explain the answer, for sets judged by file, not by section.
    """

    id: str
    question: str
    answer: str = ""
    citations: list[str] = field(default_factory=list)
    answerable: bool = True
    kind: str = "answerable"
    conversation: str = ""
    domain: str | None = None
    standalone: str = ""
    expect: list[str] = field(default_factory=list)
    expect_all: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "citations": self.citations,
            "answerable": self.answerable,
            "kind": self.kind,
        }
        if self.conversation:
            row["conversation"] = self.conversation
        if self.domain:
            row["domain"] = self.domain
        # Only when given: runs over sets without them keep their rows' shape.
        for name in ("standalone", "expect", "expect_all", "files"):
            if getattr(self, name):
                row[name] = getattr(self, name)
        return row


def load_qa(path: Path) -> list[QAItem]:
    """JSONL of {question, answer, citations} (and optionally id, answerable, kind,
    conversation, domain, standalone, expect, expect_all, files)."""
    items: list[QAItem] = []
    ids: set[str] = set()
    for number, row in _jsonl(Path(path)):
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise DatasetError(f"{path}:{number}: 'question' must be non-empty text")
        citations = row.get("citations", [])
        if not isinstance(citations, list) or not all(isinstance(c, str) for c in citations):
            raise DatasetError(f"{path}:{number}: 'citations' must be a list of labels")
        answerable = row.get("answerable", True)
        if not isinstance(answerable, bool):
            raise DatasetError(f"{path}:{number}: 'answerable' must be true or false")
        for name in ("conversation", "domain", "standalone"):
            if not isinstance(row.get(name) or "", str):
                raise DatasetError(f"{path}:{number}: {name!r} must be text")
        for name in ("expect", "expect_all", "files"):
            value = row.get(name) or []
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise DatasetError(f"{path}:{number}: {name!r} must be a list of text")
        item_id = str(row.get("id", f"q{number}"))
        if item_id in ids:
            raise DatasetError(f"{path}:{number}: id {item_id!r} repeats")
        ids.add(item_id)
        items.append(
            QAItem(
                id=item_id,
                question=question.strip(),
                answer=str(row.get("answer") or ""),
                citations=citations,
                answerable=answerable,
                kind=str(row.get("kind") or ("answerable" if answerable else "unanswerable")),
                conversation=row.get("conversation") or "",
                domain=row.get("domain") or None,
                standalone=str(row.get("standalone") or "").strip(),
                expect=row.get("expect") or [],
                expect_all=row.get("expect_all") or [],
                files=row.get("files") or [],
            )
        )
    if not items:
        raise DatasetError(f"{path} holds no questions")
    return items


# ----------------------------------------------------------------------------- rewrites
@dataclass
class RewriteItem:
    """A conversational turn: earlier turns, the raw utterance and the gold self-contained one."""

    id: str
    history: list[dict[str, str]]  # {"type": "human" | "ai", "content": ...}, oldest first
    raw: str
    rewrite: str


def load_rewrites(path: Path) -> list[RewriteItem]:
    """TREC CAsT style JSONL: {id, history: [{utterance, response?}], raw, rewrite}.

    A history turn's ``response`` (or ``passage``) becomes the assistant's reply.
    """
    items = []
    for number, row in _jsonl(Path(path)):
        raw, gold = row.get("raw"), row.get("rewrite")
        if not isinstance(raw, str) or not isinstance(gold, str) or not raw.strip():
            raise DatasetError(f"{path}:{number}: 'raw' and 'rewrite' must be text")
        history: list[dict[str, str]] = []
        turns = row.get("history", [])
        if not isinstance(turns, list):
            raise DatasetError(f"{path}:{number}: 'history' must be a list of turns")
        for turn in turns:
            if not isinstance(turn, dict) or not isinstance(turn.get("utterance"), str):
                raise DatasetError(f"{path}:{number}: each history turn needs an 'utterance'")
            history.append({"type": "human", "content": turn["utterance"]})
            reply = turn.get("response") or turn.get("passage")
            if isinstance(reply, str) and reply.strip():
                history.append({"type": "ai", "content": reply})
        items.append(RewriteItem(str(row.get("id", f"t{number}")), history, raw, gold))
    if not items:
        raise DatasetError(f"{path} holds no turns")
    return items
