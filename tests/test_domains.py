"""A team's domains folder: which domains are served, every problem on its line, document
scopes, the live registry that follows the folder, and `ragchains domains new|check|list`."""

from __future__ import annotations

import logging
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from ragchains.chains.options import Choices
from ragchains.factory import build_service
from ragchains.prompts.live import LiveRegistry, folder_stamp
from ragchains.prompts.problems import FileProblem, PromptFileError
from ragchains.prompts.registry import CHAIN_PROMPTS, PROMPTS_DIR, PromptRegistry
from ragchains.prompts.scaffold import ScaffoldError, write_domain
from ragchains.retrievers.embeddings import SentenceTransformerEmbedder
from ragchains.retrievers.filters import MetadataColumns, MetadataFilter
from ragchains.retrievers.scope import DocumentScope, scope_mask
from ragchains.retrievers.searchindex import load_index
from ragchains.serving.collection import unfound_domains
from ragchains.settings import Settings
from tests.fakes import NoCallModel
from tests.servers import RAGCHAINS, user_env

SHIPPED = PromptRegistry(required=CHAIN_PROMPTS)
LEGAL = """\
description: Contracts and the policies they refer to
glossary:
  NDA: non-disclosure agreement
documents:
  paths: [legal/**]
"""
ANSWER = """\
name: answer
version: {version}
description: legal answers
input_variables: [question, context]
messages:
  - role: system
    content: Answer from the sources, citing them.
  - role: human
    content: "{{context}} {{question}}"
"""


def team_folder(root: Path) -> Path:
    """A domains folder with a ``legal`` domain of its own (domain.yaml and answer v1)."""
    (root / "legal" / "answer").mkdir(parents=True)
    (root / "legal" / "domain.yaml").write_text(LEGAL)
    (root / "legal" / "answer" / "v1.yaml").write_text(ANSWER.format(version=1))
    return root


def load(team: Path) -> PromptRegistry:
    return PromptRegistry(team=team, required=CHAIN_PROMPTS)


# ----------------------------------------------------------------------------- served
def test_a_team_folder_serves_its_domains_and_default_only(tmp_path: Path) -> None:
    registry = load(team_folder(tmp_path))
    assert sorted(registry.domains) == ["default", "legal"]
    legal = registry.domain("legal")
    assert legal.folder == tmp_path / "legal"
    assert legal.scope == DocumentScope(paths=("legal/**",))
    # Its own answer; every prompt it leaves out is the default domain's.
    assert registry.get("legal", "answer").ref == "legal/answer@v1"
    assert registry.get("legal", "quote").ref == "default/quote@v1"
    # The shipped default's suggested questions are about the samples: not offered.
    assert registry.suggestions("default") is None
    assert SHIPPED.suggestions("default") is not None


def test_the_folder_keeps_a_shipped_domain_by_name_and_replaces_one_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    team = team_folder(tmp_path)
    (team / "domains.yaml").write_text("shipped: [hr]\n")
    shutil.copytree(team / "legal", team / "catalog")
    with caplog.at_level(logging.INFO, logger="ragchains.prompts"):
        registry = load(team)
    assert sorted(registry.domains) == ["catalog", "default", "hr", "legal"]
    assert registry.domain("hr").folder == PROMPTS_DIR / "hr"
    assert registry.domain("catalog").folder == team / "catalog"
    assert registry.replaced == ("catalog",)
    assert "domain 'catalog'" in caplog.text and "replaces the shipped one" in caplog.text


def test_the_teams_default_replaces_the_shipped_one_prompt_by_prompt(tmp_path: Path) -> None:
    team = team_folder(tmp_path)
    (team / "default" / "answer").mkdir(parents=True)
    (team / "default" / "domain.yaml").write_text("description: Our documents\n")
    (team / "default" / "answer" / "v1.yaml").write_text(ANSWER.format(version=1))
    registry = load(team)
    assert registry.domain("default").description == "Our documents"
    assert sorted(registry.versions("default", "answer")) == [1]  # its own, not v1 and v2
    assert registry.get("default", "answer").path == team / "default" / "answer" / "v1.yaml"
    assert registry.get("default", "rewrite").path.is_relative_to(PROMPTS_DIR)


@pytest.mark.parametrize(
    ("write", "expected"),
    [
        (
            {"legal/domain.yaml": LEGAL.replace("non-disclosure agreement", "[non, disclosure]")},
            ["legal/domain.yaml:3: glossary.NDA: Input should be a valid string"],
        ),
        (
            {"legal/domain.yaml": LEGAL + "multi_query: 9\nanswer_style: loud\n"},
            [
                "legal/domain.yaml:6: multi_query: Input should be less than or equal to 5",
                "legal/domain.yaml:7: answer_style: Input should be 'auto', 'quote' or 'free'",
            ],
        ),
        (
            {"legal/domain.yaml": "description: x\ndocuments:\n  paths: [/etc/**]\n"},
            ["legal/domain.yaml:3: documents.paths: '/etc/**': a path inside the ingested folder"],
        ),
        (
            {"legal/domain.yaml": "description: x\ndocuments:\n  filters:\n    - {field: a}\n"},
            [
                "legal/domain.yaml:4: documents.filters.0.op: Field required",
                "legal/domain.yaml:4: documents.filters.0.value: Field required",
            ],
        ),
        (
            {"legal/answer/v1.yaml": "name: answer\nversion: [1\n"},
            ["legal/answer/v1.yaml:3: cannot be read as YAML"],
        ),
        (
            {"legal/answer/v1.yaml": ANSWER.format(version=2)},
            ["legal/answer/v1.yaml:2: version 2 does not match the file name"],
        ),
        (
            {"domains.yaml": "shipped: [hr, sales]\n"},
            ["domains.yaml:1: shipped.1: no shipped domain 'sales'; shipped: catalog"],
        ),
        ({"domain.yaml": LEGAL}, ["domain.yaml: a domains folder holds one folder per domain"]),
        ({"Legal/domain.yaml": LEGAL}, ["Legal: domain names are lowercase letters"]),
    ],
)
def test_every_problem_is_named_by_file_line_and_reason(
    tmp_path: Path, write: dict[str, str], expected: list[str]
) -> None:
    team = team_folder(tmp_path)
    for name, text in write.items():
        (team / name).parent.mkdir(parents=True, exist_ok=True)
        (team / name).write_text(text)
    with pytest.raises(PromptFileError) as info:
        load(team)
    found = [str(p).removeprefix(f"{team}/") for p in info.value.problems]
    assert len(found) == len(expected), found
    for line, start in zip(found, expected, strict=True):
        assert line.startswith(start), (line, start)
    assert str(info.value).startswith(str(team / next(iter(write)).split("/")[0]))


def test_a_missing_folder_is_one_clear_problem(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match="the domains folder does not exist"):
        load(tmp_path / "nowhere")


# ----------------------------------------------------------------------------- scopes
# A path pattern, a source name, and whether the file is within the pattern.
PATHS = [
    ("legal/**", "docs/legal/nda.pdf", True),  # inside the ingested folder
    ("legal/**", "legal/nda.pdf", True),  # an ingested folder named legal
    ("legal/**", "docs/legal/2024/nda.pdf", True),
    ("legal", "docs/legal/2024/nda.pdf", True),  # a folder takes all under it
    ("legal/", "docs/legal/nda.pdf", True),
    ("docs/legal/*.pdf", "docs/legal/nda.pdf", True),  # the ingested folder's name first
    ("legal/*.pdf", "docs/legal/2024/nda.pdf", False),  # * stays within one folder
    ("legal/**/*.pdf", "docs/legal/2024/nda.pdf", True),
    ("legal/**/*.pdf", "docs/legal/nda.pdf", True),
    ("legal/**", "docs/other/legal/nda.pdf", False),  # not a folder at the top
    ("legal/**", "docs/legalese/nda.pdf", False),
    ("*.csv", "samples/products.csv", True),
    ("*.csv", "samples/catalog/products.csv", False),
    ("**/*.csv", "samples/catalog/products.csv", True),
    ("catalog/product?.csv", "samples/catalog/products.csv", True),
    ("catalog/[pq]roducts.csv", "samples/catalog/products.csv", True),
    ("catalog/[!p]roducts.csv", "samples/catalog/products.csv", False),
    ("a+b (1)/x.md", "docs/a+b (1)/x.md", True),  # regex characters are literal
    ("a.md", "docs/aXmd", False),
    ("*.pdf", "docs/x.pdf/notes.md", False),  # a pattern with a wildcard names files only
    ("legal[!x]*", "docs/legal/secret.md", False),  # a set is never the "/" between folders
]


def kept_by(pattern: str, source: str) -> bool:
    """Whether an index folder's scope mask keeps a chunk of ``source`` (what a search runs)."""
    columns = MetadataColumns([{"source": source}], {"source": "string"})
    return bool(scope_mask(columns, DocumentScope(paths=(pattern,)))[0])


@pytest.mark.parametrize(("pattern", "source", "inside"), PATHS)
def test_scope_paths_match_files_inside_the_ingested_folder(
    pattern: str, source: str, inside: bool
) -> None:
    assert kept_by(pattern, source) is inside


def test_postgresql_reads_the_scope_paths_as_the_index_folder_does(postgres: Any) -> None:
    """The same expression, the same answer, in PostgreSQL's regular expressions (a store's
    scope) as in Python's (an index folder's), newlines in names included."""
    odd = [
        ("legal/**", "docs/legal/a\nb.md", True),
        ("*.pdf", "docs/x.pdf\n", False),
        ("legal[/]x", "docs/legal/x", False),
    ]
    cases = [*PATHS, *odd]
    with psycopg.connect(postgres.url) as conn:
        for pattern, source, inside in cases:
            regex = DocumentScope(paths=(pattern,)).source_regex
            (found,) = conn.execute("SELECT %s ~ %s", (source, regex)).fetchone()  # type: ignore[misc]
            assert found is inside is kept_by(pattern, source), (pattern, source)


@pytest.mark.parametrize(
    ("paths", "reason"),
    [
        (["/etc/*"], "not absolute"),
        (["legal/../hr/*"], "no '..'"),
        (["legal\\*"], "no backslashes"),
        (["legal/[ab"], "is not closed"),
        ([""], "at least 1 character"),
    ],
)
def test_scope_paths_that_cannot_name_a_file_are_refused(paths: list[str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        DocumentScope.model_validate({"paths": paths})


def test_a_scope_masks_rows_by_path_and_filter_and_a_missing_field_keeps_nothing() -> None:
    rows = [
        {"source": "docs/legal/nda.md", "format": "markdown"},
        {"source": "docs/legal/nda.md", "format": "markdown"},
        {"source": "docs/legal/terms.pdf", "format": "pdf"},
        {"source": "docs/catalog.csv", "format": "csv"},
    ]
    columns = MetadataColumns(rows, {"source": "string", "format": "string"})
    by_path = DocumentScope(paths=("legal",))
    assert scope_mask(columns, by_path).tolist() == [True, True, True, False]
    pdfs = by_path.model_copy(
        update={"filters": (MetadataFilter(field="format", op="=", value="pdf"),)}
    )
    assert scope_mask(columns, pdfs).tolist() == [False, False, True, False]
    unknown = DocumentScope(filters=(MetadataFilter(field="department", op="=", value="x"),))
    assert not scope_mask(columns, unknown).any()
    assert columns.values_in("source", np.array([True, False, True, False])) == {
        "docs/legal/nda.md",
        "docs/legal/terms.pdf",
    }


def test_the_index_keeps_one_mask_per_scope_and_names_its_files(sample_index: Path) -> None:
    index = load_index(sample_index)
    try:
        scope = DocumentScope(paths=("handbook/**", "policies/*.md"))
        first = index.scope_rows(scope)
        assert first is not None and index.scope_rows(scope) is first  # worked out once
        assert index.scope_rows(DocumentScope()) is None
        sources = index.scope_sources(scope)
        assert sources and all(
            s.startswith(("samples/handbook/", "samples/policies/")) for s in sources
        )
    finally:
        index.close()


# ----------------------------------------------------------------------------- live
def test_the_live_registry_serves_edits_and_keeps_the_last_good_load(tmp_path: Path) -> None:
    team = team_folder(tmp_path)
    live = LiveRegistry(lambda: load(team), team)
    choices = Choices(live, ("answer",))
    assert sorted(live.domains) == ["default", "legal"]
    assert live.refresh() is False  # nothing changed
    # A new domain and a new answer version: served at the next look.
    shutil.copytree(team / "legal", team / "sales")
    (team / "legal" / "answer" / "v2.yaml").write_text(ANSWER.format(version=2))
    assert live.refresh() is True
    assert sorted(live.domains) == ["default", "legal", "sales"]
    assert live.get("legal", "answer").ref == "legal/answer@v2"  # latest moved
    assert choices.resolve({"domain": "sales"}).domain == "sales"
    spec = next(s for s in choices.specs if s.id == "domain")
    assert spec.annotation.__metadata__[0].json_schema["enum"] == ["default", "legal", "sales"]
    # A broken edit: not served; the last good load is, and the problem is named inside
    # the folder (the probe that shows it needs no key).
    (team / "sales" / "domain.yaml").write_text("description: [sales\n")
    assert live.refresh() is False
    assert sorted(live.domains) == ["default", "legal", "sales"]
    (shown,) = live.problems_shown()
    assert shown.startswith(f"{team.name}/sales/domain.yaml:2: cannot be read as YAML")
    pinned = choices.resolve({"domain": "legal", "answer_version": "v1"})
    assert pinned.prompt("answer").ref == "legal/answer@v1"  # a pinned version still there
    # Fixed: served, the problem gone.
    (team / "sales" / "domain.yaml").write_text("description: Sales\n")
    assert live.refresh() is True
    assert live.domain("sales").description == "Sales" and live.problems_shown() == []


def test_the_watcher_serves_a_new_domain_within_two_seconds(tmp_path: Path) -> None:
    team = team_folder(tmp_path)
    live = LiveRegistry(lambda: load(team), team)
    live.watch()
    try:
        shutil.copytree(team / "legal", team / "sales")
        from tests.servers import wait_until

        wait_until(lambda: "sales" in live.domains, "the new domain", timeout=2, every=0.05)
    finally:
        live.close()


def test_a_broken_folder_stops_the_start(tmp_path: Path) -> None:
    team = team_folder(tmp_path)
    (team / "legal" / "domain.yaml").write_text("glossary: {}\n")
    with pytest.raises(PromptFileError, match=r"legal/domain\.yaml:1: description: Field"):
        LiveRegistry(lambda: load(team), team)


# ----------------------------------------------------------------------------- new
def test_a_new_domain_has_every_prompt_and_loads(tmp_path: Path) -> None:
    written = write_domain(SHIPPED, tmp_path, "legal", "hr", "Contracts: NDAs # and more")
    assert [p.relative_to(tmp_path).as_posix() for p in written] == [
        "legal/domain.yaml",
        *(f"legal/{name}/v1.yaml" for name in CHAIN_PROMPTS),
    ]
    registry = load(tmp_path)
    legal = registry.domain("legal")
    assert legal.description == "Contracts: NDAs # and more"
    assert sorted(legal.prompts) == sorted(CHAIN_PROMPTS)
    answer = (tmp_path / "legal" / "answer" / "v1.yaml").read_text()
    assert "{context}: the sources kept for the question" in answer
    assert f"Started from {SHIPPED.get('hr', 'answer').ref}" in answer
    assert not list(tmp_path.glob(".legal-*"))  # no staging folder left behind
    with pytest.raises(ScaffoldError, match="already exists"):
        write_domain(SHIPPED, tmp_path, "legal", "default", "x")
    with pytest.raises(ScaffoldError, match="lowercase letters"):
        write_domain(SHIPPED, tmp_path, "Legal Team", "default", "x")
    with pytest.raises(ScaffoldError, match="--from: unknown domain 'sales'"):
        write_domain(SHIPPED, tmp_path, "sales", "sales", "x")


def ragchains(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RAGCHAINS), *args], capture_output=True, text=True, cwd=cwd, env=user_env(),
        timeout=120, check=False,
    )  # fmt: skip


def test_the_domains_commands_write_check_and_list_a_folder(
    tmp_path: Path, sample_index: Path
) -> None:
    team = tmp_path / "my-domains"
    made = ragchains("domains", "new", "legal", "--domains", str(team), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    (team / "legal" / "domain.yaml").write_text(
        LEGAL.replace("legal/**", "handbook/**")
        + "  filters:\n    - {field: department, op: '=', value: legal}\n"
    )
    folder = ("--domains", str(team), "--index", str(sample_index))
    checked = ragchains("domains", "check", *folder, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "warning: " in checked.stdout and "no field 'department'" in checked.stdout
    assert "checks out: 1 domain(s) of its own (legal); served: default, legal" in checked.stdout
    (team / "legal" / "domain.yaml").write_text(LEGAL)
    listed = ragchains("domains", "list", *folder, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "legal  (yours)  Contracts and the policies they refer to" in listed.stdout
    assert "documents: paths legal/** (0 of 13 files)" in listed.stdout
    assert "documents: every document (13 of 13 files)" in listed.stdout
    (team / "legal" / "answer" / "v1.yaml").write_text(
        textwrap.dedent(ANSWER.format(version=1)).replace("[question, context]", "[question]")
    )
    broken = ragchains("domains", "check", "--domains", str(team), cwd=tmp_path)
    assert broken.returncode == 1
    assert broken.stdout.startswith(f"{team}/legal/answer/v1.yaml:4: input_variables do not match")
    assert broken.stderr.strip() == f"error: 1 problem(s) in {team}; fix them and check again"
    missing = ragchains("domains", "check", cwd=tmp_path)
    assert missing.returncode == 2 and "no domains folder" in missing.stderr


def test_a_domains_cut_applies_to_its_own_documents_only(
    settings: Settings, sample_index: Path, embedder: SentenceTransformerEmbedder
) -> None:
    """The catalog's 0.3 cut is for short product rows: over the handbook it let "What is
    the CEO's salary?" be answered with the 401(k) sentence (best 0.37). Scoped to the
    tables, the catalog finds nothing to answer it with, and the model is not asked."""
    service = build_service(settings, sample_index, llm=NoCallModel(), embedder=embedder)
    ask = service.chains.ask
    out = ask.invoke(
        {"question": "What is the CEO's salary?"}, {"configurable": {"domain": "catalog"}}
    )
    assert out["abstained"] and out["sources"] == []
    found = service.chains.retrieve.invoke(
        "AquaSense Soil Probe price", {"configurable": {"domain": "catalog"}}
    )
    assert found and all(d.metadata["source"].startswith("samples/catalog/") for d in found)


def test_a_misspelt_prompt_folder_is_named_and_editor_backups_are_not_versions(
    tmp_path: Path,
) -> None:
    team = team_folder(tmp_path)
    (team / "legal" / "answer" / "v1.yaml~").write_text("half an edit")
    (team / "legal" / "answer" / "#v1.yaml#").write_text("an unsaved edit")
    assert sorted(load(team).versions("legal", "answer")) == [1]
    (team / "legal" / "anwser").mkdir()
    (team / "legal" / "anwser" / "v1.yaml").write_text(
        ANSWER.format(version=1).replace("name: answer", "name: anwser")
    )
    with pytest.raises(PromptFileError) as info:
        load(team)
    (problem,) = info.value.problems
    assert str(problem) == (
        f"{team}/legal/anwser: no chain reads a prompt 'anwser' (they read rewrite, "
        "multi_query, requery, answer, quote); did you mean 'answer'?"
    )


def test_edits_inside_a_linked_domain_folder_are_served(tmp_path: Path) -> None:
    elsewhere = team_folder(tmp_path / "checkout") / "legal"
    team = tmp_path / "my-domains"
    team.mkdir()
    (team / "legal").symlink_to(elsewhere, target_is_directory=True)
    live = LiveRegistry(lambda: load(team), team)
    (elsewhere / "domain.yaml").write_text(LEGAL.replace("Contracts and", "Contracts, NDAs and"))
    assert live.refresh() is True
    assert live.domain("legal").description.startswith("Contracts, NDAs and")
    (tmp_path / "checkout" / "loop").symlink_to(tmp_path, target_is_directory=True)
    assert folder_stamp(tmp_path)  # a link back up is walked once, and the walk ends


def test_a_folder_that_could_not_be_read_is_tried_again(tmp_path: Path) -> None:
    """A load that failed on the file system (permissions, a folder removed while it was
    read) is told, then tried again at the next look without waiting for another edit."""
    team = team_folder(tmp_path)
    failures = [PermissionError(13, "Permission denied", str(team / "legal"))]

    def load_once_unreadable() -> PromptRegistry:
        if failures and (team / "sales").exists():
            try:
                raise failures.pop()
            except OSError as exc:
                raise PromptFileError(
                    FileProblem(team / "legal", "cannot be read (Permission denied)")
                ) from exc
        return load(team)

    live = LiveRegistry(load_once_unreadable, team)
    shutil.copytree(team / "legal", team / "sales")
    assert live.refresh() is False
    assert live.problems_shown() == [f"{team.name}/legal: cannot be read (Permission denied)"]
    assert live.refresh() is True and "sales" in live.domains  # no edit in between
    assert live.problems_shown() == []


def test_new_starts_from_a_shipped_domain_beside_a_folders_own(tmp_path: Path) -> None:
    team = team_folder(tmp_path / "my-domains")
    made = ragchains(
        "domains", "new", "people", "--from", "hr", "--domains", str(team), cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert "Started from hr/answer@v2" in (team / "people" / "answer" / "v1.yaml").read_text()
    (team / "legal" / "domain.yaml").write_text("glossary: {}\n")  # the folder does not load
    made = ragchains("domains", "new", "more", "--domains", str(team), cwd=tmp_path)
    assert made.returncode == 0, made.stderr  # from the shipped default: nothing it needs
    refused = ragchains(
        "domains", "new", "x", "--from", "legal", "--domains", str(team), cwd=tmp_path
    )
    assert refused.returncode == 2
    assert (
        refused.stderr.startswith("error: --from legal: ")
        and "description: Field" in refused.stderr
    )


def test_a_domain_whose_documents_the_index_lacks_is_told_at_start(
    settings: Settings,
    sample_index: Path,
    embedder: SentenceTransformerEmbedder,
    docs_dir: Path,
    ingest_into: Any,
    tmp_path: Path,
) -> None:
    served = build_service(settings, sample_index, llm=NoCallModel(), embedder=embedder)
    assert unfound_domains(served) == []  # the samples hold the handbook and the tables
    ingest_into(docs_dir, tmp_path / "other")
    other = build_service(settings, tmp_path / "other", llm=NoCallModel(), embedder=embedder)
    told = unfound_domains(other)
    assert [line.split(" answers ")[0] for line in told] == ["domain 'catalog'", "domain 'hr'"]
    assert "serve your own domains with --domains DIR" in told[0]
