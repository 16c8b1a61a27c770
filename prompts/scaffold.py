"""``ragchains domains new``: a domain folder to start from, every file commented.

The new domain gets a ``domain.yaml`` (description, glossary, the documents it answers from)
and a ``v1.yaml`` of every prompt the chains use, copied from another domain's latest
version (its own, or the ``default`` domain's it would inherit), each headed by comments
saying what its variables hold. Nothing is written unless all of it can be: the folder is
made beside its destination and renamed into place.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import textwrap
from pathlib import Path

from ragchains.prompts.registry import (
    CHAIN_PROMPTS,
    DOMAIN_FILE,
    DOMAIN_NAME,
    PromptRegistry,
)

# What each template variable holds, as a team editing a prompt needs to know it.
VARIABLES = {
    "question": "the person's question as they asked it (in a chat, the conversation so far "
    "comes before it as messages, where the prompt has a `role: history` line)",
    "context": "the sources kept for the question, each with its label in [brackets]: the "
    "answer cites them by those labels",
    "fields": "the metadata fields a question may filter on, with their types, e.g. "
    "'price (number), brand (string)'",
    "search_query": "the search query the rewrite wrote for the question",
    "n": "how many more phrasings of the query to write (domain.yaml's multi_query, minus one)",
    "previous_query": "the query whose sources scored low, for the model to write a better one",
}
# What each prompt is for, as the chains use it.
PURPOSE = {
    "rewrite": "turns a chat question into one standalone search query (chat mode)",
    "multi_query": "writes more phrasings of the query, fused with it\n"
    "# (when domain.yaml's multi_query is over 1)",
    "requery": "writes a better query when the first one's sources score low",
    "answer": "writes the answer from the sources, citing them\n# (the free answer style)",
    "quote": "picks the source sentences that answer, copied word for word\n"
    "# (the quote answer style)",
}
_VERSION_LINE = re.compile(r"^version:\s*\d+\s*$", re.MULTILINE)

DOMAIN_TEMPLATE = """\
# The {name} domain: what it is about, the words it expands, and the documents it answers
# from. Check the folder with `ragchains domains check`; a running server serves each edit
# within a second or two once it checks out (until then the last good version serves).
description: {description}

# Abbreviations written in place of their meaning in searches ("PTO" also searches "paid
# time off"), when expand_glossary is true.
glossary: {{}}
expand_glossary: true

# Phrasings of each search fused by rank (1: off; up to 5). More find more, each costs a
# model call.
multi_query: 1

# quote: answers copy sentences from the sources word for word; free: the model writes;
# auto: the server's setting decides.
answer_style: auto

# The documents this domain answers from; leave it out to answer from every document.
# paths: globs over a file's path in the folder you ingested: * and ? within a folder, **
#   across folders, a folder name takes all under it (legal/**, contracts/*.pdf). The
#   ingested folder's own name may come first (docs/legal/**).
# filters: metadata filters as `ragchains ask --filter` and a request take them, all of
#   which a chunk passes (field, op: = != < <= > >= in, value).
# documents:
#   paths: [legal/**]
#   filters:
#     - {{field: format, op: "=", value: pdf}}

# Optional: the cut the compressor applies to this domain's sources, per scorer kind, when
# a request sets none (scores run 0-1; lower keeps more).
# thresholds:
#   embedding-similarity: 0.4
"""

PROMPT_HEADER = """\
# The {prompt} prompt of the {domain} domain: it {purpose}.
# Started from {source} by `ragchains domains new`. Edit it here, or save a new version
# beside it as v2.yaml (version: 2): a request then chooses {prompt}_version v1 or v2, and
# "latest" is the highest. Leave the folder out to use the default domain's.
# The template's variables, each written {{like_this}} and listed in input_variables:
{variables}
"""


class ScaffoldError(ValueError):
    """The domain cannot be written (the message says why)."""


def write_domain(
    registry: PromptRegistry, folder: Path, name: str, source: str, description: str
) -> list[Path]:
    """Write the domain ``name`` into the domains ``folder`` (made if need be), its prompts
    started from ``source``'s in ``registry``; the files written."""
    if not DOMAIN_NAME.match(name):
        raise ScaffoldError(
            f"{name!r}: a domain's name is lowercase letters, digits, - and _, "
            "starting with a letter"
        )
    target = folder / name
    if target.exists():
        raise ScaffoldError(f"{target} already exists; choose another name or edit it")
    try:
        registry.domain(source)
    except ValueError as exc:
        raise ScaffoldError(f"--from: {exc}") from exc
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder))
    try:
        written = [DOMAIN_FILE]
        (staging / DOMAIN_FILE).write_text(
            DOMAIN_TEMPLATE.format(name=name, description=_yaml_text(description)),
            encoding="utf-8",
        )
        for prompt_name in CHAIN_PROMPTS:
            prompt = registry.get(source, prompt_name)
            text = prompt.path.read_text(encoding="utf-8")
            variables = "\n".join(
                textwrap.fill(
                    VARIABLES.get(v, "see the chain that fills it"),
                    width=92,
                    initial_indent=f"#   {{{v}}}: ",
                    subsequent_indent="#       ",
                )
                for v in prompt.input_variables
            )
            header = PROMPT_HEADER.format(
                prompt=prompt_name,
                domain=name,
                purpose=PURPOSE[prompt_name],
                source=prompt.ref,
                variables=variables,
            )
            (staging / prompt_name).mkdir()
            body = _VERSION_LINE.sub("version: 1", text, count=1)
            (staging / prompt_name / "v1.yaml").write_text(header + body, encoding="utf-8")
            written.append(f"{prompt_name}/v1.yaml")
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return [target / path for path in written]


def _yaml_text(text: str) -> str:
    """``text`` as one YAML scalar (quoted: a description may hold ': ' or '#')."""
    return '"' + " ".join(text.split()).replace("\\", "\\\\").replace('"', '\\"') + '"'
