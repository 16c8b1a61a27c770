"""A team's own domain, as a team that installed ragchains makes and serves it.

A wheel of the committed HEAD is installed (not editable) into a fresh virtual environment;
the README's worked example (*Prompts and domains*) runs there as written, in a home folder
of its own: `ragchains domains new legal`, its domain.yaml with a glossary and a documents
scope, `domains check`, `ingest` of a mixed folder (the samples and two contracts, one of
them readable by the ``legal`` group only), `domains list`, and `ragchains serve --domains`
as a subprocess, with a keys file. Against that server: only the team's domains are offered,
a legal question cites only the legal documents, per-key access holds inside the scope, and
edits to the folder are served live (a broken one is not, and /readyz says why), on the chat
page too. The same scope on a PostgreSQL store is the last test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession

from tests.browser import open_page
from tests.servers import RAGCHAINS, REPO, ragchains_serve, user_env, wait_until
from tests.test_mcp import over_http

pytestmark = pytest.mark.slow

README = REPO / "README.md"
LEGAL_DOCS = {
    "legal/nda-policy.md": """\
# Non-disclosure agreements

Every contractor signs the mutual NDA before their first day. The NDA binds both parties for
three years after the contract ends. Contractors who work remotely keep NDA material on
company laptops only, never on personal devices.
""",
    "legal/contracts/acme-msa.md": """\
# Acme master services agreement

The master services agreement with Acme Corp renews every year on 1 March. Either party may
end it with 90 days' written notice before the renewal date.
""",
}
# The contracts folder is the legal group's; everything else is everyone's.
SIDECAR = '[groups]\n"legal/contracts/*" = ["legal"]\n'
NDA_QUESTION = "How many years after the contract ends does the NDA bind both parties?"
REMOTE_QUESTION = "How many days per week may employees work remotely?"
MSA_QUESTION = "When does the master services agreement with Acme Corp renew?"
NEW_ANSWER = """\
name: answer
version: 2
description: Legal answers, the clause first
input_variables: [question, context]
messages:
  - role: system
    content: Answer from the sources, quoting the clause, and cite each source by its label.
  - role: human
    content: "Sources:\\n{context}\\n\\nQuestion: {question}"
"""


def readme_block(marker: str) -> str:
    """The fenced block after the README's ``<!-- marker`` comment."""
    text = README.read_text(encoding="utf-8")
    after = text[text.index(f"<!-- {marker}") :]
    match = re.search(r"```[a-z]*\n(.*?)```", after, re.DOTALL)
    assert match, f"no fenced block after <!-- {marker}"
    return match.group(1)


@dataclass(frozen=True)
class Team:
    home: Path
    bin: Path  # the fresh venv's console scripts
    domains: Path
    index: Path
    keys: dict[str, str]
    base: str

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin / "ragchains"), *args], capture_output=True, text=True,
            cwd=self.home, env=team_env(self.home, self.bin), timeout=300, check=False,
        )  # fmt: skip

    def get(self, path: str, key: str | None = None) -> Any:
        headers = {"X-API-Key": self.keys[key]} if key else {}
        response = httpx.get(f"{self.base}{path}", headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()

    def post(self, route: str, body: dict[str, Any], key: str = "lena") -> httpx.Response:
        headers = {"X-API-Key": self.keys[key]}
        return httpx.post(f"{self.base}{route}", json=body, headers=headers, timeout=300)

    def retrieved(
        self, query: str, domain: str, key: str = "lena", *, threshold: float | None = None
    ) -> list[str]:
        """The sources /retrieve keeps for ``query`` in ``domain``, as ``key`` reads them
        (``threshold`` 0: the best, however weak)."""
        chosen: dict[str, Any] = {"domain": domain}
        if threshold is not None:
            chosen["threshold"] = threshold
        body = {"input": {"query": query}, "config": {"configurable": chosen}}
        response = self.post("/retrieve/invoke", body, key)
        assert response.status_code == 200, response.text
        return [doc["metadata"]["source"] for doc in response.json()["output"]]


def team_env(home: Path, bin_dir: Path) -> dict[str, str]:
    return user_env(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def fresh_install(work: Path) -> Path:
    """A wheel built from a clone of HEAD (the page's libraries copied in, as a release build
    has them), installed without its dependencies into a new venv that finds them in this
    one's site-packages (as plain paths: the checkout's editable hook is not read). Returns
    the venv's bin folder."""
    clone = work / "clone"
    git = ("git", "-c", "core.symlinks=false")
    subprocess.run([*git, "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    vendor = REPO / "ragchains" / "web" / "vendor"
    shutil.copytree(vendor, clone / "ragchains" / "web" / "vendor")
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "wheel", "--quiet", "--no-index", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(clone)], check=True, timeout=600,
    )  # fmt: skip
    (wheel,) = wheels.glob("ragchains-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [*pip, "--python", str(python), "install", "--quiet", "--no-index", "--no-deps",
         str(wheel)], check=True, timeout=600,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "ragchains-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def team_docs(home: Path) -> Path:
    """~/team-docs: the samples and the legal folder, with its access sidecar."""
    docs = home / "team-docs"
    shutil.copytree(REPO / "samples", docs)
    for name, text in LEGAL_DOCS.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    (docs / ".ragchains-access.toml").write_text(SIDECAR)
    return docs


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    work = tmp_path_factory.mktemp("team")
    bin_dir = fresh_install(work)
    home = work / "home"
    home.mkdir()
    team_docs(home)
    example = readme_block("domains-example")
    *setup, serve = [line for line in example.splitlines() if line.strip()]
    assert serve.startswith("ragchains serve ")
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(setup)], capture_output=True, text=True,
        cwd=home, env=team_env(home, bin_dir), timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # The output the README shows is what the commands printed.
    for line in readme_block("domains-example-output").splitlines():
        assert line in done.stdout, line
    keys_file = home / "keys.toml"
    keys = {}
    for person, groups in (("lena", "legal,staff"), ("sam", "staff")):
        made = subprocess.run(
            [str(bin_dir / "ragchains"), "keys", "add", person, "--groups", groups,
             "--keys-file", str(keys_file)], capture_output=True, text=True, check=True,
            env=team_env(home, bin_dir),
        )  # fmt: skip
        keys[person] = made.stdout.strip()
    args = [a.replace("~/", f"{home}/") for a in serve.split()[2:]]
    with ragchains_serve(
        *args,
        program=bin_dir / "ragchains",
        cwd=home,
        HOME=str(home),
        RAGCHAINS_KEYS_FILE=str(keys_file),
    ) as base:
        yield Team(home, bin_dir, home / "my-domains", home / "team-index", keys, base)


# ----------------------------------------------------------------------------- the wheel
def test_the_server_runs_from_the_installed_wheel(team: Team) -> None:
    found = subprocess.run(
        [str(team.bin / "python"), "-c", "import ragchains.server as s; print(s.__file__)"],
        capture_output=True, text=True, check=True, cwd=team.home,
    ).stdout.strip()  # fmt: skip
    assert found.startswith(str(team.bin.parent)) and not found.startswith(str(REPO))


def test_only_the_teams_domains_and_default_are_offered(team: Team) -> None:
    models = [m["id"] for m in team.get("/v1/models", "lena")["data"]]
    assert models == ["default", "legal"]
    schema = team.get("/chat/config_schema", "lena")
    domain = schema["$defs"]["Configurable"]["properties"]["domain"]
    assert domain["enum"] == ["default", "legal"]
    assert team.get("/readyz")["domains"] == ["default", "legal"]
    collection = team.get("/collection", "lena")
    assert [d["name"] for d in collection["domains"]] == ["default", "legal"]
    # No sample company's questions: the shipped default's suggestions are not offered.
    assert all(d["suggestions"] == [] for d in collection["domains"])


def test_a_legal_question_cites_only_the_legal_documents(team: Team) -> None:
    body = {
        "input": {"question": NDA_QUESTION},
        "config": {"configurable": {"domain": "legal"}},
    }
    response = team.post("/ask/invoke", body)
    assert response.status_code == 200, response.text
    out = response.json()["output"]
    assert not out["abstained"], out["answer"]
    cited = {c["source"] for c in out["citations"]}
    assert cited == {"team-docs/legal/nda-policy.md"}, out
    assert all(s["source"].startswith("team-docs/legal/") for s in out["sources"])
    assert all(ref.startswith("legal/") for ref in out["prompts"].values()), out["prompts"]
    # A question the handbook answers: default finds it there; legal, even taking its best
    # sources however weak, only in the legal files.
    assert "team-docs/handbook/employee-handbook.md" in team.retrieved(REMOTE_QUESTION, "default")
    legal = team.retrieved(REMOTE_QUESTION, "legal", threshold=0.0)
    assert legal and all(s.startswith("team-docs/legal/") for s in legal), legal


def test_the_scope_holds_for_the_openai_api_and_the_mcp_tools(team: Team) -> None:
    body = {"model": "legal", "messages": [{"role": "user", "content": NDA_QUESTION}]}
    reply = team.post("/v1/chat/completions", body)
    assert reply.status_code == 200, reply.text
    sources = [s["source"] for s in reply.json()["ragchains"]["sources"]]
    assert sources and all(s.startswith("team-docs/legal/") for s in sources), sources

    async def use(client: ClientSession) -> list[dict[str, Any]]:
        found = await client.call_tool("search", {"query": NDA_QUESTION, "domain": "legal"})
        listed = await client.call_tool("list_domains", {})
        return [found.structuredContent or {}, listed.structuredContent or {}]

    found, listed = mcp(team, "sam", use)
    chunks = [c["source"] for c in found["chunks"]]
    assert chunks and all(c.startswith("team-docs/legal/") for c in chunks), chunks
    counts = {d["name"]: d["documents"] for d in listed["domains"]}
    assert counts["legal"] == 1  # the contract is not sam's


def test_per_key_access_holds_inside_the_scope(team: Team) -> None:
    contract = "team-docs/legal/contracts/acme-msa.md"
    assert contract in team.retrieved(MSA_QUESTION, "legal", "lena")
    assert contract not in team.retrieved(MSA_QUESTION, "legal", "sam")
    assert contract not in team.retrieved(MSA_QUESTION, "default", "sam")
    counts = {d["name"]: d["documents"] for d in team.get("/collection", "sam")["domains"]}
    assert counts == {"default": 14, "legal": 1}
    counts = {d["name"]: d["documents"] for d in team.get("/collection", "lena")["domains"]}
    assert counts == {"default": 15, "legal": 2}


# ----------------------------------------------------------------------------- live
def mcp_domains(team: Team) -> list[str]:
    """The domains the MCP ask tool offers now."""

    async def use(client: ClientSession) -> list[str]:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        options = tools["ask"].inputSchema["properties"]["domain"]["anyOf"]
        return list(next(s for s in options if "enum" in s)["enum"])

    return mcp(team, "lena", use)


def mcp(team: Team, key: str, use: Any) -> Any:
    """``use`` on an MCP session as ``key``, in a thread of its own: the browser's
    Playwright holds this thread's event loop once it has started."""
    with ThreadPoolExecutor(1) as worker:
        return worker.submit(over_http, team.base, team.keys[key], use).result()


def test_edits_are_served_live_and_a_broken_one_is_not(team: Team, browser: Any) -> None:
    made = team.run("domains", "new", "sales", "--domains", str(team.domains))
    assert made.returncode == 0, made.stderr
    (team.domains / "legal" / "answer" / "v2.yaml").write_text(NEW_ANSWER)

    def answers_with(version: str) -> str:
        """The ref of the answer prompt a legal turn pinned to ``version`` runs with (a
        question nothing answers: the turn abstains without calling the model)."""
        chosen = {"domain": "legal", "answer_version": version, "answer_style": "free"}
        body = {"input": {"question": "x"}, "config": {"configurable": chosen}}
        stream = team.post("/ask/stream_log", body)
        assert stream.status_code == 200, stream.text
        return re.findall(r"legal/answer@v\d+", stream.text)[-1]

    def served() -> bool:
        models = [m["id"] for m in team.get("/v1/models", "lena")["data"]]
        return "sales" in models and answers_with("latest") == "legal/answer@v2"

    wait_until(served, "the new domain and answer version", timeout=2, every=0.1)
    # A request pinned to v1, which still exists, keeps it.
    assert answers_with("v1") == "legal/answer@v1"
    schema = team.get("/chat/config_schema", "lena")["$defs"]["Configurable"]["properties"]
    assert schema["domain"]["enum"] == ["default", "legal", "sales"]
    # The playground, in Chromium (the key sent as a program would: a browser link cannot).
    context = browser.new_context(extra_http_headers={"X-API-Key": team.keys["lena"]})
    try:
        watched = open_page(context, f"{team.base}/chat/playground/")
        domain = watched.page.locator("[id='#/properties/domain-input']")
        domain.wait_for(timeout=15_000)
        domain.select_option("sales")
        assert domain.input_value() == "sales"
        watched.assert_clean()
    finally:
        context.close()
    assert mcp_domains(team) == ["default", "legal", "sales"]
    document = httpx.get(f"{team.base}/openapi.json", timeout=30).json()
    models = document["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]
    assert models["enum"] == ["default", "legal", "sales"]
    # A broken edit: the last good version serves, /readyz names the file.
    domain_file = team.domains / "sales" / "domain.yaml"
    good = domain_file.read_text()
    domain_file.write_text("description: [broken\n")

    def named() -> list[str]:
        return team.get("/readyz")["domains_problems"]

    (problem,) = wait_until(named, "the broken file named", timeout=5, every=0.1)
    assert problem.startswith("my-domains/sales/domain.yaml:2: cannot be read as YAML")
    assert str(team.home) not in problem  # the probe needs no key: no server paths
    assert "sales" in [m["id"] for m in team.get("/v1/models", "lena")["data"]]
    checked = team.run("domains", "check", "--domains", str(team.domains))
    assert checked.returncode == 1
    assert checked.stdout.startswith(f"{domain_file}:2: cannot be read as YAML")
    # Fixed: the fix is served.
    domain_file.write_text(good.replace("The sales domain's documents.", "Sales contracts"))

    def fixed() -> bool:
        domains = {d["name"]: d for d in team.get("/collection", "lena")["domains"]}
        return not named() and domains["sales"]["description"] == "Sales contracts"

    wait_until(fixed, "the fix served", timeout=5, every=0.1)


def test_the_readme_names_a_problem_as_check_prints_it(team: Team) -> None:
    shown = readme_block("domains-example").split("<<'EOF'\n", 1)[1].split("EOF\n", 1)[0]
    folder = team.home / "readme-check"
    (folder / "legal").mkdir(parents=True)
    (folder / "legal" / "domain.yaml").write_text(shown.replace("legal/**", "/etc/*"))
    checked = team.run("domains", "check", "--domains", str(folder))
    text = README.read_text()
    printed = text[text.index("$ ragchains domains check --domains ~/my-domains") :]
    expected = printed.split("\n")[1:3]
    got = (checked.stdout + checked.stderr).replace(str(folder), "/home/ana/my-domains")
    for line in expected:
        assert line in got, (line, got)


def test_the_chat_page_lists_a_new_domain_and_answers_from_its_documents(
    team: Team, browser: Any
) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    context.add_init_script(f"localStorage.setItem('ragchains.api-key', '{team.keys['lena']}')")
    try:
        watched = open_page(context, team.base)
        page = watched.page
        page.locator("#domain option[value='legal']").wait_for(state="attached")
        # The team's domains only, and none of the sample company's questions.
        shown = page.locator("#domain option").evaluate_all("(os) => os.map((o) => o.value)")
        assert "hr" not in shown and "catalog" not in shown and "legal" in shown, shown
        page.locator("#collection .holdings").wait_for()  # the collection has been read
        assert "15 documents you can ask about" in page.locator("#collection").inner_text()
        assert page.locator(".suggestion").count() == 0
        # A domain added while the page is open: the list shows it when it is chosen from.
        folder = team.domains / "contracts"
        (folder).mkdir()
        (folder / "domain.yaml").write_text(
            "description: The contracts\ndocuments:\n  paths: [legal/**]\n"
        )
        wait_until(lambda: "contracts" in team.get("/readyz")["domains"], "contracts", timeout=5)
        menu = page.get_by_role("button", name="Settings")
        if menu.is_visible() and menu.get_attribute("aria-expanded") != "true":
            menu.click()
        select = page.get_by_label("Domain")
        select.focus()
        page.locator("#domain option[value='contracts']").wait_for(state="attached")
        select.select_option("contracts")
        page.get_by_role("radio", name="Ask", exact=True).check()
        if menu.is_visible() and menu.get_attribute("aria-expanded") == "true":
            menu.click()
        page.get_by_placeholder("Ask a question about your documents").fill(NDA_QUESTION)
        page.get_by_role("button", name="Send", exact=True).click()
        page.get_by_role("button", name="Send", exact=True).wait_for(timeout=180_000)
        turn = page.locator(".turn").last
        cited = turn.get_by_role("region", name="Sources").locator("ul").first
        labels = cited.locator("a").all_inner_texts()
        assert labels and all(label.startswith("nda-policy.md") for label in labels), labels
        watched.assert_clean()
    finally:
        context.close()


# ----------------------------------------------------------------------------- a store
def test_a_domains_scope_and_access_hold_on_a_postgresql_store(tmp_path: Path, pg_url: str) -> None:
    docs = team_docs(tmp_path)
    domains = tmp_path / "my-domains"
    (domains / "legal").mkdir(parents=True)
    (domains / "legal" / "domain.yaml").write_text(
        "description: Contracts\ndocuments:\n  paths: [legal/**]\n"
    )
    env = user_env()
    done = subprocess.run(
        [str(RAGCHAINS), "ingest", str(docs), "--store", pg_url], capture_output=True,
        text=True, env=env, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    keys_file = tmp_path / "keys.toml"
    keys = {}
    for person, groups in (("lena", "legal"), ("sam", "staff")):
        made = subprocess.run(
            [str(RAGCHAINS), "keys", "add", person, "--groups", groups, "--keys-file",
             str(keys_file)], capture_output=True, text=True, check=True, env=env,
        )  # fmt: skip
        keys[person] = made.stdout.strip()
    with ragchains_serve(
        "--store", pg_url, "--domains", str(domains), RAGCHAINS_KEYS_FILE=str(keys_file)
    ) as base:
        store = Team(tmp_path, RAGCHAINS.parent, domains, tmp_path, keys, base)
        assert "team-docs/handbook/employee-handbook.md" in store.retrieved(
            REMOTE_QUESTION, "default"
        )
        assert all(
            s.startswith("team-docs/legal/") for s in store.retrieved(REMOTE_QUESTION, "legal")
        )
        contract = "team-docs/legal/contracts/acme-msa.md"
        assert contract in store.retrieved(MSA_QUESTION, "legal", "lena")
        assert contract not in store.retrieved(MSA_QUESTION, "legal", "sam")
        counts = {d["name"]: d["documents"] for d in store.get("/collection", "sam")["domains"]}
        assert counts == {"default": 14, "legal": 1}
