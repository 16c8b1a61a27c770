// The chat page. The conversation lives in this browser (localStorage); every turn is one
// call to the same LangServe streaming routes any client uses (/chat/stream, /ask/stream),
// so what the page shows is what the chains produce. Nothing is fetched from elsewhere.
// Two views, by the address's hash (so Back goes back): the chat, and #documents (the
// documents the key may read, and its changes to them: documents.js).

import { Documents } from "./documents.js";
import { el } from "./dom.js";
import { render } from "./markdown.js";
import { Viewer } from "./viewer.js";

const CONVERSATION = "ragchains.conversation.v1";
const PREFERENCES = "ragchains.preferences.v1";
const API_KEY = "ragchains.api-key";
// The newest turns sent as chat history, within the server's limits (from /readyz); the
// server then keeps what fits the model's token budget.
const HISTORY_MESSAGES = 20;
// Turns kept in the browser; older ones are dropped first when storage runs out.
const KEPT_TURNS = 100;
const CITATION = /\[([^[\]\n]{1,300})\]/g;
const CITATION_SPLIT = /\s*[;,]\s*/;
const STATUSES = new Set(["streaming", "answered", "abstained", "error", "stopped"]);

const $ = (id) => document.getElementById(id);

const state = {
  turns: restoreTurns(),
  prefs: restorePrefs(),
  running: null, // { turn, controller } while an answer streams
  server: null, // /readyz
};

// ------------------------------------------------------------------------- storage
function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

// Turns as saved by this page; anything else (an older format, a hand edit) is dropped.
function restoreTurns() {
  const saved = read(CONVERSATION, []);
  if (!Array.isArray(saved)) return [];
  const turns = saved.filter(
    (turn) =>
      turn !== null &&
      typeof turn === "object" &&
      typeof turn.id === "string" &&
      typeof turn.question === "string" &&
      STATUSES.has(turn.status) &&
      turn.out !== null &&
      typeof turn.out === "object" &&
      typeof (turn.out.answer ?? "") === "string",
  );
  for (const turn of turns) {
    turn.out.answer ??= "";
    turn.feedback = turn.feedback !== null && typeof turn.feedback === "object" ? turn.feedback : {};
    delete turn.feedback.pending;
    // A reload cut this one off; its request is gone with the old page.
    if (turn.status === "streaming") {
      turn.status = "stopped";
      turn.stopNote = "Interrupted by a page reload.";
    }
  }
  return turns;
}

function restorePrefs() {
  const saved = read(PREFERENCES, {});
  return {
    mode: saved?.mode === "ask" ? "ask" : "chat",
    domain: typeof saved?.domain === "string" ? saved.domain : "default",
  };
}

function saveTurns() {
  let turns = state.turns.slice(-KEPT_TURNS);
  for (;;) {
    try {
      localStorage.setItem(CONVERSATION, JSON.stringify(turns));
      return;
    } catch {
      if (turns.length <= 1) return; // storage is full or off: the page still works
      turns = turns.slice(Math.ceil(turns.length / 4));
    }
  }
}

function savePrefs() {
  localStorage.setItem(PREFERENCES, JSON.stringify(state.prefs));
  showWhere();
}

// ------------------------------------------------------------------------- DOM helpers
function fact(term, ...details) {
  return [el("dt", {}, term), el("dd", {}, ...details)];
}

function seconds(value) {
  if (typeof value !== "number") return "";
  return value < 1 ? `${Math.round(value * 1000)} ms` : `${value.toFixed(2)} s`;
}

function score(value) {
  return typeof value === "number" ? value.toFixed(3) : "n/a";
}

// ------------------------------------------------------------------------- HTTP
class ServerError extends Error {
  // retryAfter: seconds the server asked to wait before trying again (a busy model's 503).
  constructor(status, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

// How often a turn is sent again while the model is busy before the page gives up.
const BUSY_RETRIES = 20;

function retryAfter(value) {
  const seconds = Number.parseInt(value ?? "", 10);
  return Number.isFinite(seconds) && seconds >= 0 ? seconds : null;
}

// Resolves after ``ms``; rejects at once when ``signal`` aborts (the Stop button).
function pause(ms, signal) {
  return new Promise((resolve, reject) => {
    const stopped = () => {
      clearTimeout(timer);
      reject(new DOMException("stopped", "AbortError"));
    };
    const timer = setTimeout(() => {
      signal.removeEventListener("abort", stopped);
      resolve();
    }, ms);
    signal.addEventListener("abort", stopped, { once: true });
  });
}

function headers() {
  const result = { "Content-Type": "application/json" };
  const key = localStorage.getItem(API_KEY);
  if (key) result["X-API-Key"] = key;
  return result;
}

async function failure(response) {
  let message = response.statusText || "request failed";
  try {
    const body = await response.json();
    const detail = body.detail ?? body.error?.message;
    if (typeof detail === "string") message = detail;
    else if (Array.isArray(detail)) message = detail.map((d) => d.msg ?? String(d)).join("; ");
  } catch {
    // not JSON: keep the status text
  }
  return new ServerError(response.status, message, retryAfter(response.headers.get("Retry-After")));
}

// A request to this server with the caller's key: its response, or a ServerError with the
// server's reason. A body that is no JSON text (a FormData) gets its own Content-Type.
async function send(path, { method = "GET", body, signal } = {}) {
  const sent = headers();
  if (typeof body !== "string") delete sent["Content-Type"];
  const response = await fetch(path, { method, headers: sent, body, signal });
  if (!response.ok) {
    const error = await failure(response);
    if (error.status === 401) askForKey("The key was refused; enter it again.");
    throw error;
  }
  return response;
}

// A GET on this server with the caller's key; the body as "json", "text" or "blob".
async function request(path, as = "json") {
  return (await send(path))[as]();
}

// Server-sent events from a fetch body (EventSource cannot POST). Stops at once when
// ``signal`` aborts, even with events left in the buffer.
async function* events(response, signal) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while (!signal.aborted && (end = /\r?\n\r?\n/.exec(buffer))) {
        const block = buffer.slice(0, end.index);
        buffer = buffer.slice(end.index + end[0].length);
        const event = parseEvent(block);
        if (event) yield event;
      }
      if (signal.aborted) return;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

function parseEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  // "end" comes without data; a block of comments only (a keep-alive ping) is skipped.
  return data.length || event !== "message" ? { event, data: data.join("\n") } : null;
}

// ------------------------------------------------------------------------- a turn
function history() {
  const limits = state.server?.limits ?? {};
  const most = Math.min(HISTORY_MESSAGES, limits.history_messages ?? Infinity);
  let room = limits.history_chars ?? Infinity;
  const pairs = [];
  for (const turn of state.turns.slice().reverse()) {
    if (turn.status !== "answered" && turn.status !== "abstained") continue;
    const size = turn.question.length + turn.out.answer.length;
    if (pairs.length * 2 + 2 > most || size > room) break;
    room -= size;
    pairs.unshift(
      { role: "user", content: turn.question },
      { role: "assistant", content: turn.out.answer },
    );
  }
  return pairs;
}

async function ask(question) {
  const { mode, domain } = state.prefs;
  const input = mode === "chat" ? { question, chat_history: history() } : { question };
  const turn = {
    id: `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`,
    mode,
    domain,
    question,
    status: "streaming",
    out: { answer: "" },
    feedback: {},
  };
  state.turns.push(turn);
  const controller = new AbortController();
  state.running = { turn, controller };
  showTurn(turn);
  showRunning();
  saveTurns();
  try {
    // A busy model answers 503 with Retry-After (before the stream, or as its error event):
    // the page says so and sends the turn again after that long.
    for (let attempt = 1; ; attempt++) {
      try {
        await streamTurn(turn, mode, input, domain, controller);
        break;
      } catch (error) {
        const busy = error instanceof ServerError && error.status === 503 && error.retryAfter !== null;
        if (!busy || attempt > BUSY_RETRIES || controller.signal.aborted) throw error;
        turn.out = { answer: "" };
        turn.busy = `The model is busy, retrying in ${error.retryAfter} s…`;
        showTurn(turn);
        $("status").textContent = turn.busy;
        await pause(error.retryAfter * 1000, controller.signal);
        turn.busy = null;
        $("status").textContent = "";
        showTurn(turn);
      }
    }
    turn.status = turn.out.abstained ? "abstained" : "answered";
  } catch (error) {
    turn.busy = null;
    if (controller.signal.aborted || error.name === "AbortError") {
      turn.status = "stopped";
      turn.stopNote = "Stopped.";
    } else {
      turn.status = "error";
      turn.error = error instanceof ServerError ? error.message : `the server cannot be reached (${error.message})`;
      turn.errorStatus = error.status ?? 0;
      if (error.status === 401) askForKey("The key was refused; enter it again.");
    }
  } finally {
    state.running = null;
    showRunning();
    saveTurns();
    showTurn(turn);
    announce(turn);
  }
}

// One attempt at a turn: its stream, read into ``turn.out`` as it comes.
async function streamTurn(turn, mode, input, domain, controller) {
  const response = await fetch(`/${mode}/stream`, {
    method: "POST",
    headers: headers(),
    body: JSON.stringify({ input, config: { configurable: { domain } } }),
    signal: controller.signal,
  });
  if (!response.ok) throw await failure(response);
  let ended = false;
  for await (const { event, data } of events(response, controller.signal)) {
    if (event === "metadata") {
      turn.runId = JSON.parse(data).run_id;
    } else if (event === "data") {
      const chunk = JSON.parse(data);
      const tokenOnly = Object.keys(chunk).length === 1 && "answer" in chunk;
      for (const [name, value] of Object.entries(chunk)) {
        // Added up as LangServe merges a stream: the answer's text, and notes learned while
        // answering after those said first.
        if (name === "answer") turn.out.answer += value;
        else if (name === "notes") turn.out.notes = [...(turn.out.notes ?? []), ...value];
        else turn.out[name] = value;
      }
      if (tokenOnly) showAnswerText(turn);
      else showTurn(turn);
    } else if (event === "error") {
      const error = JSON.parse(data);
      throw new ServerError(error.status_code, error.message, retryAfter(error.retry_after));
    } else if (event === "end") {
      ended = true;
      break;
    }
  }
  if (controller.signal.aborted) throw new DOMException("stopped", "AbortError");
  if (!ended) throw new ServerError(0, "the answer was cut off: the connection closed early");
}

// For screen readers: how the turn ended (the tokens themselves are not announced).
function announce(turn) {
  const said = {
    answered: turn.out.incomplete ? "Answer incomplete: the model's reply was cut short." : "Answer complete.",
    abstained: "Not in the documents.",
    stopped: "Stopped.",
    error: `Error: ${turn.error}`,
  };
  $("status").textContent = said[turn.status] ?? "";
}

function stop() {
  state.running?.controller.abort();
}

// ------------------------------------------------------------------------- rendering
function sources(turn) {
  return Array.isArray(turn.out.sources) ? turn.out.sources : [];
}

function citedIds(turn) {
  return new Set((turn.out.citations ?? []).map((c) => c.id));
}

// Label (or chunk id) -> the chunk it cites: the chunk the server resolved the citation to,
// else the best-ranked chunk of that label (several chunks of one section share a label).
function citable(turn) {
  const byId = new Map(sources(turn).map((source) => [source.id, source]));
  const known = new Map();
  for (const citation of turn.out.citations ?? []) {
    const source = byId.get(citation.id);
    if (source && !known.has(citation.label)) known.set(citation.label, source);
  }
  for (const source of sources(turn)) {
    if (!known.has(source.label)) known.set(source.label, source);
    known.set(source.id, source);
  }
  return known;
}

// The answer as rendered Markdown (sanitised), each [label] of a retrieved source a link to
// it; "[a; b]" gives two. The markers are set aside while the Markdown is rendered, so a
// label's underscores or asterisks cannot turn into emphasis.
const HELD = /\uE000(\d+)\uE001/;

function answerNodes(turn) {
  const text = turn.out.answer ?? "";
  const known = citable(turn);
  const quoted = turn.out.answer_style === "quote";
  const held = [];
  let markdown = "";
  let last = 0;
  for (const match of text.matchAll(CITATION)) {
    const labels = match[1].split(CITATION_SPLIT).map((label) => label.trim());
    if (!labels.some((label) => known.has(label))) continue;
    const before = text.slice(last, match.index);
    markdown += `${before}\uE000${held.length}\uE001`;
    // In a quoted answer, what precedes a marker is the text copied from its source.
    held.push({ labels, quote: quoted ? before.trim() : null });
    last = match.index + match[0].length;
  }
  markdown += text.slice(last);
  const fragment = render(markdown);
  const walker = document.createTreeWalker(fragment, NodeFilter.SHOW_TEXT);
  const holders = [];
  while (walker.nextNode()) if (HELD.test(walker.currentNode.data)) holders.push(walker.currentNode);
  for (const node of holders) {
    const pieces = node.data.split(new RegExp(HELD.source, "g"));
    node.replaceWith(
      ...pieces.flatMap((piece, n) => {
        if (n % 2 === 0) return piece ? [piece] : [];
        const { labels, quote } = held[Number(piece)];
        return [
          "[",
          ...labels.flatMap((label, i) => {
            const source = known.get(label);
            return [i ? "; " : "", source ? citeLink(source, label, quote) : label];
          }),
          "]",
        ];
      }),
    );
  }
  return [fragment];
}

function citeLink(source, text, quote = null) {
  return el(
    "a",
    {
      class: "cite",
      href: `#source-${source.id}`,
      title: `Open ${source.label}`,
      onclick: (event) => {
        event.preventDefault();
        openSource(source, event.currentTarget, quote);
      },
    },
    text,
  );
}

function turnElement(turn) {
  return document.querySelector(`[data-turn="${CSS.escape(turn.id)}"]`);
}

function showAnswerText(turn) {
  if (!state.turns.includes(turn)) return; // "New chat" removed it while it streamed
  const node = turnElement(turn)?.querySelector(".answer-text");
  if (!node) return showTurn(turn);
  node.replaceChildren(...answerNodes(turn));
  keepScrolled();
}

function showTurn(turn) {
  if (!state.turns.includes(turn)) return;
  const existing = turnElement(turn);
  const open = existing?.querySelector("details.thoughts")?.open ?? false;
  const node = turnNode(turn, open);
  if (existing) existing.replaceWith(node);
  else $("turns").append(node);
  $("intro").hidden = state.turns.length > 0;
  keepScrolled();
}

// A badge and what it means, above an answer: an abstention, uncited, incomplete.
function notice(kind, label, text) {
  return el("p", { class: kind }, el("span", { class: `badge ${kind}` }, label), text ? el("small", {}, text) : null);
}

function turnNode(turn, thoughtsOpen) {
  const streaming = turn.status === "streaming";
  const answer = el(
    "article",
    { class: `answer is-${turn.status}`, "aria-label": "Answer", "aria-busy": streaming ? "true" : null },
    turn.out.abstained
      ? notice(
          "abstention",
          "Not in the documents",
          turn.out.best_score != null && turn.out.compressor?.threshold != null
            ? ` best match ${score(turn.out.best_score)}, under the ${turn.out.compressor.threshold} needed`
            : null,
        )
      : turn.out.uncited
        ? notice("uncited", "Uncited", " This answer cites none of the sources: check it against them.")
        : null,
    turn.out.incomplete
      ? notice("incomplete", "Incomplete", " The model's reply was cut short: this is the part that arrived.")
      : null,
    el("div", { class: "answer-text" }, answerNodes(turn)),
    streaming && !turn.out.answer
      ? el(
          "p",
          { class: "waiting" },
          turn.busy ?? (turn.out.sources ? "Writing the answer…" : "Searching…"),
        )
      : null,
    turn.status === "error"
      ? el(
          "p",
          { class: "error", role: "alert" },
          el("strong", {}, "Error: "),
          turn.error,
        )
      : null,
    turn.status === "stopped" ? el("p", { class: "stopped" }, turn.stopNote ?? "Stopped.") : null,
    sourcesNode(turn),
    thoughtsNode(turn, thoughtsOpen),
    feedbackNode(turn),
  );
  return el(
    "li",
    { class: "turn", "data-turn": turn.id },
    el(
      "div",
      { class: "question" },
      el("span", { class: "meta" }, `${turn.mode === "chat" ? "Chat" : "Ask"} · ${turn.domain}`),
      el("p", {}, turn.question),
    ),
    answer,
  );
}

function sourcesNode(turn) {
  const all = sources(turn);
  if (!all.length || turn.status === "streaming") return null;
  const cited = citedIds(turn);
  const list = (items) =>
    el(
      "ul",
      {},
      items.map((source) =>
        el(
          "li",
          {},
          citeLink(source, source.label),
          el("span", { class: "score" }, ` score ${score(source.score)}`),
        ),
      ),
    );
  const citedSources = all.filter((s) => cited.has(s.id));
  const others = all.filter((s) => !cited.has(s.id));
  return el(
    "section",
    { class: "sources", "aria-label": "Sources" },
    citedSources.length ? [el("h3", {}, "Cited"), list(citedSources)] : null,
    others.length ? [el("h3", {}, "Retrieved, not cited"), list(others)] : null,
  );
}

function thoughtsNode(turn, open) {
  const out = turn.out;
  if (out.search_query === undefined) return null;
  const facts = [];
  facts.push(
    fact(
      "Search query",
      el("q", { class: "search-query" }, out.search_query),
      turn.mode === "chat" && out.search_query !== turn.question
        ? el("small", {}, " (rewritten from your question and the conversation)")
        : null,
    ),
  );
  const filters = out.filters ?? [];
  facts.push(
    fact(
      "Filters",
      filters.length
        ? filters.map((f) => el("code", {}, `${f.field} ${f.op} ${JSON.stringify(f.value)}`))
        : "none",
    ),
  );
  const alternatives = out.alternatives ?? [];
  facts.push(
    fact(
      "Alternative queries",
      alternatives.length ? el("ul", {}, alternatives.map((a) => el("li", {}, a))) : "none",
    ),
  );
  const requery = out.requery;
  facts.push(
    fact(
      "Re-query",
      requery
        ? el(
            "span",
            { class: "requery" },
            `first “${requery.first_query}” (best score ${score(requery.first_best_score)}), then `,
            !requery.query
              ? "no usable new query"
              : requery.refused
                ? `“${requery.query}”: not searched, ${requery.refused}`
                : `“${requery.query}” (best score ${score(requery.best_score)}): ${
                    requery.kept ? "kept" : "not kept, the first results were better"
                  }`,
          )
        : "not needed",
    ),
  );
  const compressor = out.compressor ?? {};
  facts.push(
    fact(
      "Compressor",
      el(
        "span",
        { class: "compressor" },
        [
          compressor.kind ?? "none",
          compressor.model ? ` (${compressor.model})` : "",
          compressor.threshold != null ? `, threshold ${compressor.threshold}` : "",
          compressor.top_n != null ? `, keeps up to ${compressor.top_n}` : "",
          compressor.reorders === false ? " in the order retrieved" : "",
          compressor.reorders === true ? ", best score first" : "",
        ].join(""),
      ),
      compressor.scoring ? el("p", { class: "scoring" }, `Score: ${compressor.scoring}.`) : null,
      compressor.fallback
        ? el(
            "p",
            { class: "fallback" },
            `Fallback in use: ${compressor.requested_model ?? "the configured model"} did not load (${
              compressor.fallback_reason ?? "no reason given"
            }).`,
          )
        : null,
    ),
  );
  if ("best_score" in out) facts.push(fact("Best score", el("span", { class: "best-score" }, bestScore(out))));
  const prompts = Object.entries(out.prompts ?? {});
  facts.push(
    fact(
      "Prompts",
      prompts.length
        ? el("ul", { class: "prompts" }, prompts.map(([name, ref]) => el("li", {}, `${name}: ${ref}`)))
        : "none (no model call)",
    ),
  );
  const timings = Object.entries(out.timings ?? {});
  if (timings.length) {
    facts.push(
      fact(
        "Timings",
        el("ul", { class: "timings" }, timings.map(([stage, s]) => el("li", {}, `${stage} ${seconds(s)}`))),
      ),
    );
  }
  if ((out.notes ?? []).length) facts.push(fact("Notes", el("ul", {}, out.notes.map((n) => el("li", {}, n)))));
  if (turn.runId) facts.push(fact("Run id", el("code", {}, turn.runId)));
  return el(
    "details",
    { class: "thoughts", open },
    el("summary", {}, "Thought process"),
    el("dl", {}, facts),
  );
}

// The best passage's score against the threshold it had to reach: why an answer abstained.
function bestScore(out) {
  const best = out.best_score;
  const threshold = out.compressor?.threshold;
  if (best == null) return "nothing was retrieved";
  if (threshold == null) return score(best);
  const passed = best >= threshold;
  return `${score(best)} ${passed ? "≥" : "<"} threshold ${threshold}${
    passed ? "" : ": no passage was close enough to answer from"
  }`;
}

// ------------------------------------------------------------------------- feedback
const THUMB =
  "M2 21h4V9H2v12zm20-11a2 2 0 0 0-2-2h-6.3l1-4.6v-.3c0-.4-.2-.8-.4-1.1L13.2 1 6.6 7.6" +
  "C6.2 8 6 8.5 6 9v10a2 2 0 0 0 2 2h9c.8 0 1.5-.5 1.8-1.2l3-7.1c.1-.2.2-.5.2-.7v-2z";

function thumb(down) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("aria-hidden", "true");
  if (down) svg.setAttribute("transform", "rotate(180)");
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  path.setAttribute("d", THUMB);
  svg.append(path);
  return svg;
}

function feedbackNode(turn) {
  if (!turn.runId || (turn.status !== "answered" && turn.status !== "abstained")) return null;
  const feedback = turn.feedback ?? (turn.feedback = {});
  if (feedback.sent) {
    return el("p", { class: "feedback sent", role: "status" }, "Thanks, your feedback was sent.");
  }
  const pick = (value) => () => {
    const typed = turnElement(turn)?.querySelector(".feedback textarea");
    if (typed) feedback.comment = typed.value;
    feedback.score = value;
    saveTurns();
    showTurn(turn);
    turnElement(turn)?.querySelector(".feedback textarea")?.focus();
  };
  const buttons = [
    el(
      "button",
      { type: "button", class: "thumb", "aria-label": "Good answer", "aria-pressed": String(feedback.score === 1), onclick: pick(1) },
      thumb(false),
    ),
    el(
      "button",
      { type: "button", class: "thumb", "aria-label": "Bad answer", "aria-pressed": String(feedback.score === 0), onclick: pick(0) },
      thumb(true),
    ),
  ];
  const form =
    feedback.score === undefined
      ? null
      : el(
          "form",
          {
            class: "feedback-form",
            onsubmit: (event) => {
              event.preventDefault();
              sendFeedback(turn, event.target.elements.comment.value);
            },
          },
          el("textarea", {
            name: "comment",
            rows: "2",
            maxlength: "2000",
            "aria-label": "Feedback comment",
            placeholder: feedback.score === 1 ? "What was good? (optional)" : "What was wrong? (optional)",
          }, feedback.comment ?? ""),
          el("button", { type: "submit", disabled: feedback.pending }, "Send feedback"),
        );
  return el(
    "div",
    { class: "feedback", role: "group", "aria-label": "Feedback" },
    el("div", { class: "thumbs" }, buttons),
    form,
    feedback.error ? el("p", { class: "error", role: "alert" }, feedback.error) : null,
  );
}

async function sendFeedback(turn, comment) {
  if (turn.feedback.pending) return;
  turn.feedback.pending = true;
  turn.feedback.comment = comment;
  showTurn(turn);
  const out = turn.out;
  const body = {
    run_id: turn.runId,
    score: turn.feedback.score,
    comment,
    mode: turn.mode,
    domain: turn.domain,
    prompts: out.prompts ?? {},
    question: turn.question,
    answer: out.answer ?? "",
    cited_ids: (out.citations ?? []).map((c) => c.id),
  };
  try {
    const response = await fetch("/feedback", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
    });
    if (!response.ok) throw await failure(response);
    turn.feedback = { score: turn.feedback.score, sent: true };
  } catch (error) {
    turn.feedback.error = `Feedback not sent: ${error.message}`;
    if (error.status === 401) askForKey("The key was refused; enter it again.");
  } finally {
    delete turn.feedback.pending;
  }
  saveTurns();
  showTurn(turn);
}

// ------------------------------------------------------------------------- source panel
let sourceOpener = null; // the link that opened the panel gets the focus back
let viewer = null;

function basename(path) {
  return String(path ?? "").split("/").at(-1) || "unknown";
}

function openSource(source, opener, quote = null) {
  const location = source.location ?? {};
  const facts = [...fact("File", basename(source.source))];
  if (location.page != null || source.page != null) facts.push(...fact("Page", String(location.page ?? source.page)));
  if (location.slide != null) facts.push(...fact("Slide", String(location.slide)));
  if (location.sheet) facts.push(...fact("Sheet", location.sheet));
  if (location.row != null) facts.push(...fact("Row", String(location.row)));
  if (source.section) facts.push(...fact("Section", source.section));
  facts.push(...fact("Score", score(source.score)));
  facts.push(...fact("Chunk id", el("code", {}, source.id)));
  if (location.ocr_confidence != null) {
    facts.push(...fact("OCR confidence", `${Math.round(location.ocr_confidence * 100)}%`));
  }
  showSource(source.label, facts, source, opener, quote);
}

// A document of the Documents list, whole, in the same viewer: a source without a chunk
// (nothing highlighted; a PDF or a scan opens at its first page, a table at its first rows).
function openDocument(doc, opener) {
  const facts = [...fact("File", doc.path), ...fact("Format", doc.label ?? doc.format ?? "unknown")];
  if (doc.pages != null) facts.push(...fact("Pages", String(doc.pages)));
  if (doc.slides != null) facts.push(...fact("Slides", String(doc.slides)));
  if (doc.rows != null) facts.push(...fact("Rows", String(doc.rows)));
  facts.push(...fact("Chunks", String(doc.chunks)));
  if (doc.ocr_confidence != null) {
    facts.push(...fact("OCR confidence", `${Math.round(doc.ocr_confidence * 100)}%`));
  }
  const source = { label: basename(doc.path), source: doc.path, file_id: doc.file_id, format: doc.format, location: {} };
  showSource(basename(doc.path), facts, source, opener, null);
}

function showSource(title, facts, source, opener, quote) {
  sourceOpener = opener ?? null;
  $("source-title").textContent = title;
  $("source-facts").replaceChildren(...facts);
  $("source-panel").hidden = false;
  document.body.classList.add("source-open");
  viewer ??= new Viewer($("source-view"), { request, headers });
  viewer.show(source, quote);
  $("close-source").focus();
}

function closeSource() {
  if ($("source-panel").hidden) return;
  $("source-panel").hidden = true;
  document.body.classList.remove("source-open");
  viewer?.clear();
  if (sourceOpener?.isConnected) sourceOpener.focus();
  sourceOpener = null;
}

// ------------------------------------------------------------------------- page state
function showRunning() {
  const running = state.running !== null;
  $("send").hidden = running;
  $("stop").hidden = !running;
  $("question").disabled = running;
  if (!running) $("question").focus();
}

function keepScrolled() {
  const list = $("turns");
  list.scrollTop = list.scrollHeight;
}

function showWhere() {
  const mode = state.prefs.mode === "chat" ? "Chat" : "Ask";
  $("where").textContent = `${mode} · ${state.prefs.domain}`;
}

function showServer(server) {
  const compressor = server.compressor ?? {};
  $("server").replaceChildren(
    ...fact("Model", server.llm?.model ?? "unknown"),
    // A server with per-user access does not tell its chunk count (it would count files a
    // reader may not see): the fact is left out, not shown as unknown.
    ...(server.index?.chunks == null ? [] : fact("Chunks", String(server.index.chunks))),
    ...fact("Compressor", `${compressor.kind ?? "none"}${compressor.fallback ? " (fallback)" : ""}`),
  );
}

function fillDomains(domains) {
  if (!domains.length) domains = ["default"];
  const select = $("domain");
  const shown = [...select.options].map((o) => o.value);
  // The same list is left alone: replacing it would close it under a person choosing.
  if (shown.length === domains.length && shown.every((d, i) => d === domains[i])) return;
  select.replaceChildren(...domains.map((d) => el("option", { value: d }, d)));
  if (!domains.includes(state.prefs.domain)) {
    state.prefs.domain = domains.includes("default") ? "default" : domains[0];
    savePrefs();
  }
  select.value = state.prefs.domain;
}

// A team's domains folder is served live: the list is read again when a person goes to
// choose a domain, and when the page comes back into view.
async function refreshDomains() {
  try {
    const response = await fetch("/readyz");
    if (!response.ok) return;
    const server = await response.json();
    if (Array.isArray(server.domains)) fillDomains(server.domains);
  } catch {
    // Offline for a moment: the list stays as it is, the next look tries again.
  }
}

function askForKey(message) {
  localStorage.removeItem(API_KEY);
  const dialog = $("key-dialog");
  $("key-error").hidden = !message;
  $("key-error").textContent = message ?? "";
  if (!dialog.open) dialog.showModal();
  $("api-key").focus();
}

async function saveKey(event) {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) return;
  // Header values are Latin-1: anything else could never be sent.
  if (!/^[\x21-\x7e]+$/.test(key)) {
    $("key-error").textContent = "An API key is printable ASCII without spaces.";
    $("key-error").hidden = false;
    return;
  }
  localStorage.setItem(API_KEY, key);
  $("api-key").value = "";
  $("key-dialog").close();
  showCollection();
  if (view() === "documents") documents.refresh();
}

async function connect() {
  try {
    const response = await fetch("/readyz");
    if (!response.ok) throw await failure(response);
    state.server = await response.json();
  } catch (error) {
    $("server").replaceChildren(...fact("Server", `not ready: ${error.message}`));
    return;
  }
  fillDomains(Array.isArray(state.server.domains) ? state.server.domains : []);
  showServer(state.server);
  const limit = state.server.limits?.question_chars;
  if (limit) $("question").maxLength = limit;
  // The playground and API docs need the key too, which a browser link cannot send.
  $("developer-links").hidden = Boolean(state.server.api_key_required);
  if (keyMissing()) {
    askForKey();
  } else {
    showCollection();
    if (view() === "documents") documents.refresh();
  }
}

function keyMissing() {
  return Boolean(state.server?.api_key_required) && !localStorage.getItem(API_KEY);
}

// ------------------------------------------------------------------------- views
const documents = new Documents({ send, request, events, openDocument });

function view() {
  return location.hash === "#documents" ? "documents" : "chat";
}

// Shows the view the address names. ``moved``: a person went there (a link, Back), so the
// focus goes to the view (its heading; the question box in the chat).
function route(moved) {
  const shown = view();
  closeSource();
  document.body.dataset.view = shown;
  $("chat-view").hidden = shown !== "chat";
  $("documents-view").hidden = shown !== "documents";
  $("to-chat").toggleAttribute("aria-current", false);
  $("to-documents").toggleAttribute("aria-current", false);
  $(`to-${shown}`).setAttribute("aria-current", "page");
  document.title = shown === "documents" ? "Documents · ragchains" : "ragchains";
  if (document.body.classList.contains("settings-open")) $("menu").click();
  if (shown === "documents") {
    // Read again each time: the role, the documents and their states may have changed.
    if (state.server && !keyMissing()) documents.refresh();
    if (moved) $("documents-title").focus();
  } else if (moved) {
    $("question").focus();
  }
}

// ------------------------------------------------------------------------- what is there
// What people call each format comes with the counts (the server's format table); a format
// without a label (an index another release wrote, or an older server) is shown by its name.
function kindText(kind, count, labels) {
  const named = labels && Object.hasOwn(labels, kind) ? labels[kind] : null;
  const label = count === 1 ? named?.label : named?.label_plural;
  return `${count} ${label || kind}`;
}

async function showCollection() {
  let collection;
  try {
    collection = await request("/collection");
  } catch {
    $("collection").replaceChildren(); // no key yet, or an older server: the intro stays
    return;
  }
  const kinds = Object.entries(collection.kinds ?? {}).sort((a, b) => b[1] - a[1]);
  const documents = collection.documents ?? 0;
  const domains = (collection.domains ?? []).filter((d) => (d.suggestions ?? []).length);
  $("collection").replaceChildren(
    el(
      "p",
      { class: "holdings" },
      documents
        ? `${documents} ${documents === 1 ? "document" : "documents"} you can ask about: ${kinds
            .map(([kind, n]) => kindText(kind, n, collection.labels))
            .join(", ")}.`
        : "There are no documents you can ask about yet.",
    ),
    documents && domains.length
      ? el(
          "div",
          { class: "suggestions" },
          el("h3", {}, "Try asking"),
          domains.map((domain) =>
            el(
              "section",
              { class: "domain-suggestions", "aria-label": `Suggestions for ${domain.name}` },
              el("h4", {}, domain.name, domain.description ? el("small", {}, ` · ${domain.description}`) : null),
              el(
                "ul",
                {},
                domain.suggestions.map((question) =>
                  el(
                    "li",
                    {},
                    el(
                      "button",
                      { type: "button", class: "suggestion", onclick: () => askSuggested(domain.name, question) },
                      question,
                    ),
                  ),
                ),
              ),
            ),
          ),
        )
      : "", // (replaceChildren would show a null as the text "null")
  );
}

function askSuggested(domain, question) {
  if (state.running) return;
  if ([...$("domain").options].some((o) => o.value === domain)) {
    state.prefs.domain = domain;
    $("domain").value = domain;
    savePrefs();
  }
  ask(question);
}

function newChat() {
  stop();
  state.turns = [];
  saveTurns();
  $("turns").replaceChildren();
  $("intro").hidden = false;
  closeSource();
  $("question").value = "";
  $("question").focus();
}

function init() {
  for (const radio of document.querySelectorAll('input[name="mode"]')) {
    radio.checked = radio.value === state.prefs.mode;
    radio.addEventListener("change", () => {
      state.prefs.mode = radio.value;
      savePrefs();
    });
  }
  $("domain").addEventListener("change", (event) => {
    state.prefs.domain = event.target.value;
    savePrefs();
  });
  $("domain").addEventListener("focus", refreshDomains);
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refreshDomains();
  });
  $("menu").addEventListener("click", () => {
    const open = !document.body.classList.contains("settings-open");
    document.body.classList.toggle("settings-open", open);
    $("menu").setAttribute("aria-expanded", String(open));
  });
  $("new-chat").addEventListener("click", newChat);
  $("stop").addEventListener("click", stop);
  $("close-source").addEventListener("click", closeSource);
  $("key-form").addEventListener("submit", saveKey);
  $("ask-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const question = $("question").value.trim();
    if (!question || state.running) return;
    $("question").value = "";
    ask(question);
  });
  $("question").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("ask-form").requestSubmit();
    }
  });
  window.addEventListener("hashchange", () => route(true));
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    closeSource();
    if (document.body.classList.contains("settings-open")) $("menu").click();
  });
  showWhere();
  try {
    for (const turn of state.turns) showTurn(turn);
  } catch (error) {
    // A saved conversation this page cannot show must not take the page down with it.
    console.warn("the saved conversation could not be shown; starting a new one", error);
    state.turns = [];
    saveTurns();
    $("turns").replaceChildren();
  }
  $("intro").hidden = state.turns.length > 0;
  showRunning();
  route(false);
  connect();
}

init();
