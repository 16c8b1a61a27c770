"""Which domains are served: the shipped examples, or a team's own domains folder over them.

A team's folder (``RAGCHAINS_DOMAINS``, ``--domains DIR``) has the layout of the shipped
``prompts/``, one folder per domain::

    my-domains/
      domains.yaml          optional: shipped: [hr]  (shipped examples to keep serving)
      legal/
        domain.yaml         description, glossary, ..., documents: (the domain's documents)
        answer/v1.yaml      any prompt it leaves out is the default domain's
      default/              optional: the fallback domain, the team's own

With a team's folder, the team's domains and ``default`` are served, and no other shipped
domain unless ``domains.yaml`` names it: the shipped ``hr`` and ``catalog`` are about the
sample company (its glossary, its suggested questions, its documents). A team's domain with a
shipped name replaces the shipped one. The team's ``default`` replaces the shipped one too,
prompt by prompt: a prompt it leaves out is the shipped default's, its suggested questions
are only its own (the shipped default's are about the samples).
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from ragchains.prompts.problems import (
    FileProblem,
    PromptFileError,
    line_of,
    load_yaml,
    validated,
)
from ragchains.prompts.registry import (
    DEFAULT_DOMAIN,
    DOMAIN_FILE,
    Domain,
    domain_folders,
    load_domain,
)

log = logging.getLogger(__name__)

# The team's folder's own settings, beside its domain folders.
FOLDER_FILE = "domains.yaml"


class FolderFile(BaseModel):
    """The schema of a domains folder's ``domains.yaml``."""

    model_config = ConfigDict(extra="forbid")

    shipped: list[str] = Field(
        default_factory=list,
        description="shipped example domains to serve beside the folder's own, by name",
    )


@dataclass(frozen=True)
class Served:
    """The domains to serve, and the shipped ones the team's folder replaced (logged)."""

    domains: dict[str, Domain]
    replaced: tuple[str, ...] = ()


def load_folder(root: Path, problems: list[FileProblem]) -> dict[str, Domain]:
    """Every domain in ``root`` that loads; each file's problem added to ``problems``."""
    domains = {}
    for folder in domain_folders(root):
        domain = load_domain(folder, problems)
        if domain is not None:
            domains[folder.name] = domain
    return domains


def served_domains(shipped_root: Path, team: Path | None, required: tuple[str, ...]) -> Served:
    """The domains to serve: the shipped ones (``team`` None), else the team's over the
    shipped ``default`` and those ``domains.yaml`` names. PromptFileError lists every
    problem of every file."""
    problems: list[FileProblem] = []
    shipped = load_folder(shipped_root, problems)
    if problems:  # the package's own files: nothing a team can fix
        raise PromptFileError(problems)
    if DEFAULT_DOMAIN not in shipped:
        raise PromptFileError(FileProblem(shipped_root, f"no {DEFAULT_DOMAIN!r} domain folder"))
    if team is None:
        _require(shipped[DEFAULT_DOMAIN], required, shipped_root / DEFAULT_DOMAIN)
        return Served(shipped)
    if not team.is_dir():
        raise PromptFileError(
            FileProblem(team, "the domains folder does not exist (or is not a folder)")
        )
    kept = _kept_shipped(team, shipped, problems)
    if (team / DOMAIN_FILE).is_file():
        problems.append(
            FileProblem(
                team / DOMAIN_FILE,
                f"a domains folder holds one folder per domain, each with its own "
                f"{DOMAIN_FILE} (the folder's own settings are {FOLDER_FILE})",
            )
        )
    own = load_folder(team, problems)
    for domain in own.values():
        problems.extend(_unknown_prompts(domain, required))
    if problems:
        raise PromptFileError(problems)
    # The shipped default's suggested questions are about the samples: not the team's.
    served = {DEFAULT_DOMAIN: replace(shipped[DEFAULT_DOMAIN], suggestions={}), **kept}
    replaced = tuple(sorted(name for name in own if name in shipped))
    for name, domain in own.items():
        if name == DEFAULT_DOMAIN:
            domain = _over_shipped_default(domain, shipped[DEFAULT_DOMAIN])
        served[name] = domain
    for name in replaced:
        log.info("domain %r: %s replaces the shipped one", name, own[name].folder)
    _require(served[DEFAULT_DOMAIN], required, team / DEFAULT_DOMAIN)
    return Served(dict(sorted(served.items())), replaced)


def _kept_shipped(
    team: Path, shipped: dict[str, Domain], problems: list[FileProblem]
) -> dict[str, Domain]:
    """The shipped domains ``domains.yaml`` asks for by name."""
    path = team / FOLDER_FILE
    if not path.is_file():
        return {}
    try:
        data, document = load_yaml(path)
        settings: FolderFile = validated(
            FolderFile, data if data is not None else {}, path, document
        )
    except PromptFileError as exc:
        problems.extend(exc.problems)
        return {}
    kept = {}
    for n, name in enumerate(settings.shipped):
        if name not in shipped:
            problems.append(
                FileProblem(
                    path,
                    f"shipped.{n}: no shipped domain {name!r}; shipped: "
                    + ", ".join(sorted(shipped)),
                    line_of(document, ("shipped", n)),
                )
            )
            continue
        kept[name] = shipped[name]
    return kept


def _unknown_prompts(domain: Domain, known: tuple[str, ...]) -> list[FileProblem]:
    """A prompt folder no chain reads (a misspelt ``anwser`` would leave the domain
    answering with default's ``answer`` without a word)."""
    if not known or domain.folder is None:
        return []
    found = []
    for name in sorted(set(domain.prompts) - set(known)):
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        found.append(
            FileProblem(
                domain.folder / name,
                f"no chain reads a prompt {name!r} (they read {', '.join(known)}){hint}",
            )
        )
    return found


def _over_shipped_default(team_default: Domain, shipped_default: Domain) -> Domain:
    """The team's default domain, its missing prompts the shipped default's (suggestions
    are not inherited: the shipped ones are about the samples)."""
    return replace(team_default, prompts={**shipped_default.prompts, **team_default.prompts})


def _require(default: Domain, required: tuple[str, ...], where: Path) -> None:
    missing = [name for name in required if name not in default.prompts]
    if missing:
        raise PromptFileError(FileProblem(where, f"the required prompt {missing[0]!r} is missing"))
