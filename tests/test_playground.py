"""LangServe's playgrounds in a real browser, against the real app on a free port.

Each served chain's playground must render its configuration (the domain and prompt versions
as lists built from the prompt registry) and its input form without a console error; a
question run through the chat playground must stream an answer with its citations into the
output panel.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import WatchedPage, open_page
from tests.servers import ragchains_serve

pytestmark = [pytest.mark.slow, pytest.mark.browser]

DOMAINS = {"catalog", "default", "hr"}
# The input field each route's form starts with.
FIRST_INPUT = {"chat": "question", "ask": "question", "rewrite": "question", "retrieve": "query"}


@pytest.fixture(scope="module")
def url(sample_index: Path) -> Iterator[str]:
    """The playgrounds as users open them: served by `ragchains serve`, in a subprocess."""
    with ragchains_serve("--index", str(sample_index)) as base:
        yield base


def field(page: Any, name: str) -> Any:
    """A form control of the playground (JSON Forms ids it by its schema path)."""
    return page.locator(f"[id='#/properties/{name}-input']")


def output_panel(page: Any) -> Any:
    return page.locator("h2:text-is('Output') + div")


@pytest.mark.parametrize("route", list(FIRST_INPUT))
def test_playground_renders_and_offers_the_domains(url: str, browser: Any, route: str) -> None:
    watched = open_page(browser, f"{url}/{route}/playground/")
    page = watched.page
    domain = field(page, "domain")
    domain.wait_for(timeout=15_000)
    offered = {
        value
        for value in domain.locator("option").evaluate_all("options => options.map(o => o.value)")
        if value
    }
    assert offered == DOMAINS
    assert domain.input_value() == "default"
    domain.select_option("hr")
    assert domain.input_value() == "hr"
    field(page, FIRST_INPUT[route]).wait_for()
    if route != "retrieve":
        versions = field(page, "rewrite_version" if route == "rewrite" else "answer_version")
        assert versions.locator("option[value='v2']").count() == 1
    assert page.get_by_role("button", name="Start").count() == 1
    watched.assert_clean()


@pytest.mark.parametrize("route", ["chat", "ask"])
def test_playground_shows_the_answer_once_with_its_citations(
    url: str, browser: Any, route: str
) -> None:
    """The streamed chunks add up (AddableDict) into one output: the answer once, as text,
    with its sources and citations; never a run of JSON objects, one per token."""
    watched = open_page(browser, f"{url}/{route}/playground/")
    page = watched.page
    field(page, "domain").select_option("hr")
    field(page, "question").fill("What does the standard plan cost?")
    page.get_by_role("button", name="Start").click()
    panel = output_panel(page)
    # The sources come first, then the answer's tokens, then the citations and timings.
    panel.get_by_text('"sources"').first.wait_for(timeout=120_000)
    panel.get_by_text('"timings"').wait_for(timeout=240_000)
    text = panel.inner_text()
    assert "}{" not in text, text[:2000]
    output = json.loads(text)  # one object: the chunks added up
    said = f'"answer": {json.dumps(output["answer"], ensure_ascii=False)}'
    assert output["answer"].strip() and text.count(said) == 1
    assert text.index('"sources"') < text.index('"answer"') < text.index('"citations"')
    assert '"label": "employee-handbook.md#' in text
    assert '"abstained": false' in text
    assert '"answer": "hr/quote@v1"' in text  # the prompts the hr domain answered with
    watched.assert_clean()


def test_the_rewrite_playground_takes_a_chat_history(url: str, browser: Any) -> None:
    """The history is LangServe's chat widget (a speaker list and the words), not a bare
    JSON field: the widget is offered only when the kinds of turns are titled as messages.
    A follow-up asked with the earlier turn gets its subject filled in."""
    watched = open_page(browser, f"{url}/rewrite/playground/")
    page = watched.page
    field(page, "domain").select_option("hr")
    field(page, "question").fill("And the premium one?")
    history = page.locator(".control", has_text="Chat history")
    history.get_by_role("button").first.click()
    speaker = history.locator("select")
    speaker.wait_for(timeout=15_000)
    assert speaker.input_value() == "human"
    history.locator("textarea").fill("What does the standard health plan cost?")
    page.get_by_role("button", name="Start").click()
    panel = output_panel(page)
    panel.get_by_text('"search_query"').wait_for(timeout=120_000)
    assert "plan" in json.loads(panel.inner_text())["search_query"].lower()
    watched.assert_clean()


def retrieve_in_playground(browser: Any, url: str, query: str) -> tuple[WatchedPage, str]:
    """Runs ``query`` in the /retrieve playground of the server at ``url``; the page and the
    text of its output once documents are shown."""
    watched = open_page(browser, f"{url}/retrieve/playground/")
    page = watched.page
    field(page, "query").fill(query)
    page.get_by_role("button", name="Start").click()
    panel = output_panel(page)
    panel.get_by_text('"page_content"').first.wait_for(timeout=60_000)
    return watched, panel.inner_text()


def test_retrieve_playground_returns_documents(url: str, browser: Any) -> None:
    watched, text = retrieve_in_playground(browser, url, "what does the standard health plan cost")
    assert "employee-handbook.md" in text
    watched.assert_clean()


def test_the_api_docs_render_without_a_cdn(url: str, browser: Any) -> None:
    """/docs loads its scripts from this server (the machine has no network):
    the routes are listed, and a try-out of /healthz answers."""
    watched = open_page(browser, f"{url}/docs")
    page = watched.page
    health = page.locator(".opblock", has_text="/healthz").first
    health.wait_for(timeout=30_000)
    assert page.locator(".opblock", has_text="/chat/invoke").count() >= 1
    health.locator(".opblock-summary").first.click()
    page.get_by_role("button", name="Try it out").first.click()
    page.get_by_role("button", name="Execute").first.click()
    page.locator(".live-responses-table .response-col_status", has_text="200").first.wait_for()
    watched.assert_clean()


def test_a_console_error_or_an_uncaught_error_fails_a_page(url: str, browser: Any) -> None:
    """The guard every browser test ends with: it must not pass a page that logged an error."""
    watched = open_page(browser, f"{url}/chat/playground/")
    watched.assert_clean()  # the playground itself loads clean
    with watched.page.expect_event("console"):
        watched.page.evaluate("() => console.error('a console error')")
    with watched.page.expect_event("pageerror"):
        watched.page.evaluate("() => setTimeout(() => { throw new Error('an uncaught error'); })")
    with pytest.raises(AssertionError) as failed:
        watched.assert_clean()
    assert "console: a console error" in str(failed.value)
    assert "pageerror: an uncaught error" in str(failed.value)
    watched.page.close()
