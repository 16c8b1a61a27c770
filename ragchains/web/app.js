// The chat page. Each person's conversations live on the server (/conversations: listed,
// opened, renamed, deleted, exported); the browser keeps only the preferences and a pasted
// key. Every turn is one call to the same LangServe streaming routes any client uses
// (/chat/stream, /ask/stream), so what the page shows is what the chains produce; when a turn
// ends the page stores it as it showed it (PUT /conversations/{id}/turns/{turn}), and again
// when its feedback is sent.
// Views by the address's hash (so Back goes back): a new chat (#chat), one conversation
// (#c/<id>), and #documents (the documents the caller may read, and their changes to them:
// documents.js).
// Who is asking comes from /me: a key's owner, a person signed in with the identity
// provider (a session cookie the page never sees), or anyone on a server open to all. When
// that person goes (sign-out, another key, a 401), the page forgets everything of theirs
// before it asks for the next one.

import { Documents } from "./documents.js";
import { el } from "./dom.js";
import { render } from "./markdown.js";
import { Viewer } from "./viewer.js";

const PREFERENCES = "ragchains.preferences.v1";
const API_KEY = "ragchains.api-key";
// Where earlier releases kept the conversation in the browser: removed when found.
const OLD_CONVERSATION = "ragchains.conversation.v1";
const OURS = "ragchains.";
// The newest turns sent as chat history, within the server's limits (from /readyz); the
// server then keeps what fits the model's token budget.
const HISTORY_MESSAGES = 20;
const CONVERSATIONS_PAGE = 50;
const CONVERSATIONS_MOST = 200; // the server's largest page
const CONVERSATION_ADDRESS = /^#c\/([A-Za-z0-9][A-Za-z0-9_.-]{0,63})$/;
const KEY_REFUSED = "The key was refused; enter it again.";
const CITATION = /\[([^[\]\n]{1,300})\]/g;
const CITATION_SPLIT = /\s*[;,]\s*/;
const ENDED = new Set(["answered", "abstained", "error", "stopped"]);

const $ = (id) => document.getElementById(id);

// A conversation as the page holds it: ``id`` null until its first turn is stored (a new
// chat); ``creating`` the POST that makes it, shared by the turns asked meanwhile.
function freshChat() {
  return { id: null, title: "", creating: null };
}

const state = {
  turns: [],
  prefs: restorePrefs(),
  running: null, // { turn, controller } while an answer streams
  server: null, // /readyz
  me: null, // /me once it answered: who is asking
  ready: false, // who is asking is settled: conversations and documents may be read
  chat: freshChat(), // the conversation shown
  conversations: [], // the list, the most recently continued first, as far as it was read
  nextOffset: null,
  listing: 0, // bumped per list request: an older, slower answer is dropped
  // Bumped when the person changes: what comes back late for the last one is dropped.
  epoch: 0,
  saving: Promise.resolve(), // the turns' PUTs, one after another (their order is kept)
  leaving: false, // signing out or switching: the page is about to load afresh
};

// Why the last page forgot its person and loaded this one (a refused key, an expired
// sign-in): said when the page asks for the next one. A reload keeps window.history.state
// (``window.`` throughout: history() is the chat history sent with a turn).
const arrivedBecause = typeof window.history.state?.notice === "string" ? window.history.state.notice : null;
// A sign-in that failed comes back with its reason (?sign_in_error=), shown in the prompt.
const signInError = new URLSearchParams(location.search).get("sign_in_error");
// Nothing else is taken from a query (the identity provider's return adds its state to
// it): the address keeps only the path and the view.
if (arrivedBecause !== null || location.search) {
  window.history.replaceState(null, "", location.pathname + location.hash);
}

// ------------------------------------------------------------------------- storage
function read(key, fallback) {
  try {
    const value = JSON.parse(localStorage.getItem(key));
    return value ?? fallback;
  } catch {
    return fallback;
  }
}

function restorePrefs() {
  const saved = read(PREFERENCES, {});
  return {
    mode: saved?.mode === "ask" ? "ask" : "chat",
    domain: typeof saved?.domain === "string" ? saved.domain : "default",
  };
}

function savePrefs() {
  try {
    localStorage.setItem(PREFERENCES, JSON.stringify(state.prefs));
  } catch {
    // storage is full or off: the page still works, the choice lasts until a reload
  }
  showWhere();
}

function storedKey() {
  try {
    return localStorage.getItem(API_KEY);
  } catch {
    return null;
  }
}

// Everything of this page's in the browser's storage but the preferences (a mode and a
// domain, nobody's in particular): the key, and what earlier releases kept (a conversation).
function forgetStorage() {
  for (const storage of [localStorage, sessionStorage]) {
    try {
      const ours = [];
      for (let i = 0; i < storage.length; i++) {
        const key = storage.key(i);
        if (key?.startsWith(OURS) && key !== PREFERENCES) ours.push(key);
      }
      for (const key of ours) storage.removeItem(key);
    } catch {
      // storage is off: there is nothing in it
    }
  }
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
  const key = storedKey();
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
    if (error.status === 401) lostIdentity(error.message);
    throw error;
  }
  return response;
}

// A request's JSON body, with the caller's key.
async function sendJson(path, method, body) {
  return send(path, { method, body: JSON.stringify(body) });
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
    chat: state.chat, // the conversation it is stored in, wherever the page has gone since
    epoch: state.epoch,
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
  notify("");
  showTurn(turn);
  showRunning();
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
      if (error.status === 401) lostIdentity(error.message);
    }
  } finally {
    if (state.running?.turn === turn) state.running = null;
    showRunning();
    showTurn(turn);
    announce(turn);
    store(turn);
  }
}

// ------------------------------------------------------------------------- stored turns
// The turn as the server keeps it (TurnIn): what the page showed, the chain's output as it
// arrived, and the feedback once it was sent.
function storedTurn(turn) {
  const sent = turn.feedback?.sent === true;
  return {
    question: turn.question,
    mode: turn.mode,
    domain: turn.domain,
    status: turn.status,
    output: { ...turn.out, answer: turn.out.answer ?? "" },
    feedback: sent ? { score: turn.feedback.score, comment: turn.feedback.comment ?? "" } : { score: null, comment: "" },
    run_id: typeof turn.runId === "string" ? turn.runId : null,
    error: turn.status === "error" ? String(turn.error ?? "").slice(0, 2000) : null,
  };
}

// A turn the server kept (this page's, or one a client of the threads API ran: its output
// is the chain's whole output), as the page shows it; null for what is no turn.
function shownTurn(record, chat) {
  if (record === null || typeof record !== "object") return null;
  if (typeof record.id !== "string" || typeof record.question !== "string") return null;
  const out = record.output !== null && typeof record.output === "object" ? { ...record.output } : {};
  if (typeof out.answer !== "string") out.answer = "";
  const feedback = record.feedback ?? {};
  const voted = feedback.score === 0 || feedback.score === 1;
  const status = ENDED.has(record.status) ? record.status : "answered";
  return {
    id: record.id,
    chat,
    epoch: state.epoch,
    mode: record.mode === "ask" ? "ask" : "chat",
    domain: typeof record.domain === "string" ? record.domain : "default",
    question: record.question,
    status,
    out,
    runId: typeof record.run_id === "string" ? record.run_id : null,
    error: status === "error" ? (record.error ?? "the turn failed") : null,
    feedback: voted ? { score: feedback.score, comment: feedback.comment ?? "", sent: true } : {},
  };
}

// Stores a turn that ended (PUT: new, or replacing itself when its feedback was sent), in
// its own conversation: made first (POST) for a new chat's first turn. The PUTs go one after
// another, so the turns keep the order they were asked in. Nothing is stored for a person
// who has gone meanwhile.
function store(turn) {
  if (turn.epoch !== state.epoch || !ENDED.has(turn.status)) return state.saving;
  const body = storedTurn(turn);
  state.saving = state.saving
    .then(async () => {
      if (turn.epoch !== state.epoch) return;
      const id = await conversationOf(turn.chat);
      if (turn.epoch !== state.epoch) return;
      const path = `/conversations/${encodeURIComponent(id)}/turns/${encodeURIComponent(turn.id)}`;
      await sendJson(path, "PUT", body);
      if (turn.saveError) {
        turn.saveError = null;
        showTurn(turn);
      }
      loadConversations();
    })
    .catch((error) => {
      if (turn.epoch !== state.epoch || error.status === 401) return;
      turn.saveError = `This turn is not saved: ${error.message}`;
      showTurn(turn);
    });
  return state.saving;
}

// The conversation's id on the server: made now for a new chat (the address then names it,
// if the page still shows it).
async function conversationOf(chat) {
  if (chat.id !== null) return chat.id;
  chat.creating ??= sendJson("/conversations", "POST", {}).then((response) => response.json());
  let made;
  try {
    made = await chat.creating;
  } catch (error) {
    chat.creating = null; // the next turn tries again
    throw error;
  }
  chat.id = made.id;
  chat.title = made.title ?? "";
  if (state.chat === chat) {
    // The new chat has become this conversation: the same history entry, now named.
    if (view() === "chat" && conversationInAddress() === null) {
      window.history.replaceState(null, "", addressOf(chat));
    }
    showConversation();
  }
  return chat.id;
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
// A quote shown under its section's heading ("**min_search_length:** An integer …"): the
// bold lead is not text of the source, so the viewer looks for what follows it.
const LEAD = /^\*\*(?:[^*\\]|\\.)+?[:?!.]\*\*\s+/;

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
    held.push({ labels, quote: quoted ? before.trim().replace(LEAD, "") : null });
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
    turn.saveError ? el("p", { class: "error", role: "alert" }, turn.saveError) : null,
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
    if (feedback.justSent) {
      return el("p", { class: "feedback sent", role: "status" }, "Thanks, your feedback was sent.");
    }
    // Sent before (in another visit, or on another device): what it said.
    return el(
      "p",
      { class: "feedback sent" },
      `Your feedback: ${feedback.score === 1 ? "a good answer" : "a bad answer"}`,
      feedback.comment ? [": ", el("q", {}, feedback.comment)] : ".",
    );
  }
  const pick = (value) => () => {
    const typed = turnElement(turn)?.querySelector(".feedback textarea");
    if (typed) feedback.comment = typed.value;
    feedback.score = value;
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
    turn.feedback = { score: turn.feedback.score, comment, sent: true, justSent: true };
  } catch (error) {
    turn.feedback.error = `Feedback not sent: ${error.message}`;
    if (error.status === 401) lostIdentity(error.message);
  } finally {
    delete turn.feedback.pending;
  }
  showTurn(turn);
  // The turn is stored again with its feedback (PUT replaces it in place).
  if (turn.feedback.sent) store(turn);
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

// ------------------------------------------------------------------------- who is asking
// Who is asking (GET /me): a signed-in person or a key's owner is named in the header, with
// a control that signs them out (or forgets the key); nobody yet: the page asks, with the
// key form, the identity provider's sign-in, or both.
async function identify() {
  const epoch = state.epoch;
  let response;
  try {
    response = await fetch("/me", { headers: headers() });
  } catch {
    response = null; // unreachable for a moment: each call says so itself
  }
  if (epoch !== state.epoch) return;
  if (response?.status === 401) {
    // (A server before /me was open to all: it refused nobody this way.)
    const error = await failure(response);
    nobody(isExpired(error.message) ? error.message : null);
    return;
  }
  // An older server has no /me: the page works as it did, without a name.
  let me = null;
  if (response?.ok) {
    try {
      me = await response.json();
    } catch {
      me = null;
    }
  }
  if (epoch !== state.epoch) return;
  // Nobody (no key, a key refused, no sign-in or one that ended) where someone is needed.
  const needed = Boolean(state.server?.api_key_required || state.server?.sign_in);
  if (me !== null && me.name === null && needed) {
    nobody(me.signed_out ?? null);
    return;
  }
  settle(me);
}

// Nobody is asking: the prompt, saying why when there is a reason (a key refused, a sign-in
// that expired or failed at the provider).
function nobody(reason) {
  const keyed = Boolean(storedKey());
  if (keyed) forgetStorage();
  showPrompt(keyed ? KEY_REFUSED : (arrivedBecause ?? signInError ?? reason));
}

function isExpired(message) {
  return /expired/i.test(message ?? "");
}

// Who is asking is known: their name, what there is to ask about, their conversations, and
// the one (or the documents) the address names.
function settle(me) {
  state.me = me;
  state.ready = true;
  $("sign-in-again").hidden = true;
  showWho();
  showCollection();
  loadConversations();
  route(false);
}

function showWho() {
  const me = state.me;
  const named = me !== null && (me.via === "oidc" || me.via === "key");
  $("who").hidden = !named;
  if (!named) return;
  const name = me.display || me.name || "";
  $("who-name").textContent = name;
  $("who-name").title = me.via === "key" ? `Using the key of ${name}` : `Signed in as ${name}`;
  $("sign-out").textContent = me.via === "oidc" ? "Sign out" : "Sign out / switch key";
}

// The prompt for the next person: the identity provider's sign-in when the server has one,
// the key form when keys are taken (both: either).
function showPrompt(message = null) {
  const signIn = state.server?.sign_in?.url ?? null;
  const keys = signIn === null || Boolean(state.server?.api_key_required);
  $("key-title").textContent = signIn ? "Sign in" : "API key";
  $("sign-in-part").hidden = signIn === null;
  $("key-or").hidden = !keys;
  $("key-form").hidden = !keys;
  $("key-text").textContent = signIn
    ? "A key is kept in this browser and sent with each question."
    : "This server needs an API key. It is kept in this browser and sent with each question.";
  $("key-error").hidden = !message;
  $("key-error").textContent = message ?? "";
  $("sign-in-again").textContent = signIn ? "Sign in" : "Enter key";
  $("sign-in-again").hidden = true;
  $("conversations-note").textContent = signIn
    ? "Sign in to see your conversations."
    : "Enter your key to see your conversations.";
  const dialog = $("key-dialog");
  if (!dialog.open) dialog.showModal();
  (signIn ? $("sign-in") : $("api-key")).focus();
}

function promptClosed() {
  // Closed without a key (Escape): the header keeps a way back to it.
  if (!state.ready && !state.leaving && !storedKey()) $("sign-in-again").hidden = false;
}

function signIn() {
  const url = state.server?.sign_in?.url;
  if (typeof url !== "string" || !url.startsWith("/")) return;
  state.leaving = true;
  location.assign(url); // the provider sends the browser back to / signed in
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
  try {
    localStorage.setItem(API_KEY, key);
  } catch {
    $("key-error").textContent = "This browser keeps nothing for this page (its storage is off): the key cannot be kept.";
    $("key-error").hidden = false;
    return;
  }
  $("api-key").value = "";
  $("key-dialog").close();
  identify();
}

// Everything of the person who was asking, gone from the page and from the browser's
// storage at once (before any request for the next one could answer): the turns, the
// conversations, the source open, the documents listed, the key; the address no longer
// names their conversation. Anything that comes back late for them is dropped (the epoch).
function forget() {
  state.epoch++;
  const running = state.running;
  state.running = null;
  running?.controller.abort();
  forgetStorage();
  state.me = null;
  state.ready = false;
  state.turns = [];
  state.chat = freshChat();
  state.conversations = [];
  state.nextOffset = null;
  state.listing++;
  for (const dialog of document.querySelectorAll("dialog[open]")) dialog.close(""); // nothing confirmed
  closeSource();
  viewer?.clear();
  $("source-facts").replaceChildren();
  $("source-view").replaceChildren();
  $("turns").replaceChildren();
  $("conversation-list").replaceChildren();
  $("more-conversations").hidden = true;
  $("conversations-note").textContent = "";
  $("collection").replaceChildren();
  $("question").value = "";
  $("status").textContent = "";
  notify("");
  // The Documents view's list, jobs and name (documents.js reads them again for the next).
  for (const part of $("documents-table").children) if (part.tagName !== "CAPTION") part.replaceChildren();
  $("jobs").replaceChildren();
  $("documents-who").textContent = "";
  $("documents-empty").hidden = true;
  $("documents-pages").hidden = true;
  $("upload").hidden = true;
  showWho();
  showConversation();
  showRunning();
  window.history.replaceState(null, "", location.pathname);
  route(false);
}

// A 401 in the middle: the key was removed, or the sign-in expired. Nobody shown yet: the
// prompt; else everything of the last person is forgotten and a fresh page asks again.
function lostIdentity(reason) {
  if (state.leaving) return;
  const keyed = Boolean(storedKey());
  const message = keyed ? KEY_REFUSED : reason;
  if (state.me === null || arrivedBecause !== null) {
    // (A page that was itself loaded afresh for this asks here: never a loop of reloads.)
    forget();
    showPrompt(message);
    return;
  }
  state.leaving = true;
  forget();
  window.history.replaceState({ notice: message }, "", location.pathname);
  location.reload();
}

// Sign-out (a signed-in person) or switching key (a key's owner): forgotten first, then the
// server's session ends (and the provider's, when it says where), and the page asks anew.
async function signOut() {
  const via = state.me?.via;
  state.leaving = true;
  forget();
  if (via === "oidc") {
    let next = null;
    try {
      const response = await fetch("/auth/logout", { method: "POST" });
      if (response.ok) next = (await response.json()).end_session_url ?? null;
    } catch {
      next = null;
    }
    if (typeof next === "string" && /^https?:\/\//i.test(next)) {
      location.assign(next); // the provider ends its session too, and comes back to /
      return;
    }
  }
  location.reload();
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
  // Keys only and none kept: nobody to ask the server about (a sign-in may have a session).
  if (state.server.api_key_required && !state.server.sign_in && !storedKey()) showPrompt(arrivedBecause);
  else identify();
}

// ------------------------------------------------------------------------- conversations
function conversationInAddress() {
  const match = CONVERSATION_ADDRESS.exec(location.hash);
  return match ? match[1] : null;
}

function addressOf(chat) {
  return chat.id === null ? "#chat" : `#c/${chat.id}`;
}

// A line under the conversation's title: what happened to it (not found, not deleted…).
function notify(text) {
  $("chat-notice").textContent = text;
  $("chat-notice").hidden = !text;
}

// The chat the address names, once who is asking is known: a new one (#chat, or none) or a
// stored conversation (#c/<id>), read from the server.
function followAddress() {
  if (!state.ready) return;
  const wanted = conversationInAddress();
  if (wanted === state.chat.id) return;
  if (wanted === null) startChat();
  else openConversation(wanted);
}

function startChat() {
  stop();
  state.chat = freshChat();
  state.turns = [];
  $("turns").replaceChildren();
  closeSource();
  notify("");
  showConversation();
}

async function openConversation(id) {
  stop();
  const chat = { id, title: "", creating: null };
  state.chat = chat;
  state.turns = [];
  $("turns").replaceChildren();
  closeSource();
  notify("");
  showConversation();
  $("intro").hidden = true;
  $("status").textContent = "Opening the conversation…";
  let found;
  try {
    found = await request(`/conversations/${encodeURIComponent(id)}`);
  } catch (error) {
    if (state.chat !== chat || error.status === 401) return;
    $("status").textContent = "";
    if (error.status === 404) {
      // Not this person's, or deleted: a new chat in its place.
      window.history.replaceState(null, "", "#chat");
      startChat();
      notify("That conversation is not one of yours, or it was deleted.");
    } else {
      notify(`The conversation cannot be opened now: ${error.message}`);
    }
    return;
  }
  if (state.chat !== chat) return;
  chat.title = typeof found.title === "string" ? found.title : "";
  const turns = Array.isArray(found.history) ? found.history : [];
  state.turns = turns.map((record) => shownTurn(record, chat)).filter(Boolean);
  try {
    for (const turn of state.turns) showTurn(turn);
  } catch (error) {
    // A turn this page cannot show (another client's) must not take the page down with it.
    console.warn("a stored turn could not be shown", error);
  }
  showConversation();
  $("status").textContent = `Opened “${titleOf(chat)}”, ${plural(state.turns.length, "turn")}.`;
}

function titleOf(chat) {
  return chat.title || state.turns[0]?.question || "Untitled conversation";
}

function plural(count, one) {
  return `${count} ${count === 1 ? one : `${one}s`}`;
}

// The open conversation's bar (its title and actions), its entry marked in the list, and
// the Chat link that leads back to it.
function showConversation() {
  const chat = state.chat;
  const stored = chat.id !== null;
  $("conversation-bar").hidden = !stored;
  $("conversation-title").textContent = stored ? titleOf(chat) : "";
  $("conversation-title").title = stored ? titleOf(chat) : ""; // in full, where it is cut
  $("intro").hidden = state.turns.length > 0;
  $("to-chat").setAttribute("href", addressOf(chat));
  for (const link of $("conversation-list").querySelectorAll("a[data-conversation]")) {
    if (link.dataset.conversation === chat.id) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (view() === "chat") document.title = "ragchains";
}

// The person's conversations, the most recently continued first (read again after each
// stored turn, rename and delete; "Show older" reads the next page).
async function loadConversations({ older = false } = {}) {
  if (!state.ready) return;
  const epoch = state.epoch;
  const asked = ++state.listing;
  const offset = older ? (state.nextOffset ?? state.conversations.length) : 0;
  const limit = older
    ? CONVERSATIONS_PAGE
    : Math.min(CONVERSATIONS_MOST, Math.max(CONVERSATIONS_PAGE, state.conversations.length));
  let page;
  try {
    page = await request(`/conversations?limit=${limit}&offset=${offset}`);
  } catch (error) {
    if (epoch !== state.epoch || asked !== state.listing || error.status === 401) return;
    $("conversations-note").textContent = `Your conversations cannot be listed now: ${error.message}`;
    return;
  }
  if (epoch !== state.epoch || asked !== state.listing) return;
  const found = Array.isArray(page?.conversations) ? page.conversations : [];
  if (older) {
    const known = new Set(state.conversations.map((c) => c.id));
    state.conversations = [...state.conversations, ...found.filter((c) => !known.has(c.id))];
  } else {
    state.conversations = found;
  }
  state.nextOffset = typeof page?.next_offset === "number" ? page.next_offset : null;
  showConversations();
}

const DAY = new Intl.DateTimeFormat(undefined, { dateStyle: "medium" });
const TIME = new Intl.DateTimeFormat(undefined, { timeStyle: "short" });

// Today's by the time, older ones by the day.
function when(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return "";
  const today = new Date().toDateString() === date.toDateString();
  return el("time", { datetime: iso }, today ? TIME.format(date) : DAY.format(date));
}

function showConversations() {
  const list = $("conversation-list");
  // The focus stays on the entry it was on when the list is drawn again.
  const focused = list.contains(document.activeElement) ? document.activeElement.dataset.conversation : null;
  list.replaceChildren(
    ...state.conversations.map((c) =>
      el(
        "li",
        {},
        el(
          "a",
          { class: "conversation-link", href: `#c/${c.id}`, "data-conversation": c.id, title: c.title || null },
          el("span", { class: "conversation-name" }, c.title || "Untitled conversation"),
          el("small", { class: "conversation-when" }, when(c.updated_at), ` · ${plural(c.turns ?? 0, "turn")}`),
        ),
      ),
    ),
  );
  if (focused) list.querySelector(`a[data-conversation="${CSS.escape(focused)}"]`)?.focus();
  $("conversations-note").textContent = state.conversations.length
    ? ""
    : "None yet: each chat is kept here once its first answer ends.";
  $("more-conversations").hidden = state.nextOffset === null;
  // The open one's title as the server has it (its first question, a rename elsewhere).
  const open = state.conversations.find((c) => c.id === state.chat.id);
  if (open) state.chat.title = open.title;
  showConversation();
}

function renameConversation() {
  if (state.chat.id === null) return;
  $("rename-input").value = titleOf(state.chat);
  $("rename-error").hidden = true;
  $("rename-dialog").showModal();
  $("rename-input").select();
}

async function saveRename(event) {
  event.preventDefault();
  const chat = state.chat;
  const title = $("rename-input").value.trim();
  if (!title || chat.id === null) return;
  $("rename-save").disabled = true;
  try {
    const response = await sendJson(`/conversations/${encodeURIComponent(chat.id)}`, "PATCH", { title });
    const renamed = await response.json();
    chat.title = renamed.title ?? title;
    $("rename-dialog").close();
    const listed = state.conversations.find((c) => c.id === chat.id);
    if (listed) listed.title = chat.title;
    showConversations();
    $("status").textContent = `Renamed to “${chat.title}”.`;
  } catch (error) {
    if (error.status === 401) return;
    $("rename-error").textContent = `Not renamed: ${error.message}`;
    $("rename-error").hidden = false;
  } finally {
    $("rename-save").disabled = false;
  }
}

let deleting = null; // the conversation the delete dialog asks about

function deleteConversation() {
  const chat = state.chat;
  if (chat.id === null) return;
  deleting = chat;
  $("delete-text").textContent = `“${titleOf(chat)}” and its ${plural(state.turns.length, "turn")} are deleted from the server, for good.`;
  $("delete-dialog").returnValue = "";
  $("delete-dialog").showModal();
  $("delete-cancel").focus();
}

async function deleteClosed() {
  const chat = deleting;
  deleting = null;
  if ($("delete-dialog").returnValue !== "delete" || chat?.id == null) return;
  try {
    await send(`/conversations/${encodeURIComponent(chat.id)}`, { method: "DELETE" });
  } catch (error) {
    if (error.status === 401) return;
    if (error.status !== 404) {
      // (404: deleted already, from another tab or device.)
      notify(`Not deleted: ${error.message}`);
      return;
    }
  }
  state.conversations = state.conversations.filter((c) => c.id !== chat.id);
  if (state.chat === chat) {
    window.history.replaceState(null, "", "#chat");
    startChat();
  }
  showConversations();
  notify(`“${titleOf(chat)}” was deleted.`);
  $("question").focus();
  loadConversations();
}

// A download of the conversation, fetched with the caller's key (a link could not send it)
// and handed to the browser as a file.
async function exportConversation(format) {
  const chat = state.chat;
  if (chat.id === null) return;
  let blob;
  let name;
  try {
    const response = await send(`/conversations/${encodeURIComponent(chat.id)}/export?format=${format}`);
    const given = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") ?? "");
    name = given ? given[1] : `conversation.${format === "json" ? "json" : "md"}`;
    blob = await response.blob();
  } catch (error) {
    if (error.status !== 401) notify(`Not exported: ${error.message}`);
    return;
  }
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
  $("status").textContent = `Downloaded ${name}.`;
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
  if (document.body.classList.contains("settings-open")) $("menu").click();
  if (shown === "documents") {
    document.title = "Documents · ragchains";
    // Read again each time: the role, the documents and their states may have changed.
    if (state.ready) documents.refresh();
    if (moved) $("documents-title").focus();
  } else {
    followAddress();
    showConversation();
    if (moved) $("question").focus();
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
  const epoch = state.epoch;
  let collection;
  try {
    collection = await request("/collection");
  } catch {
    $("collection").replaceChildren(); // no key yet, or an older server: the intro stays
    return;
  }
  if (epoch !== state.epoch) return;
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

// "New chat": the conversation shown stays on the server (and in the list); Back returns to it.
function newChat() {
  if (state.chat.id !== null) window.history.pushState(null, "", "#chat");
  startChat();
  $("question").value = "";
  $("question").focus();
}

function init() {
  // An earlier release kept the conversation here; it lives on the server now.
  try {
    localStorage.removeItem(OLD_CONVERSATION);
  } catch {
    // storage is off
  }
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
  $("key-dialog").addEventListener("close", promptClosed);
  $("sign-in").addEventListener("click", signIn);
  $("sign-in-again").addEventListener("click", () => showPrompt());
  $("sign-out").addEventListener("click", signOut);
  $("more-conversations").addEventListener("click", () => loadConversations({ older: true }));
  $("rename").addEventListener("click", renameConversation);
  $("rename-form").addEventListener("submit", saveRename);
  $("rename-cancel").addEventListener("click", () => $("rename-dialog").close());
  $("delete").addEventListener("click", deleteConversation);
  $("delete-dialog").addEventListener("close", deleteClosed);
  $("export-markdown").addEventListener("click", () => exportConversation("markdown"));
  $("export-json").addEventListener("click", () => exportConversation("json"));
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
  showRunning();
  route(false);
  connect();
}

init();
