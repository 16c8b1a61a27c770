"""Judged retrieval sets built from public text already on this machine, in BEIR layout, for
measuring fusion on collections it was not tuned on (``ragchains eval retrieval --dataset``).

Each set pairs a short text that describes a document with that document, so every query
has exactly one relevant document and no one has to judge anything:

- ``manpages``: the manual pages under /usr/share/man (sections 1, 3, 5, 7, 8; Google Cloud
  SDK pages left out, 16,000 near-copies of one template). Query: the page's one-line
  description from its NAME section ("copy files and directories"), a short noun phrase;
  document: the page's name as title and the text after NAME (the first
  ``MAN_CHARS`` characters, about a chunk's worth). The NAME line itself is not in the
  document, so a query never matches its answer word for word.
- ``pypackages``: the Python distributions installed beside ragchains. Query: a package's
  one-line ``Summary``; document: its long description (no name, no summary).
- ``cast2021``: TREC CAsT 2021's canonical response passages (research data, used here for
  measurement only). Query: a turn's manual rewrite; document: the passage given as that
  turn's answer. Identical passages count once.
- ``mtrag-clapnq``, ``mtrag-cloud``, ``mtrag-fiqa``, ``mtrag-govt``: IBM's MTRAG and MTRAG-UN
  benchmarks (Apache-2.0; a checkout of github.com/IBM/mt-rag-benchmark given as
  ``--source``, :data:`MTRAG_COMMIT`), one set per domain: Wikipedia (ClapNQ), IBM Cloud
  documentation, finance forum answers (FiQA) and government web pages. Its full corpora
  are Git LFS files; the passages shipped in the repository are the ones its tasks
  reference (MTRAG-UN's reference contexts and MTRAG's human-evaluated subset), 300 to 450
  per domain, so every other passage of a domain is a near-topic distractor. Queries, with
  every relevant passage from the benchmark's qrels: ``rw:`` MTRAG's human standalone
  rewrite of a turn, ``lt:`` MTRAG-UN's last user turn as written (a follow-up such as
  "Which is more important?"), answerable and partially answerable turns only.

Queries are split into ``train`` and ``test`` by a hash of their id (about half each), so a
setting can be chosen on one and reported on the other. What is built depends on what the
machine has installed; the corpus's sha256 (recorded by every run) tells two builds apart.

    python -m ragchains.evaluation.judgedsets manpages [--out DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

MAN_ROOT = Path("/usr/share/man")
MAN_SECTIONS = ("man1", "man3", "man5", "man7", "man8")
MAN_CHARS = 1500
PACKAGE_CHARS = 1500
DPKG_STATUS = Path("/var/lib/dpkg/status")
# Relative to the working directory, as the evaluation commands' examples give data.
CAST_TOPICS = Path("../shared/data/trec-cast/raw/2021/2021_manual_evaluation_topics_v1.0.json")


@dataclass(frozen=True)
class Pair:
    """One judged query: its text, and its one relevant document."""

    query_id: str
    query: str
    doc_id: str


@dataclass
class JudgedSet:
    name: str
    documents: dict[str, tuple[str, str]]  # id -> (title, text)
    pairs: list[Pair]

    def write(self, folder: Path) -> Path:
        """The set as a BEIR folder: corpus.jsonl, queries.jsonl, qrels/{train,test}.tsv.
        A query with several relevant documents has one pair per document."""
        (folder / "qrels").mkdir(parents=True, exist_ok=True)
        with open(folder / "corpus.jsonl", "w", encoding="utf-8") as fh:
            for doc_id, (title, text) in self.documents.items():
                fh.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
        queries = {pair.query_id: pair.query for pair in self.pairs}
        with open(folder / "queries.jsonl", "w", encoding="utf-8") as fh:
            for query_id, query in queries.items():
                fh.write(json.dumps({"_id": query_id, "text": query}) + "\n")
        for split in ("train", "test"):
            with open(folder / "qrels" / f"{split}.tsv", "w", encoding="utf-8") as fh:
                fh.write("query-id\tcorpus-id\tscore\n")
                for pair in self.pairs:
                    if split_of(pair.query_id) == split:
                        fh.write(f"{pair.query_id}\t{pair.doc_id}\t1\n")
        return folder


def split_of(query_id: str) -> str:
    """train or test, fixed by the id alone (so a rebuild keeps every query's split)."""
    return "test" if zlib.crc32(query_id.encode("utf-8")) % 2 else "train"


def _one_per_query(pairs: Iterable[Pair]) -> list[Pair]:
    """Pairs whose query text occurs once: a repeated description judges one of several
    documents relevant and the others not, though they answer it as well."""
    pairs = list(pairs)
    count: dict[str, int] = {}
    for p in pairs:
        key = p.query.casefold()
        count[key] = count.get(key, 0) + 1
    return [p for p in pairs if count[p.query.casefold()] == 1]


# ----------------------------------------------------------------------------- manual pages
_COMMENT = re.compile(r'\\".*$|^\.\s*\\".*$')
_FONT = re.compile(r"\\f(\[[^\]]*\]|\(..|.)")
_SIZE = re.compile(r"\\s[+-]?\d+")
_NAMED = {
    "em": "—",
    "en": "–",
    "aq": "'",
    "dq": '"',
    "lq": '"',
    "rq": '"',
    "oq": "'",
    "cq": "'",
    "bu": "•",
    "co": "©",
    "rg": "®",
    "mi": "-",
    "hy": "-",
    "ga": "`",
    "ti": "~",
    "ha": "^",
    "ba": "|",
    "sl": "/",
    "rs": "\\",
}
_ESCAPE = re.compile(r"\\(\(..|\[[^\]]*\]|\*\(..|\*\[[^\]]*\]|\*.|.)")
# Macros whose arguments are text (font changes, headings, list tags, mdoc's markup).
_TEXT_MACROS = {
    "B", "I", "R", "SM", "SB", "BR", "BI", "IB", "IR", "RB", "RI", "SH", "SS", "TP", "IP",
    "Nm", "Nd", "Fl", "Ar", "Xr", "Pa", "Cm", "Ic", "Em", "Sy", "Li", "Op", "It", "Dq",
    "Sq", "Ql", "Va", "Fn", "Fa", "Ft", "Ev", "Er", "Dv", "Sh", "Ss", "Ad", "Ms",
}  # fmt: skip
_ALTERNATING = {"BR", "BI", "IB", "IR", "RB", "RI"}


def _unescape(text: str) -> str:
    text = _FONT.sub("", _SIZE.sub("", text))

    def one(m: re.Match[str]) -> str:
        body = m.group(1)
        if body.startswith("(") or body.startswith("*("):
            return _NAMED.get(body[-2:], "")
        if body.startswith("[") or body.startswith("*["):
            return _NAMED.get(body.strip("*[]"), "")
        if body.startswith("*"):
            return ""
        return {"-": "-", "e": "\\", " ": " ", "~": " "}.get(body, "")

    return _ESCAPE.sub(one, text)


def _macro_args(rest: str) -> list[str]:
    """A macro line's arguments: words, or double-quoted groups."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', rest)]


def roff_lines(source: str) -> Iterator[tuple[str | None, str]]:
    """(section heading or None, text) per output line of a man or mdoc page: a rough
    reading of the markup (no tables, no conditionals), enough to give a page's words."""
    for raw in source.splitlines():
        line = _COMMENT.sub("", raw).rstrip()
        if not line:
            continue
        if line[0] in ".'":
            name, _, rest = line[1:].strip().partition(" ")
            if name in ("SH", "Sh"):
                yield _unescape(" ".join(_macro_args(rest))).strip().upper(), ""
                continue
            if name not in _TEXT_MACROS:
                continue
            args = _macro_args(rest)
            if name in _ALTERNATING:
                line = "".join(args)
            else:
                line = " ".join(a for a in args if not (name != "Nd" and a in ("Ns", "No")))
        text = _unescape(line).strip()
        if text:
            yield None, text


def read_man_page(path: Path) -> tuple[str, str] | None:
    """(description from NAME, the page's text after NAME), or None for a page that is only a
    pointer to another (``.so``) or has no NAME line with a description."""
    try:
        source = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    except (OSError, EOFError):
        return None
    if source.lstrip().startswith(".so "):
        return None
    section: str | None = None
    name_parts: list[str] = []
    body: list[str] = []
    for heading, text in roff_lines(source):
        if heading is not None:
            section = heading
            continue
        if section == "NAME":
            name_parts.append(text)
        elif section is not None:
            body.append(text)
    name = " ".join(name_parts)
    parts = re.split(r"\s+[-—–]+\s+", name, maxsplit=1)
    if len(parts) != 2 or not body:
        return None
    description = " ".join(parts[1].split()).strip(" .")
    text = " ".join(" ".join(body).split())
    return description, text[:MAN_CHARS]


def man_pages(root: Path = MAN_ROOT) -> JudgedSet:
    documents: dict[str, tuple[str, str]] = {}
    pairs = []
    for section in MAN_SECTIONS:
        for path in sorted((root / section).glob("*.gz")):
            if path.is_symlink() or path.name.startswith("gcloud"):
                continue
            page = read_man_page(path)
            if page is None:
                continue
            description, text = page
            name = path.name.removesuffix(".gz")
            doc_id = f"{section}/{name}"
            documents[doc_id] = (name.rsplit(".", 1)[0], text)
            if len(description.split()) >= 2:
                pairs.append(Pair(f"q:{doc_id}", description, doc_id))
    return JudgedSet("manpages", documents, _one_per_query(pairs))


# ----------------------------------------------------------------------------- Python packages
# HTML tags, Markdown images and bare links: a README's badges, which say nothing.
_MARKUP = re.compile(r"<[^>]*>|!\[[^\]]*\]\([^)]*\)|\(?https?://\S+")


def python_packages() -> JudgedSet:
    documents: dict[str, tuple[str, str]] = {}
    pairs = []
    seen: set[str] = set()
    for dist in sorted(metadata.distributions(), key=lambda d: d.metadata["Name"].lower()):
        info = dist.metadata.json
        name = str(info.get("name", "")).lower()
        summary = " ".join(str(info.get("summary") or "").split())
        body = " ".join(_MARKUP.sub(" ", str(info.get("description") or "")).split())
        if name in seen or len(summary.split()) < 3 or len(body) < 300:
            continue
        seen.add(name)
        # The description often opens with the name and the summary: leave the summary out
        # where it appears, so a query is never its answer's own words verbatim.
        body = body.replace(summary, " ")
        documents[f"pkg/{name}"] = ("", body[:PACKAGE_CHARS])
        pairs.append(Pair(f"q:pkg/{name}", summary, f"pkg/{name}"))
    return JudgedSet("pypackages", documents, _one_per_query(pairs))


# ----------------------------------------------------------------------------- Debian packages
def debian_packages(status: Path = DPKG_STATUS) -> JudgedSet:
    documents: dict[str, tuple[str, str]] = {}
    pairs = []
    for stanza in status.read_text(encoding="utf-8", errors="replace").split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line[1:]
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        name, description = fields.get("Package"), fields.get("Description", "")
        summary, _, long = description.partition("\n")
        # A lone "." marks a paragraph break in a control file.
        text = " ".join(w for w in long.split() if w != ".")
        if not name or len(summary.split()) < 2 or len(text) < 100:
            continue
        doc_id = f"deb/{name}"
        documents[doc_id] = (name, text)
        pairs.append(Pair(f"q:{doc_id}", " ".join(summary.split()), doc_id))
    return JudgedSet("debian", documents, _one_per_query(pairs))


# ----------------------------------------------------------------------------- TREC CAsT 2021
def cast_2021(topics: Path = CAST_TOPICS) -> JudgedSet:
    conversations = json.loads(topics.read_text(encoding="utf-8"))
    documents: dict[str, tuple[str, str]] = {}
    by_text: dict[str, str] = {}
    pairs = []
    for conversation in conversations:
        for turn in conversation["turn"]:
            passage = " ".join(str(turn.get("passage") or "").split())
            query = " ".join(str(turn.get("manual_rewritten_utterance") or "").split())
            if not passage or not query:
                continue
            doc_id = by_text.setdefault(passage, f"cast/{conversation['number']}_{turn['number']}")
            documents.setdefault(doc_id, ("", passage))
            pairs.append(Pair(f"q:{conversation['number']}_{turn['number']}", query, doc_id))
    return JudgedSet("cast2021", documents, _one_per_query(pairs))


# ----------------------------------------------------------------------------- IBM MTRAG
MTRAG_COMMIT = "cc5b1d481b391181b89f7ced860308482e785463"
# Domain as this module names it -> (MTRAG's folder name, MTRAG-UN's Collection value).
MTRAG_DOMAINS = {
    "clapnq": ("clapnq", "clapnq"),
    "cloud": ("cloud", "ibmcloud"),
    "fiqa": ("fiqa", "fiqa"),
    "govt": ("govt", "govt"),
}
_MTRAG_SPEAKER = re.compile(r"^\s*\|user\|:\s*")


def _mtrag_qrels(path: Path) -> dict[str, list[str]]:
    relevant: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        query_id, doc_id, score = line.split("\t")
        if float(score) > 0:
            relevant.setdefault(query_id, []).append(doc_id)
    return relevant


def _mtrag_passage(item: dict) -> tuple[str, str]:
    return (" ".join(str(item.get("title") or "").split()), str(item["text"]).strip())


def mtrag(domain: str, source: Path) -> JudgedSet:
    """One MTRAG domain as a judged set (see the module's docstring)."""
    folder, collection = MTRAG_DOMAINS[domain]
    documents: dict[str, tuple[str, str]] = {}
    pairs: list[Pair] = []

    # MTRAG-UN: each task carries its reference passages; its last user turn is the query.
    tasks = [
        json.loads(line)
        for line in (source / "mtragun-human/generation_tasks/reference.jsonl")
        .read_text(encoding="utf-8")
        .splitlines()
        if line.strip()
    ]
    for task in tasks:
        if task["Collection"] == collection:
            for context in task["contexts"]:
                documents.setdefault(context["document_id"], _mtrag_passage(context))
    un_qrels = _mtrag_qrels(source / f"mtragun-human/retrieval_tasks/qrels/{folder}.tsv")
    for task in tasks:
        relevant = un_qrels.get(task["task_id"])
        if task["Collection"] != collection or not relevant:
            continue
        query = " ".join(task["input"][-1]["text"].split())
        pairs += [Pair(f"lt:{task['task_id']}", query, doc_id) for doc_id in relevant]

    # MTRAG's human-evaluated subset: its passages, and the standalone rewrites of its turns.
    subset = json.loads(
        (source / "mtrag-human/evaluations/reference_subset_with_human_evaluations.json").read_text(
            encoding="utf-8"
        )
    )
    subset_passages = {d["document_id"]: _mtrag_passage(d) for d in subset["documents"]}
    human = source / "mtrag-human/retrieval_tasks" / folder
    rewrites = {
        item["_id"]: " ".join(_MTRAG_SPEAKER.sub("", item["text"]).split())
        for line in (human / f"{folder}_rewrite.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
        for item in [json.loads(line)]
    }
    human_qrels = _mtrag_qrels(human / "qrels/dev.tsv")
    for task in subset["tasks"]:
        relevant = human_qrels.get(task["task_id"], [])
        rewrite = rewrites.get(task["task_id"])
        if not relevant or not rewrite or not all(d in subset_passages for d in relevant):
            continue
        for doc_id in relevant:
            documents.setdefault(doc_id, subset_passages[doc_id])
        pairs += [Pair(f"rw:{task['task_id']}", rewrite, doc_id) for doc_id in relevant]
    for task in subset["tasks"]:
        # The subset's other passages of this domain (retrieved for a task, judged or not).
        if task["Collection"].startswith(f"mt-rag-{collection}-"):
            for doc_id in (context["document_id"] for context in task["contexts"]):
                if doc_id in subset_passages:
                    documents.setdefault(doc_id, subset_passages[doc_id])
    return JudgedSet(f"mtrag-{domain}", documents, pairs)


BUILDERS = {
    "manpages": man_pages,
    "debian": debian_packages,
    "pypackages": python_packages,
    "cast2021": cast_2021,
}
NEEDS_SOURCE = {f"mtrag-{domain}": domain for domain in MTRAG_DOMAINS}


def default_folder(name: str) -> Path:
    return Path.home() / ".cache" / "ragchains" / "judged" / name


def judged_set(name: str, source: Path | None = None) -> JudgedSet:
    """The set ``name``: one of ``BUILDERS``, or of ``NEEDS_SOURCE`` read from ``source``."""
    if name in NEEDS_SOURCE:
        if source is None:
            raise ValueError(f"{name} is built from a checkout of its benchmark: give --source")
        return mtrag(NEEDS_SOURCE[name], source)
    return BUILDERS[name]()


def build(name: str, out: Path | None = None, source: Path | None = None) -> Path:
    """Build the set ``name`` as a BEIR folder; return the folder."""
    return judged_set(name, source).write(out or default_folder(name))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", choices=sorted([*BUILDERS, *NEEDS_SOURCE]))
    parser.add_argument("--out", type=Path, help="default: ~/.cache/ragchains/judged/NAME")
    parser.add_argument(
        "--source",
        type=Path,
        help=f"mtrag-*: a checkout of github.com/IBM/mt-rag-benchmark (commit {MTRAG_COMMIT[:7]})",
    )
    args = parser.parse_args(argv)
    try:
        judged = judged_set(args.name, args.source)
    except (ValueError, OSError, KeyError) as exc:
        parser.error(str(exc))
    folder = judged.write(args.out or default_folder(args.name))
    queries = len({pair.query_id for pair in judged.pairs})
    print(f"{folder}: {len(judged.documents)} documents, {queries} queries")


if __name__ == "__main__":
    main()
