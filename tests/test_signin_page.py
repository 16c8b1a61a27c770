"""Signing in and out of the chat page in a real browser (Debian's Chromium), against
`ragchains serve` with a real OpenID Connect provider on loopback (tests/oidc.py) and a keys
file, over an index whose documents are labelled for two groups (hr, eng) and everyone.

Each person sees only their groups' documents (the Documents view, an answer's sources) and
their own conversations; a conversation continues in another browser once its person signs in
there; sign-out and a key switch leave nothing of the person in the page or in the browser's
storage, from the moment the control is used (the DOM is read in the same task as the click,
before any request could answer); an expired sign-in and a removed key do the same before the
page asks again.

The one console error allowed from the page is the browser's own log of a 401 answer to the
call that meets an expired session or a removed key. (The page's first look, /me, answers who
is asking, nobody included, without one.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from ragchains.serving.keys import add_key, remove_key
from tests.browser import open_page
from tests.oidc import OidcProvider, oidc_provider
from tests.servers import ragchains_serve, wait_until
from tests.test_chat_page import ChatPage
from tests.test_cli import run
from tests.test_playground import field

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.e2e]

SALARY = "What is the salary band for a senior engineer?"
OFFICE = "When does the office open in the morning?"
DOCUMENTS = {
    "hr/pay.md": "# Salary bands\n\nThe salary band for a senior engineer is 90,000 to 120,000 "
    "euros a year, reviewed each April.\n",
    "eng/roadmap.md": "# Search roadmap\n\nThe search roadmap ships the new ranking model in "
    "March, after the relevance review.\n",
    "public/welcome.md": "# Welcome\n\nThe office opens at eight in the morning and closes at "
    "six in the evening.\n",
}
HR_SEES = {"docs/hr/pay.md", "docs/public/welcome.md"}
ENG_SEES = {"docs/eng/roadmap.md", "docs/public/welcome.md"}
PREFERENCES = "ragchains.preferences.v1"
REFUSED_LOG = (
    "console: Failed to load resource: the server responded with a status of 401 (Unauthorized)"
)
# Uses the page's own sign-out control and reads the page in the same task: what a person
# would see before any request made for the next person (or the sign-out) could answer.
SIGN_OUT_AND_LOOK = """() => {
  document.getElementById("sign-out").click();
  return {
    turns: document.querySelectorAll(".turn").length,
    listed: document.querySelectorAll("#conversation-list li").length,
    text: document.body.innerText,
    local: Object.keys(localStorage),
    session: Object.keys(sessionStorage),
    address: location.hash,
  };
}"""


@dataclass(frozen=True)
class Site:
    base: str
    issuer: str
    keys_file: Path
    keys: dict[str, str]


@pytest.fixture(scope="module")
def idp() -> Iterator[OidcProvider]:
    with oidc_provider() as provider:
        yield provider


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, idp: OidcProvider) -> Iterator[Site]:
    """`ragchains serve` with sign-in and a keys file, over documents only hr, only eng and
    everyone may read."""
    home = tmp_path_factory.mktemp("signin")
    for path, text in DOCUMENTS.items():
        (home / "docs" / path).parent.mkdir(parents=True, exist_ok=True)
        (home / "docs" / path).write_text(text, encoding="utf-8")
    index = home / "index"
    done = run(
        "ingest", home / "docs", "--index", index,
        "--access", "docs/hr/*=hr", "--access", "docs/eng/*=eng",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    keys_file = home / "keys.toml"
    keys = {"kim": add_key(keys_file, "kim", ["eng"]), "lee": add_key(keys_file, "lee", ["hr"])}
    with ragchains_serve(
        "--index",
        str(index),
        RAGCHAINS_OIDC_ISSUER=idp.issuer,
        RAGCHAINS_OIDC_CLIENT_ID="ragchains",
        RAGCHAINS_KEYS_FILE=str(keys_file),
    ) as base:
        yield Site(base, idp.issuer, keys_file, keys)


class Visitor(ChatPage):
    """A browser context's page at the site, with the 401 answers it got."""

    def __init__(self, context: Any, site: Site, width: int = 1280, height: int = 900) -> None:
        self.site = site
        self.refused: list[str] = []
        self.failed: list[tuple[int, str]] = []
        context.on("response", self._answered)
        super().__init__(open_page(context, site.base, width=width, height=height))

    def _answered(self, response: Any) -> None:
        if response.status == 401:
            self.refused.append(response.url)
        elif response.status >= 400:
            self.failed.append((response.status, response.url))

    @property
    def header(self) -> Any:
        return self.page.get_by_role("banner")

    def prompt(self) -> Any:
        dialog = self.page.get_by_role("dialog", name="Sign in")
        dialog.wait_for()
        return dialog

    def sign_in(self, name: str, *, typed: str | None = None) -> None:
        """Through the page's Sign in; ``typed``: the user name the provider's form asks for
        (no session at the provider)."""
        self.prompt().get_by_role("button", name="Sign in").click()
        if typed is not None:
            self.page.get_by_label("User name").fill(typed)
            self.page.get_by_role("button", name="Sign in").click()
        expect(self.header.get_by_text(name, exact=True)).to_be_visible()
        self.page.locator("#domain option").first.wait_for(state="attached")

    def use_key(self, key: str, name: str) -> None:
        dialog = self.prompt()
        dialog.get_by_label("API key").fill(key)
        dialog.get_by_role("button", name="Save key").click()
        expect(self.header.get_by_text(name, exact=True)).to_be_visible()

    def documents(self) -> set[str]:
        """The paths the Documents view lists."""
        self.page.get_by_role("navigation", name="Views").get_by_role(
            "link", name="Documents"
        ).click()
        view = self.page.get_by_role("main", name="Documents")
        rows = view.get_by_role("rowheader")
        rows.first.wait_for()
        paths = {str(row.inner_text()).replace("\n", "") for row in rows.all()}
        self.page.go_back()
        self.page.get_by_placeholder("Ask a question about your documents").wait_for()
        return paths

    def asked(self, question: str) -> Any:
        """``question`` asked on its own (Ask mode), once answered and stored."""
        self.use(mode="Ask")
        turn = self.ask(question)
        self.wait_done(turn)
        self.stored_turns()
        return turn

    def expect_listed(self, *titles: str) -> None:
        """The conversations' list holds exactly ``titles`` (once it is read again)."""
        names = self.side().locator(".conversation-name")
        if titles:
            expect(names).to_have_text(list(titles))
        else:
            expect(self.side().locator("#conversations-note")).to_have_text(re.compile("None yet"))
            expect(names).to_have_count(0)
        self.close_settings()

    def api(self, path: str) -> int:
        """The status of a GET with this browser's cookies (the page's session)."""
        return int(self.page.request.get(f"{self.site.base}{path}").status)

    def assert_clean(self, *refusable: str) -> None:
        """No console error but the browser's log of each 401 the page was answered, and
        those only from the paths named."""
        assert all(
            url.removeprefix(self.site.base).split("?")[0].startswith(refusable)
            for url in self.refused
        ), self.refused
        others = [e for e in self.watched.errors if e != REFUSED_LOG]
        assert not others and not self.failed, (others, self.failed)
        assert self.watched.errors.count(REFUSED_LOG) == len(self.refused), (
            self.watched.errors,
            self.refused,
        )


def left_nothing(seen: dict[str, Any], *words: str) -> None:
    """What the page held of the last person, read as the sign-out began: nothing."""
    assert seen["turns"] == 0 and seen["listed"] == 0, seen
    assert not any(word in seen["text"] for word in words), seen["text"]
    assert set(seen["local"]) <= {PREFERENCES} and seen["session"] == [], seen
    assert seen["address"] == "", seen


def sources(turn: Any) -> str:
    """The labels an answer lists as its sources (none when it abstained)."""
    listed = turn.get_by_role("region", name="Sources")
    return str(listed.inner_text()) if listed.count() else ""


# ----------------------------------------------------------------------------- tests
def test_two_people_each_see_their_own_and_sign_out_leaves_nothing_behind(
    site: Site, idp: OidcProvider, browser: Any
) -> None:
    idp.sign_in_as("ada", name="Ada Lovelace", groups=["hr"])
    idp.add_user("bob", name="Bob Byte", groups=["eng"])
    first = browser.new_context()
    second = browser.new_context()
    try:
        ada = Visitor(first, site)
        # Nobody yet: the provider's sign-in, and a key as the other way in.
        prompt = ada.prompt()
        expect(prompt.get_by_label("API key")).to_be_visible()
        ada.sign_in("Ada Lovelace")
        expect(ada.header.get_by_role("button", name="Sign out")).to_be_visible()
        assert ada.documents() == HR_SEES
        turn = ada.asked(SALARY)
        assert "pay.md" in sources(turn)
        conversation = re.search(r"#c/([A-Za-z0-9-]+)$", ada.page.url)
        assert conversation, ada.page.url
        ada.expect_listed(SALARY)

        # Her conversation continues in another browser once she signs in there.
        again = Visitor(second, site)
        again.sign_in("Ada Lovelace")
        again.side().get_by_role("link", name=re.compile(re.escape(SALARY))).click()
        expect(again.page.locator(".turn")).to_have_count(1)
        expect(again.page.locator(".turn").first).to_contain_text("90,000")
        follow_up = again.asked(OFFICE)
        assert "welcome.md" in sources(follow_up)
        expect(again.page.locator(".turn")).to_have_count(2)
        ada.page.reload()  # and the first browser has it too
        expect(ada.page.locator(".turn")).to_have_count(2)
        expect(ada.page.locator(".turn").nth(1)).to_contain_text(OFFICE)

        # Signed out: nothing of hers in the page or the browser, from the click on; the
        # session is over (the provider's too: the next sign-in asks who).
        left_nothing(ada.page.evaluate(SIGN_OUT_AND_LOOK), SALARY, OFFICE, "Ada")
        ada.prompt()
        assert ada.api("/conversations") == 401
        assert ada.page.locator(".turn").count() == 0
        assert ada.page.locator("#conversation-list li").count() == 0
        kept = ada.storage()
        assert set(kept["local"]) <= {PREFERENCES} and kept["session"] == [], kept

        # Bob on the same browser: none of her turns or conversations, his documents only.
        ada.sign_in("Bob Byte", typed="bob")
        bob = ada
        assert bob.page.locator(".turn").count() == 0
        assert SALARY not in bob.page.content() and "Ada" not in bob.page.content()
        bob.expect_listed()
        assert bob.documents() == ENG_SEES
        refused = bob.asked(SALARY)
        assert "pay.md" not in sources(refused) and "90,000" not in refused.inner_text()
        bob.expect_listed(SALARY)  # his own, asked just now
        assert bob.api(f"/conversations/{conversation.group(1)}") == 404
        # Ada, still signed in on the other browser, has hers and not his.
        again.page.reload()
        expect(again.page.locator(".turn")).to_have_count(2)
        again.expect_listed(SALARY)
        assert again.api(f"/conversations/{conversation.group(1)}") == 200
        ada.assert_clean()
        again.assert_clean()
    finally:
        first.close()
        second.close()


def test_a_key_user_switching_key_leaves_nothing_behind(site: Site, browser: Any) -> None:
    context = browser.new_context()
    try:
        kim = Visitor(context, site, width=480, height=800)
        kim.use_key(site.keys["kim"], "kim")
        switch = kim.header.get_by_role("button", name="Sign out / switch key")
        expect(switch).to_be_visible()
        turn = kim.asked(OFFICE)
        assert "welcome.md" in sources(turn)
        kim.expect_listed(OFFICE)
        assert "ragchains.api-key" in kim.storage()["local"]

        left_nothing(kim.page.evaluate(SIGN_OUT_AND_LOOK), OFFICE, "kim")
        prompt = kim.prompt()  # a fresh page, asking again
        expect(prompt.get_by_label("API key")).to_have_value("")
        assert kim.page.locator(".turn").count() == 0
        kept = kim.storage()
        assert set(kept["local"]) <= {PREFERENCES} and kept["session"] == [], kept

        lee = kim
        lee.use_key(site.keys["lee"], "lee")
        lee.expect_listed()
        assert lee.page.locator(".turn").count() == 0

        # Lee's key is removed while the page is open: the next call is refused, and the
        # page forgets Lee before it asks for a key again.
        remove_key(site.keys_file, "lee")
        wait_until(
            lambda: (
                httpx.get(
                    f"{site.base}/conversations", headers={"X-API-Key": site.keys["lee"]}
                ).status_code
                == 401
            ),
            "the keys file re-read",
        )
        lee.page.get_by_role("navigation", name="Views").get_by_role(
            "link", name="Documents"
        ).click()
        prompt = lee.prompt()
        expect(prompt.get_by_role("alert")).to_have_text("The key was refused; enter it again.")
        assert "ragchains.api-key" not in lee.storage()["local"]
        assert lee.page.url == f"{site.base}/"
        lee.assert_clean("/documents", "/collection", "/jobs", "/conversations")
    finally:
        context.close()
        site.keys["lee"] = add_key(site.keys_file, "lee", ["hr"])


def test_an_expired_sign_in_forgets_the_conversation_before_asking_again(
    site: Site, idp: OidcProvider, browser: Any
) -> None:
    lasts = 8  # seconds the ID token (and so the session) lasts
    idp.set_token_ttl(lasts)
    context = browser.new_context()
    try:
        idp.sign_in_as("cy", name="Cy Short", groups=["hr"])
        cy = Visitor(context, site)
        cy.sign_in("Cy Short")
        # A conversation of Cy's (the page's session makes it, as the page would).
        made = cy.page.request.post(f"{site.base}/conversations", data={"title": "Cy's notes"})
        assert made.status == 201, made.text()
        conversation = made.json()["id"]
        put = cy.page.request.put(
            f"{site.base}/conversations/{conversation}/turns/t1",
            data={"question": "Where are my notes?", "output": {"answer": "In the drawer."}},
        )
        assert put.status == 201, put.text()
        cy.page.goto(f"{site.base}/#c/{conversation}")
        expect(cy.page.locator(".turn")).to_contain_text("In the drawer.")
        wait_until(
            lambda: cy.api("/conversations") == 401, "the session expired", timeout=lasts + 30
        )

        # The next call meets the expired session: the page forgets Cy, then asks again.
        actions = cy.page.get_by_role("group", name="This conversation")
        actions.get_by_role("button", name="Rename").click()
        rename = cy.page.get_by_role("dialog", name="Rename this conversation")
        rename.get_by_label("Title").fill("Cy's old notes")
        rename.get_by_role("button", name="Save").click()
        prompt = cy.prompt()
        expect(prompt.get_by_role("alert")).to_have_text("your sign-in has expired: sign in again")
        assert cy.page.locator(".turn").count() == 0
        assert cy.page.locator("#conversation-list li").count() == 0
        assert "In the drawer." not in cy.page.content()
        kept = cy.storage()
        assert set(kept["local"]) <= {PREFERENCES} and kept["session"] == [], kept
        cy.assert_clean(f"/conversations/{conversation}")
    finally:
        idp.set_token_ttl(3600)
        context.close()


def test_a_signed_in_person_opens_the_playground_with_their_session(
    site: Site, idp: OidcProvider, browser: Any
) -> None:
    """The LangServe playground in the browser that signed in: its calls carry the session
    cookie, so it renders the chat chain's choices with no console error (a key user's
    playground cannot send a key: not this)."""
    idp.sign_in_as("pat", name="Pat Doe", groups=["hr"])
    context = browser.new_context()
    try:
        pat = Visitor(context, site)
        pat.sign_in("Pat Doe")
        played = open_page(context, f"{site.base}/chat/playground/")
        domain = field(played.page, "domain")
        domain.wait_for(timeout=30_000)
        assert domain.input_value() == "default"
        assert played.page.get_by_role("button", name="Start").count() == 1
        played.assert_clean()
        pat.assert_clean()
    finally:
        context.close()
