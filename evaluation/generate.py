"""Synthetic ground truth from an index: QA pairs, and questions the index cannot answer.

Each answerable pair comes from one sampled chunk, which becomes its gold citation. The
unanswerable ones come in three kinds, for measuring "I don't know": unrelated (general
knowledge), related but absent (the chunk's subject, a detail it lacks) and nonsensical.
The model writes; these functions only sample, parse, drop what is unusable and write the
rest as the JSONL `eval answers` reads.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import BaseMessage
from tqdm import tqdm

from ragchains.chains.llm import LLM
from ragchains.evaluation import EVAL_PROMPTS, SetupError
from ragchains.evaluation.datasets import QAItem
from ragchains.evaluation.metrics import normalize_text
from ragchains.factory import build_embedder, build_llm, open_index
from ragchains.prompts.registry import Prompt, PromptRegistry
from ragchains.retrievers.bm25 import STOPWORDS
from ragchains.retrievers.indexformat import Chunk
from ragchains.retrievers.searchindex import SearchIndex
from ragchains.settings import Settings

GENERATORS = ("qa_pair", "related_absent", "unrelated", "nonsensical")
UNRELATED_TOPICS = (
    "astronomy",
    "football",
    "cooking",
    "ancient history",
    "music",
    "geography",
    "chemistry",
    "film",
)
MAX_PASSAGE_CHARS = 1500
MAX_ANSWER_WORDS = 40
_PAIR = re.compile(r"question:\s*(?P<q>.+?)\s*\n+\s*answer:\s*(?P<a>.+)", re.I | re.S)
# Keep llama.cpp models in the reply format (other providers follow the prompt's wording).
_PAIR_GRAMMAR = 'root ::= "Question: " [^\\n]+ "\\nAnswer: " [^\\n]+'
_LINE_GRAMMAR = "root ::= [^\\n]+"


def parse_pair(reply: str) -> tuple[str, str] | None:
    found = _PAIR.search(reply)
    if not found:
        return None
    question, answer = found["q"].strip(), found["a"].strip().splitlines()[0].strip()
    return (question, answer) if question and answer else None


def supported(answer: str, passage: str) -> bool:
    """A short answer whose content words are mostly in the passage (small models answer
    from their few-shot example or from nowhere)."""
    words = [w for w in normalize_text(answer).split() if w not in STOPWORDS]
    if not words or len(words) > MAX_ANSWER_WORDS:
        return False
    present = set(normalize_text(passage).split())
    return sum(w in present for w in words) >= len(words) / 2


def parse_question(reply: str) -> str | None:
    """The first line, if it reads as a question."""
    line = next((ln.strip() for ln in reply.splitlines() if ln.strip()), "")
    line = line.removeprefix("Question:").strip().strip("\"'")
    return line if len(line) > 8 and line.endswith("?") else None


def sample_chunks(index: SearchIndex, count: int, seed: int) -> list[Chunk]:
    """``count`` chunks with distinct citation labels, chosen at random but reproducibly."""
    by_label: dict[str, Chunk] = {}
    for chunk in index.store.iter_chunks():
        by_label.setdefault(chunk.metadata["citation"], chunk)
    labels = sorted(by_label)
    random.Random(seed).shuffle(labels)
    return [by_label[label] for label in labels[:count]]


class QuestionWriter:
    """Runs the generation prompts with one chat model."""

    def __init__(self, llm: LLM, prompt_version: int | str | None = None) -> None:
        self.llm = llm
        self.prompts = PromptRegistry(EVAL_PROMPTS, required=GENERATORS)
        configurable = {"prompt_version": prompt_version} if prompt_version else {}
        self.chosen = {name: self.prompts.select(name, configurable) for name in GENERATORS}
        # The few-shot examples: a small model copies them instead of writing its own.
        self.examples = {normalize_text(t) for p in self.chosen.values() for t in _shown(p)}

    def refs(self) -> dict[str, str]:
        return {name: prompt.ref for name, prompt in self.chosen.items()}

    def copied(self, text: str) -> bool:
        return normalize_text(text) in self.examples

    def _ask(self, name: str, grammar: str, **variables: str) -> str:
        chain = self.llm.text(self.chosen[name], grammar=grammar)
        return str(chain.invoke(variables))

    def _question(self, name: str, **variables: str) -> str | None:
        question = parse_question(self._ask(name, _LINE_GRAMMAR, **variables))
        return None if question is None or self.copied(question) else question

    def qa_pair(self, chunk: Chunk) -> tuple[str, str] | None:
        passage = _passage(chunk)
        pair = parse_pair(self._ask("qa_pair", _PAIR_GRAMMAR, passage=passage))
        if pair is None or self.copied(pair[0]) or not supported(pair[1], passage):
            return None
        return pair

    def related_absent(self, chunk: Chunk) -> str | None:
        return self._question("related_absent", passage=_passage(chunk))

    def unrelated(self, topic: str) -> str | None:
        return self._question("unrelated", topic=topic)

    def nonsensical(self, chunk: Chunk) -> str | None:
        return self._question("nonsensical", passage=_passage(chunk))


def _shown(prompt: Prompt) -> list[str]:
    """The fixed message texts of a prompt (few-shot inputs and outputs among them)."""
    return [str(m.content) for m in prompt.template.messages if isinstance(m, BaseMessage)]


def _passage(chunk: Chunk) -> str:
    return " ".join(chunk.text.split())[:MAX_PASSAGE_CHARS]


def generate(
    index: SearchIndex,
    writer: QuestionWriter,
    *,
    answerable: int,
    unanswerable: int,
    seed: int = 0,
    on_dropped: Callable[[str], None] = lambda _: None,
) -> Iterator[QAItem]:
    """Up to ``answerable`` QA pairs and ``unanswerable`` questions, split evenly over the
    three kinds; a reply that cannot be parsed is dropped (and reported), not retried."""
    chunks = sample_chunks(index, max(answerable, unanswerable), seed)
    seen: set[str] = set()

    def fresh(question: str | None) -> bool:
        if question is None or question.lower() in seen:
            return False
        seen.add(question.lower())
        return True

    for n, chunk in enumerate(chunks[:answerable], start=1):
        pair = writer.qa_pair(chunk)
        if pair is None or not fresh(pair[0]):
            on_dropped(f"qa_pair from {chunk.metadata['citation']}: unusable reply")
            continue
        yield QAItem(f"gen-qa-{n}", pair[0], pair[1], [chunk.metadata["citation"]])
    kinds = [GENERATORS[1 + i % 3] for i in range(unanswerable)]
    for n, (kind, chunk) in enumerate(zip(kinds, _cycle(chunks, len(kinds)), strict=True), 1):
        question: str | None
        if kind == "unrelated":
            question = writer.unrelated(UNRELATED_TOPICS[n % len(UNRELATED_TOPICS)])
        elif kind == "related_absent":
            question = writer.related_absent(chunk)
        else:
            question = writer.nonsensical(chunk)
        if not fresh(question):
            on_dropped(f"{kind}: unusable or repeated reply")
            continue
        assert question is not None
        label = kind.replace("_", "-")
        yield QAItem(f"gen-{label}-{n}", question, "", [], answerable=False, kind=label)


def _cycle(items: Sequence[Any], count: int) -> list[Any]:
    return [items[i % len(items)] for i in range(count)] if items else []


def open_for_generation(
    settings: Settings, index_dir: Path | str, out_file: Path
) -> tuple[SearchIndex, QuestionWriter]:
    """The index folder to sample and a writer on the configured chat model; SetupError
    when either cannot be had. ``out_file``'s folder is made now, before the slow work."""
    try:
        index = open_index(index_dir, build_embedder(settings))
        writer = QuestionWriter(build_llm(settings))
    except ValueError as exc:
        raise SetupError(str(exc)) from None
    if not isinstance(index, SearchIndex):
        raise SetupError(
            "eval generate samples chunks from an index folder, not a PostgreSQL store"
        )
    out_file.parent.mkdir(parents=True, exist_ok=True)
    return index, writer


def generate_all(
    index: SearchIndex,
    writer: QuestionWriter,
    *,
    answerable: int,
    unanswerable: int,
    seed: int = 0,
    progress: bool = True,
) -> tuple[list[QAItem], list[str]]:
    """Every item ``generate`` yields, and why each dropped reply was dropped."""
    dropped: list[str] = []
    items = []
    found = generate(
        index,
        writer,
        answerable=answerable,
        unanswerable=unanswerable,
        seed=seed,
        on_dropped=dropped.append,
    )
    with tqdm(total=answerable + unanswerable, unit="question", disable=not progress) as bar:
        for item in found:
            items.append(item)
            bar.update(1)
    return items, dropped


def write_questions(items: Sequence[QAItem], out_file: Path) -> None:
    """``items`` as the JSONL `eval answers` reads; written under a temporary name and
    renamed when complete, so a failed write never leaves a file that looks finished."""
    tmp = out_file.with_name(f".{out_file.name}.partial")
    with open(tmp, "w", encoding="utf-8") as fh:
        for item in items:
            fh.write(json.dumps(item.as_dict(), ensure_ascii=False) + "\n")
    os.replace(tmp, out_file)
