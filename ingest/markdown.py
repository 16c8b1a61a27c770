"""Markdown as documentation tools write it, read into titled sections.

Python-Markdown and mkdocs (attribute lists, ``!!!`` admonitions, snippets, mkdocstrings),
mkdocs-material and pymdownx (``///`` blocks, ``{* *}`` includes, content tabs) and MyST
(``(label)=`` targets, ``{directive}`` fences, ``{role}`` text, TOML or YAML front matter) all
add syntax that plain Markdown shows as text. ``clean_markdown`` rewrites it to plain Markdown
first (a heading's given id becomes its anchor), then ``markdown_parts`` splits the result at
its headings as before.

Line rules rather than a parser: markdown-it-py is installed only as another package's
dependency and without mdit-py-plugins, which is where attribute lists, admonitions and MyST
syntax live.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from langchain_text_splitters import MarkdownHeaderTextSplitter

from ragchains.ingest.parts import LoadedFile, LoadOptions, Part, SkipFile, read_text, slugify

__all__ = ["clean_markdown", "load_markdown", "markdown_parts", "split_front_matter"]

_HEADERS = [("#", "h1"), ("##", "h2"), ("###", "h3"), ("####", "h4")]
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)\n---[ \t]*(?:\n|\Z)", re.DOTALL)
_TOML_FRONT_MATTER = re.compile(r"\A\+\+\+[ \t]*\n(.*?)\n\+\+\+[ \t]*(?:\n|\Z)", re.DOTALL)
_TITLE_LINE = re.compile(r"^title:\s*[\"']?(.+?)[\"']?\s*$", re.MULTILINE)
_TOML_TITLE_LINE = re.compile(r"^title\s*=\s*[\"'](.+?)[\"']\s*$", re.MULTILINE)

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")
_DIRECTIVE_INFO = re.compile(r"^\{(?P<name>[\w:.+-]+)\}[ \t]*(?P<arg>.*)$")
# ``:::{note}``, or ``:::bg-primary`` (a container with a class); ``::: pkg.mod`` is mkdocstrings.
_COLON_FENCE = re.compile(
    r"^[ \t]*(?P<fence>:{3,})(?:[ \t]*\{(?P<name>[\w:.+-]+)\}|(?P<css>[\w-]+))[ \t]*(?P<arg>.*)$"
)
_DIRECTIVE_OPTION = re.compile(r"^[ \t]*:[\w-]+:(?:[ \t].*)?$")
_BLOCK = re.compile(
    r"^[ \t]*(?P<fence>/{3,})[ \t]*(?P<name>[\w-]+)[ \t]*(?:\|[ \t]*(?P<title>.*))?$"
)
_BLOCK_OPTION = re.compile(r"^(?: {4}|\t)[\w-]+:")
_ADMONITION = re.compile(
    r"^(?P<indent>[ \t]*)(?:!!!|\?\?\?\+?)[ \t]*(?P<kind>[\w-]+(?:[ \t]+[\w-]+)*)?"
    r"[ \t]*(?:\"(?P<title>[^\"]*)\")?[ \t]*$"
)
_TAB = re.compile(r"^(?P<indent>[ \t]*)===\+?[ \t]+\"(?P<title>[^\"]*)\"[ \t]*$")
_HEADING = re.compile(r"^ {0,3}(?P<hashes>#{1,6})(?:[ \t]+(?P<text>.*?))?[ \t]*$")
_TARGET = re.compile(r"^[ \t]*\((?P<label>[^()\s][^()]*)\)=[ \t]*$")
_INCLUDE = re.compile(r"^[ \t]*(?:\{\*.*\*\}|\{!.*!\}|-{1,2}8<-{1,2}[ \t]+\S.*)[ \t]*$")
_SNIPPET_BLOCK = re.compile(r"^[ \t]*-{1,2}8<-{1,2}[ \t]*$")
_MKDOCSTRINGS = re.compile(r"^(?P<indent>[ \t]*):::[ \t]+[\w.:-]+[ \t]*$")
_ATTR_TOKEN = r"(?:[#.][\w:.-]+|[\w:-]+=(?:\"[^\"]*\"|'[^']*'|[^\s}\"']+))"
_ATTR_TOKENS = r"[ \t]*" + _ATTR_TOKEN + r"(?:[ \t]+" + _ATTR_TOKEN + r")*[ \t]*"
# The look-behind starts a match only at a run's first blank: else each blank of a long run
# starts a scan of the rest of it (minutes for a line of thousands of blanks).
_ATTR_LIST = re.compile(r"(?<![ \t])[ \t]*\{:?" + _ATTR_TOKENS + r"\}")
_ATTR_LINE = re.compile(r"^" + _ATTR_LIST.pattern + r"[ \t]*$")
_ATTR_ONLY = re.compile(_ATTR_TOKENS)
_ROLE = re.compile(r"\{[\w:.+-]+\}`(?P<body>[^`]+)`")
_ROLE_TITLE = re.compile(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
# A closing ``:::`` or ``///`` whose opening was not one of ours.
_STRAY_FENCE = re.compile(r"^[ \t]*(?::{3,}|/{3,})[ \t]*$")
_CODE_TOKEN = re.compile(r"RAGCHAINSCODE\d+X")
# Deeper blocks are read as text: each level re-reads what it holds, and a hostile file of
# thousands of nested admonitions would take minutes and gigabytes, then overflow the stack.
_MAX_NESTING = 16
_SAFE_ID = re.compile(r"^[\w][\w.:-]*$")

# Directives whose body is code: kept as a plain fence in the language given.
_CODE_DIRECTIVES = {"code-block", "code", "code-cell", "sourcecode"}
# Directives that pull in other files or lay out navigation: nothing of this file's own text.
_DROPPED_DIRECTIVES = {"include", "literalinclude", "toctree"}
# Directives whose argument is a path or a condition rather than a title a reader sees.
_UNTITLED_DIRECTIVES = {"figure", "image", "only", "raw", "eval-rst", "math", "glossary"}


@dataclass
class _Cleaned:
    lines: list[str] = field(default_factory=list)
    # Each code block's own text, put back verbatim after splitting: the splitter strips each
    # line and closes a fence at any shorter one, so it never sees code.
    code: dict[str, str] = field(default_factory=dict)
    # (heading path, anchor) of each h1-h4, in order: the splitter only reports titles.
    anchors: list[tuple[tuple[str, ...], str]] = field(default_factory=list)
    stack: list[tuple[int, str]] = field(default_factory=list)

    def keep_code(self, text: str) -> None:
        token = f"RAGCHAINSCODE{len(self.code)}X"  # _CODE_TOKEN
        self.code[token] = text
        self.lines.append(token)

    def heading(self, level: int, title: str, anchor: str) -> None:
        self.lines.append(("#" * level + " " + title).rstrip())
        if level > len(_HEADERS):
            return
        while self.stack and self.stack[-1][0] >= level:
            self.stack.pop()
        self.stack.append((level, title.strip()))
        self.anchors.append((tuple(t for _, t in self.stack), anchor))


def split_front_matter(text: str) -> tuple[str | None, str]:
    """(front matter's ``title``, the text after it): YAML between ``---`` or TOML ``+++``."""
    for block, title_line in ((_FRONT_MATTER, _TITLE_LINE), (_TOML_FRONT_MATTER, _TOML_TITLE_LINE)):
        match = block.match(text)
        if match:
            title_match = title_line.search(match.group(1))
            return (title_match.group(1) if title_match else None), text[match.end() :]
    return None, text


def _outside_code_spans(line: str, change: Callable[[str], str]) -> str:
    # Inline code is shown as written: docs about these dialects quote their syntax in it.
    out, last = [], 0
    for span in _CODE_SPAN.finditer(line):
        out.append(change(line[last : span.start()]))
        out.append(span.group(0))
        last = span.end()
    out.append(change(line[last:]))
    return "".join(out)


def _role_text(match: re.Match[str]) -> str:
    body = match.group("body")
    titled = _ROLE_TITLE.match(body)
    if titled and titled.group("text"):
        return titled.group("text")
    target = titled.group("target") if titled else body
    # {py:func}`~pkg.mod.name` is shown as its last part; a leading ! means "no link".
    target = target.lstrip("!")
    return (
        target.rsplit(".", 1)[-1]
        if target.startswith("~") and "." in target
        else target.lstrip("~")
    )


def _inline(line: str) -> str:
    line = _ROLE.sub(_role_text, line)
    return _outside_code_spans(line, lambda text: _ATTR_LIST.sub("", text))


def _heading_parts(text: str) -> tuple[str, str | None]:
    """(title without its attribute list, the id that list gives, if any)."""
    text = re.sub(r"[ \t]+#+$", "", text)  # closing hashes of "## Title ##"
    given = None
    match = re.search(r"[ \t]*\{:?[ \t]*([^{}]*)\}[ \t]*$", text)
    if match and _ATTR_ONLY.fullmatch(match.group(1)):
        ids = re.findall(r"(?:^|[ \t])#([\w:.-]+)", match.group(1))
        given = ids[-1] if ids else None
        text = text[: match.start()]
    return _inline(text).strip(), given


def _anchor(given: str | None, title: str) -> str:
    if given is None:
        return slugify(title)
    return given if _SAFE_ID.match(given) else slugify(given)


def _dedent(lines: list[str], width: int) -> list[str]:
    out = []
    for line in lines:
        expanded = line.replace("\t", "    ", 1) if line.startswith("\t") else line
        strip = min(width, len(expanded) - len(expanded.lstrip(" ")))
        out.append(expanded[strip:])
    return out


def _indent_width(line: str) -> int:
    expanded = line.expandtabs(4)
    return len(expanded) - len(expanded.lstrip(" "))


def _indented_block(lines: list[str], start: int, width: int) -> int:
    """The index after the block of lines indented by ``width`` or more (blank lines inside)."""
    end = start
    i = start
    while i < len(lines):
        if not lines[i].strip():
            i += 1
            continue
        if _indent_width(lines[i]) < width:
            break
        i += 1
        end = i
    return end


def _directive_body(lines: list[str]) -> list[str]:
    """A MyST directive's body without its ``:key: value`` or ``---`` YAML options."""
    i = 0
    if lines and lines[0].strip() == "---":
        close = next((j for j in range(1, len(lines)) if lines[j].strip() == "---"), None)
        if close is not None:
            i = close + 1
    while i < len(lines) and _DIRECTIVE_OPTION.match(lines[i]):
        i += 1
    return lines[i:]


def _fence_end(lines: list[str], start: int, fence: str) -> int:
    closing = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
    for i in range(start, len(lines)):
        if closing.match(lines[i]):
            return i
    return len(lines)


def _clean(lines: list[str], out: _Cleaned, depth: int = 0) -> None:
    if depth > _MAX_NESTING:
        out.lines.extend(_inline(line) for line in lines)
        return
    target: str | None = None
    in_comment = False
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if in_comment:
            if "-->" not in line:
                continue
            in_comment = False
            line = line.split("-->", 1)[1]
            if not line.strip():
                continue

        fence = _FENCE.match(line)
        if fence and not (fence.group("fence")[0] == "`" and "`" in fence.group("info")):
            end = _fence_end(lines, i, fence.group("fence"))
            body = lines[i:end]
            directive = _DIRECTIVE_INFO.match(fence.group("info"))
            closing_line = lines[end] if end < len(lines) else None
            i = end + 1
            if directive is None:
                code = [line, *body] + ([closing_line] if closing_line is not None else [])
                out.keep_code("\n".join(code))
            else:
                _directive(directive.group("name"), directive.group("arg"), body, out, depth)
            continue

        colon = _COLON_FENCE.match(line)
        if colon:
            end = _fence_end(lines, i, colon.group("fence"))
            body = lines[i:end]
            i = end + 1
            if colon.group("name"):
                _directive(colon.group("name"), colon.group("arg"), body, out, depth)
            else:
                _clean(body, out, depth + 1)
            continue

        block = _BLOCK.match(line)
        if block:
            marks = block.group("fence")
            closing = re.compile(r"^[ \t]*" + marks + r"[ \t]*$")
            end = next((j for j in range(i, len(lines)) if closing.match(lines[j])), len(lines))
            body = lines[i:end]
            i = end + 1
            options = 0
            while options < len(body) and _BLOCK_OPTION.match(body[options]):
                options += 1
            if block.group("title"):
                out.lines.append(_inline(block.group("title").strip()))
                out.lines.append("")
            _clean(body[options:], out, depth + 1)
            continue

        admonition = _ADMONITION.match(line) or _TAB.match(line)
        if admonition:
            width = _indent_width(line) + 4
            end = _indented_block(lines, i, width)
            title = admonition.group("title")
            if title and title.strip():
                out.lines.append(_inline(title.strip()))
                out.lines.append("")
            _clean(_dedent(lines[i:end], width), out, depth + 1)
            out.lines.append("")
            i = end
            continue

        docstrings = _MKDOCSTRINGS.match(line)
        if docstrings:
            i = _indented_block(lines, i, _indent_width(line) + 1)
            continue
        if _SNIPPET_BLOCK.match(line):
            close = next((j for j in range(i, len(lines)) if _SNIPPET_BLOCK.match(lines[j])), None)
            i = close + 1 if close is not None else i
            continue
        if _INCLUDE.match(line) or _ATTR_LINE.match(line) or _STRAY_FENCE.match(line):
            continue

        label = _TARGET.match(line)
        if label:
            target = label.group("label").strip()
            continue

        if "<!--" in line:
            before, rest = line.split("<!--", 1)
            while "-->" in rest:
                rest = rest.split("-->", 1)[1]
                if "<!--" not in rest:
                    break
                between, rest = rest.split("<!--", 1)
                before += between
            else:
                in_comment = True
                rest = ""
            line = before + rest
            if not line.strip():
                continue

        heading = _HEADING.match(line)
        if heading:
            title, given = _heading_parts(heading.group("text") or "")
            out.heading(len(heading.group("hashes")), title, _anchor(given or target, title))
            target = None
            continue
        if line.strip():
            target = None
        if _indent_width(line) >= 4 and line.lstrip().startswith("#"):
            # Indented code, not a heading: the splitter would take it for one.
            out.keep_code(line)
            continue
        out.lines.append(_inline(line))


def _directive(name: str, arg: str, body: list[str], out: _Cleaned, depth: int) -> None:
    if name in _DROPPED_DIRECTIVES:
        return
    body = _directive_body(body)
    if name in _CODE_DIRECTIVES:
        language = arg.split()[0] if arg.split() else ""
        longest = max((len(m.group(0)) for b in body for m in re.finditer("`{3,}", b)), default=2)
        fence = "`" * max(3, longest + 1)
        out.keep_code("\n".join([fence + language, *body, fence]))
        return
    if arg.strip() and name not in _UNTITLED_DIRECTIVES:
        out.lines.append(_inline(arg.strip()))
        out.lines.append("")
    _clean(body, out, depth + 1)
    out.lines.append("")


def clean_markdown(markdown: str) -> _Cleaned:
    """The dialects' syntax rewritten to plain Markdown, with code blocks set aside."""
    out = _Cleaned()
    _clean(markdown.split("\n"), out)
    return out


def markdown_parts(markdown: str) -> tuple[str | None, list[Part]]:
    """(the first h1's title, the text's sections split at h1-h4) of any dialect's Markdown."""
    cleaned = clean_markdown(markdown)
    splitter = MarkdownHeaderTextSplitter(headers_to_split_on=_HEADERS, strip_headers=False)
    parts = []
    title = None
    position = 0
    previous: tuple[str, ...] | None = None
    anchor = ""
    for doc in splitter.split_text("\n".join(cleaned.lines)):
        text = doc.page_content
        if cleaned.code:
            text = _CODE_TOKEN.sub(lambda m: cleaned.code.get(m.group(0), m.group(0)), text)
        if not text.strip():
            continue
        headings = [doc.metadata[key] for _, key in _HEADERS if key in doc.metadata]
        if title is None and "h1" in doc.metadata:
            title = doc.metadata["h1"]
        path = tuple(headings)
        if path != previous:
            anchor = slugify(headings[-1]) if headings else ""
            for j in range(position, len(cleaned.anchors)):
                if cleaned.anchors[j][0] == path:
                    anchor, position = cleaned.anchors[j][1], j + 1
                    break
            previous = path
        parts.append(Part(text=text, section=" > ".join(headings) or None, anchor=anchor))
    return title, parts


def load_markdown(path: Path, options: LoadOptions) -> LoadedFile:
    front_title, text = split_front_matter(read_text(path))
    heading_title, parts = markdown_parts(text)
    if not parts:
        # mkdocs' `--8<-- "CONTRIBUTING.md"` or MyST's ```{include}```: the page is the
        # file it includes, which ingest reads where it lies, not through the include.
        raise SkipFile(
            "no text outside front matter, comments and include lines "
            "(an included file is not read through the include: ingest it itself)"
        )
    return LoadedFile(
        format="markdown", title=front_title or heading_title or path.stem, parts=parts
    )
