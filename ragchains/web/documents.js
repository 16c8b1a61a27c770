// The Documents view: the documents the caller may read (GET /documents: a page of them,
// searched and filtered by the server) and, for a key whose role allows it (GET /me), the
// changes: upload, replace, remove. Each change is an ingest job, followed to its end by its
// server-sent events read from a fetch body (EventSource cannot send the key), else by
// polling; what it did is shown under the upload form, and the list is read again.

import { el } from "./dom.js";

const POLL_MS = 1000;
const POLL_FAILURES = 30; // polls in a row that fail before the page stops following a job
const SEARCH_DELAY_MS = 250;
const KEPT_JOBS = 8; // job entries shown; the oldest finished one goes first
const FINISHED = new Set(["done", "failed"]);
const KINDS = { upload: "Upload", replace: "Replace", remove: "Remove", reingest: "Read again" };

const $ = (id) => document.getElementById(id);

// ------------------------------------------------------------------------- wording
function plural(count, one, many = `${one}s`) {
  return `${count} ${count === 1 ? one : many}`;
}

function basename(path) {
  return String(path ?? "").split("/").at(-1);
}

// "a.md, b.txt and 3 more": what a job changes, short enough for a label.
function fileList(paths) {
  const names = paths.map(basename);
  return names.length > 3 ? `${names.slice(0, 3).join(", ")} and ${names.length - 3} more` : names.join(", ");
}

function bytes(size) {
  if (size == null) return "—";
  if (size < 1024) return `${size} B`;
  const units = ["KB", "MB", "GB", "TB"];
  let value = size / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
}

function extent(doc) {
  if (doc.pages != null) return plural(doc.pages, "page");
  if (doc.slides != null) return plural(doc.slides, "slide");
  if (doc.sheets != null) return [plural(doc.sheets, "sheet"), doc.rows != null ? plural(doc.rows, "row") : null].filter(Boolean).join(", ");
  if (doc.rows != null) return plural(doc.rows, "row");
  return "—";
}

function duration(seconds) {
  if (seconds < 60) return `${Math.max(1, Math.ceil(seconds))} s`;
  return `${Math.round(seconds / 60)} min`;
}

const DAY = new Intl.DateTimeFormat(undefined, { dateStyle: "medium" });
const TIME = new Intl.DateTimeFormat(undefined, { timeStyle: "short" });

// The day and the time, each on a line of its own.
function when(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return el("time", { datetime: iso }, iso);
  return el("time", { datetime: iso }, el("span", {}, DAY.format(date)), " ", el("span", {}, TIME.format(date)));
}

// A path in a URL: each of its parts encoded, its slashes kept (the API's {path:path}).
function pathUrl(path) {
  return path.split("/").map(encodeURIComponent).join("/");
}

// A path that wraps after its slashes rather than within a name.
function pathNodes(path) {
  return path.split("/").flatMap((part, i, parts) => (i < parts.length - 1 ? [part, "/", el("wbr")] : [part]));
}

function suffix(path) {
  const name = basename(path);
  const dot = name.lastIndexOf(".");
  return dot > 0 ? name.slice(dot) : "";
}

// ------------------------------------------------------------------------- the view
export class Documents {
  // ``send(path, { method, body, signal })``: a request with the caller's key, its response
  // (a ServerError with the server's reason when refused); ``request(path)``: a GET's JSON;
  // ``events(response, signal)``: a response's server-sent events; ``openDocument(doc,
  // opener)``: the document in the source panel (the passage viewer).
  constructor({ send, request, events, openDocument }) {
    this.send = send;
    this.request = request;
    this.events = events;
    this.openDocument = openDocument;
    this.me = null; // GET /me
    this.query = { search: "", folder: "", format: "", state: "" };
    this.offset = 0;
    this.listed = 0; // bumped per list request: an older, slower answer is dropped
    this.replacing = null; // the document a new version is being chosen for
    this.removing = null; // { doc, opener } while the remove dialog is open
    this.groupsEdited = false;
    this.following = new Set(); // ids of the jobs followed by this page
    this.wire();
  }

  wire() {
    $("upload-form").addEventListener("submit", (event) => event.preventDefault());
    $("upload-groups").addEventListener("input", () => (this.groupsEdited = true));
    const picker = $("upload-files");
    picker.addEventListener("change", () => {
      const files = [...picker.files];
      picker.value = ""; // the same files can be chosen again (after a refusal)
      this.upload(files);
    });
    const zone = $("drop-zone");
    const dragging = (on) => zone.classList.toggle("dragging", on);
    for (const type of ["dragenter", "dragover"]) {
      zone.addEventListener(type, (event) => {
        if (!carriesFiles(event)) return;
        event.preventDefault();
        event.stopPropagation();
        event.dataTransfer.dropEffect = "copy";
        dragging(true);
      });
    }
    zone.addEventListener("dragleave", (event) => {
      if (!zone.contains(event.relatedTarget)) dragging(false);
    });
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      event.stopPropagation();
      dragging(false);
      this.upload([...(event.dataTransfer?.files ?? [])]);
    });
    // Files dropped beside the zone are refused, rather than opened by the browser in
    // place of the page.
    for (const type of ["dragover", "drop"]) {
      document.addEventListener(type, (event) => {
        if ($("documents-view").hidden || !carriesFiles(event)) return;
        event.preventDefault();
        event.dataTransfer.dropEffect = "none";
      });
    }

    $("document-filters").addEventListener("submit", (event) => {
      event.preventDefault();
      clearTimeout(this.typing);
      this.filter();
    });
    $("doc-search").addEventListener("input", () => {
      clearTimeout(this.typing);
      this.typing = setTimeout(() => this.filter(), SEARCH_DELAY_MS);
    });
    for (const id of ["doc-folder", "doc-format", "doc-state"]) {
      $(id).addEventListener("change", () => this.filter());
    }
    $("documents-previous").addEventListener("click", () => this.turn(-1));
    $("documents-next").addEventListener("click", () => this.turn(1));

    $("replace-file").addEventListener("change", () => {
      const input = $("replace-file");
      const file = input.files[0];
      const chosen = this.replacing;
      input.value = "";
      this.replacing = null;
      if (file && chosen) this.replace(chosen.doc, file);
    });
    $("remove-dialog").addEventListener("close", () => this.removeClosed());
  }

  // ----------------------------------------------------------------------- reading
  // Who the caller is, the formats there are, and the list: read each time the view is
  // shown (the role or the documents may have changed meanwhile) and after a new key.
  async refresh() {
    await Promise.all([this.loadMe(), this.loadFormats()]);
    await Promise.all([this.list(), this.resume()]);
  }

  // Jobs of the caller's still under way (asked for before a reload, or from another tab):
  // followed here too.
  async resume() {
    if (!this.me?.may_upload) return;
    let jobs;
    try {
      jobs = (await this.request("/jobs")).jobs ?? [];
    } catch {
      return;
    }
    for (const job of jobs.reverse()) {
      const open = !FINISHED.has(job.state) && job.by === this.me.name;
      if (open && !this.following.has(job.id)) this.follow(this.jobItem(job), job);
    }
  }

  async loadMe() {
    try {
      this.me = await this.request("/me");
    } catch {
      this.me = null;
    }
    this.showMe();
  }

  showMe() {
    const me = this.me;
    const may = Boolean(me?.may_upload);
    $("upload").hidden = !may;
    if (!me) {
      $("documents-who").textContent = "";
      return;
    }
    const reads = me.groups == null ? "reads every document" : `groups ${me.groups.join(", ") || "none"}`;
    $("documents-who").textContent = [
      `${me.name ?? "no key"}${me.role ? ` · ${me.role}` : ""} · ${reads}.`,
      may ? "" : " Adding or changing documents needs the editor role.",
    ].join("");
    const mine = (me.groups ?? []).join(", ");
    if (!this.groupsEdited) $("upload-groups").value = mine;
    $("upload-groups-hint").textContent =
      me.groups == null
        ? "Comma-separated. Empty: everyone may read them."
        : me.may_see_all_jobs
          ? `Comma-separated. Empty: your own (${mine || "none"}).`
          : `Comma-separated; never more than yours (${mine || "none"}).`;
  }

  async loadFormats() {
    let collection;
    try {
      collection = await this.request("/collection");
    } catch {
      return; // the filter keeps the formats it had
    }
    const labels = collection.labels ?? {};
    const kinds = Object.keys(collection.kinds ?? {}).sort();
    const select = $("doc-format");
    const chosen = select.value;
    if (chosen && !kinds.includes(chosen)) kinds.push(chosen);
    select.replaceChildren(
      el("option", { value: "" }, "All formats"),
      ...kinds.map((kind) => el("option", { value: kind }, labels[kind]?.label_plural ?? kind)),
    );
    select.value = chosen;
  }

  filter() {
    const query = {
      search: $("doc-search").value.trim(),
      folder: $("doc-folder").value,
      format: $("doc-format").value,
      state: $("doc-state").value,
    };
    // A late search timer (or a change back to the same choice) asks for what is shown
    // already: the page turned to stays.
    if (JSON.stringify(query) === JSON.stringify(this.query)) return;
    this.query = query;
    this.offset = 0;
    this.list(true);
  }

  turn(step) {
    const limit = this.page?.limit ?? 50;
    this.offset = Math.max(0, this.offset + step * limit);
    this.list(true);
  }

  // ``announce``: say how many there are (a search, a filter, a page turned).
  async list(announce = false) {
    const ticket = ++this.listed;
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(this.query)) if (value) params.set(name, value);
    if (this.offset) params.set("offset", String(this.offset));
    const table = $("documents-table");
    table.setAttribute("aria-busy", "true");
    try {
      const query = params.toString();
      const page = await this.request(`/documents${query ? `?${query}` : ""}`);
      if (ticket !== this.listed) return;
      // Past the end (the last of a page was removed): the last page there is.
      if (page.total > 0 && page.offset >= page.total) {
        this.offset = Math.floor((page.total - 1) / page.limit) * page.limit;
        return this.list(announce);
      }
      this.page = page;
      this.render(page);
      if (announce) this.say(this.countText(page));
    } catch (error) {
      if (ticket !== this.listed) return;
      this.showEmpty(`The documents cannot be listed: ${error.message}`, true);
    } finally {
      if (ticket === this.listed) table.removeAttribute("aria-busy");
    }
  }

  filtered() {
    return Object.values(this.query).some(Boolean);
  }

  countText(page) {
    const shown =
      page.total > page.documents.length
        ? ` (${page.offset + 1}–${page.offset + page.documents.length} shown)`
        : "";
    return this.filtered()
      ? `${plural(page.total, "document")} match${page.total === 1 ? "es" : ""}${shown}`
      : `${plural(page.total, "document")} you may read${shown}`;
  }

  render(page) {
    this.showFolders(page.folders ?? []);
    const actions = Boolean(this.me?.may_upload);
    const focused = this.focusedControl();
    $("documents-caption").textContent = this.countText(page);
    const head = ["Path", "Format", "Size", "Length", "Chunks", "Groups", "State", "Ingested"];
    if (actions) head.push("Actions");
    const table = $("documents-table");
    table.tHead.replaceChildren(el("tr", {}, head.map((name) => el("th", { scope: "col" }, name))));
    table.tBodies[0].replaceChildren(...page.documents.map((doc) => this.row(doc, actions)));
    const none = page.documents.length === 0;
    $("documents-scroll").hidden = none;
    if (none) {
      this.showEmpty(this.filtered() ? "No documents match." : "There are no documents you may read yet.");
    } else {
      $("documents-empty").hidden = true;
    }
    const paged = page.total > page.limit;
    $("documents-pages").hidden = !paged;
    if (paged) {
      const last = Math.min(page.offset + page.limit, page.total);
      $("documents-range").textContent = `${page.offset + 1}–${last} of ${page.total}`;
      $("documents-previous").disabled = page.offset === 0;
      $("documents-next").disabled = last >= page.total;
    }
    this.restoreFocus(focused);
  }

  showEmpty(text, failed = false) {
    const empty = $("documents-empty");
    empty.textContent = text;
    empty.className = failed ? "empty error" : "empty";
    empty.setAttribute("role", failed ? "alert" : "status");
    empty.hidden = false;
    if (failed) $("documents-scroll").hidden = true;
  }

  showFolders(folders) {
    const select = $("doc-folder");
    const chosen = select.value;
    const shown = [...select.options].slice(1).map((o) => o.value);
    const all = chosen && !folders.includes(chosen) ? [...folders, chosen].sort() : folders;
    if (shown.length !== all.length || shown.some((f, i) => f !== all[i])) {
      select.replaceChildren(el("option", { value: "" }, "All folders"), ...all.map((f) => el("option", { value: f }, f)));
      select.value = chosen;
    }
    $("upload-folders").replaceChildren(...folders.map((f) => el("option", { value: f })));
  }

  row(doc, actions) {
    const name = doc.file_id
      ? el(
          "button",
          {
            type: "button",
            class: "doc-open",
            "data-action": "open",
            title: `Open ${doc.path}`,
            onclick: (event) => this.openDocument(doc, event.currentTarget),
          },
          pathNodes(doc.path),
        )
      : el("span", { class: "doc-name" }, pathNodes(doc.path));
    return el(
      "tr",
      { "data-path": doc.path },
      el("th", { scope: "row", class: "doc-path" }, name),
      el("td", {}, doc.label ?? doc.format ?? "—"),
      el("td", { class: "num" }, bytes(doc.size)),
      el("td", {}, extent(doc)),
      el("td", { class: "num" }, String(doc.chunks)),
      el("td", {}, doc.groups.length ? doc.groups.join(", ") : "everyone"),
      el("td", { class: "doc-state" }, stateNodes(doc)),
      el(
        "td",
        { class: "doc-when" },
        doc.ingested_at ? when(doc.ingested_at) : "—",
        doc.uploaded_by ? el("small", {}, `by ${doc.uploaded_by}`) : null,
      ),
      actions
        ? el(
            "td",
            { class: "doc-actions" },
            doc.may_change
              ? el(
                  "div",
                  { class: "doc-buttons" },
                  el(
                    "button",
                    {
                      type: "button",
                      "data-action": "replace",
                      "aria-label": `Replace ${doc.path}`,
                      onclick: (event) => this.chooseReplacement(doc, event.currentTarget),
                    },
                    "Replace",
                  ),
                  el(
                    "button",
                    {
                      type: "button",
                      class: "danger",
                      "data-action": "remove",
                      "aria-label": `Remove ${doc.path}`,
                      onclick: (event) => this.confirmRemove(doc, event.currentTarget),
                    },
                    "Remove",
                  ),
                )
              : null,
          )
        : null,
    );
  }

  // A control of the list that has the focus, to give it back once the list is drawn
  // again: the same control of the same document, else (the document is gone) the list.
  focusedControl() {
    const active = document.activeElement;
    const row = active?.closest?.("#documents-table tbody tr");
    return row ? { path: row.dataset.path, action: active.dataset.action } : null;
  }

  restoreFocus(focused) {
    if (!focused) return;
    const row = [...$("documents-table").tBodies[0].rows].find((r) => r.dataset.path === focused.path);
    const control = row?.querySelector(`[data-action="${focused.action}"]`);
    if (control) control.focus();
    else if (!$("documents-scroll").hidden) $("documents-scroll").focus();
    else $("documents-title").focus();
  }

  say(text) {
    $("documents-status").textContent = text;
  }

  refusal(text) {
    const box = $("upload-error");
    box.textContent = text ?? "";
    box.hidden = !text;
  }

  // ----------------------------------------------------------------------- changes
  async upload(files) {
    if (!files.length) return;
    const names = files.map((f) => f.name);
    const form = new FormData();
    for (const file of files) form.append("files", file, file.name);
    form.append("folder", $("upload-folder").value.trim());
    const groups = $("upload-groups").value.trim();
    if (groups) form.append("groups", groups);
    this.refusal(null);
    await this.start({ kind: "upload", paths: names }, "/documents", "POST", form);
  }

  chooseReplacement(doc, opener) {
    this.replacing = { doc, opener };
    const input = $("replace-file");
    input.accept = suffix(doc.path);
    input.value = "";
    input.click();
  }

  async replace(doc, file) {
    const form = new FormData();
    form.append("file", file, file.name);
    this.refusal(null);
    await this.start({ kind: "replace", paths: [doc.path] }, `/documents/${pathUrl(doc.path)}`, "PUT", form);
  }

  confirmRemove(doc, opener) {
    this.removing = { doc, opener };
    $("remove-text").replaceChildren(
      el("strong", { class: "doc-name" }, doc.path),
      " is taken out of the collection: answers no longer find its passages.",
    );
    const dialog = $("remove-dialog");
    dialog.returnValue = "";
    dialog.showModal();
    $("remove-cancel").focus(); // the safe choice first
  }

  removeClosed() {
    const chosen = this.removing;
    this.removing = null;
    if (!chosen) return;
    if (chosen.opener?.isConnected) chosen.opener.focus();
    if ($("remove-dialog").returnValue === "remove") {
      this.refusal(null);
      this.start({ kind: "remove", paths: [chosen.doc.path] }, `/documents/${pathUrl(chosen.doc.path)}`, "DELETE");
    }
  }

  // Sends a change; once accepted, its job is followed to its end. A refusal is shown
  // with the server's reason beside the form.
  async start(pending, path, method, body) {
    const item = this.jobItem(pending);
    this.say(`${KINDS[pending.kind]} of ${fileList(pending.paths)}: sending…`);
    let job;
    try {
      const response = await this.send(path, { method, body });
      job = (await response.json()).job;
    } catch (error) {
      item.remove();
      const what = `${KINDS[pending.kind]} of ${fileList(pending.paths)} refused`;
      this.refusal(`${what}: ${error.message}`);
      this.say("");
      return;
    }
    if (this.following.has(job.id)) return item.remove(); // resume() found it first
    await this.follow(item, job);
  }

  jobItem(job) {
    const bar = el("progress", { max: "100", class: "job-bar" });
    const item = el(
      "li",
      { class: "job" },
      el("p", { class: "job-title" }, el("strong", {}, `${KINDS[job.kind] ?? job.kind}: `), el("span", { class: "job-files" }, fileList(job.paths))),
      bar,
      el("p", { class: "job-state" }, "Sending…"),
      el("div", { class: "job-result" }),
    );
    bar.setAttribute("aria-label", `${KINDS[job.kind] ?? job.kind} of ${fileList(job.paths)}: sending`);
    const list = $("jobs");
    list.prepend(item);
    const finished = [...list.children].filter((li) => li.classList.contains("is-ended"));
    while (list.children.length > KEPT_JOBS && finished.length) finished.pop().remove();
    return item;
  }

  showJob(item, job) {
    const progress = job.progress ?? {};
    const ended = FINISHED.has(job.state);
    const percent = job.state === "done" ? 100 : Math.min(100, Math.round(progress.percent ?? 0));
    const kind = KINDS[job.kind] ?? job.kind;
    const files = fileList(job.paths ?? []);
    const eta = !ended && progress.eta_seconds != null ? `about ${duration(progress.eta_seconds)} left` : null;
    const bar = item.querySelector("progress");
    bar.value = percent;
    bar.setAttribute("aria-label", [`${kind} of ${files}: ${percent}%`, eta].filter(Boolean).join(", "));
    item.querySelector(".job-files").textContent = files;
    const state = item.querySelector(".job-state");
    state.className = job.state === "failed" ? "job-state error" : "job-state";
    state.textContent =
      job.state === "failed"
        ? `Failed: ${job.error ?? "no reason given"}`
        : [stageText(job), `${percent}%`, eta].filter(Boolean).join(" · ");
  }

  async follow(item, job) {
    this.following.add(job.id);
    this.showJob(item, job);
    if (!FINISHED.has(job.state)) {
      try {
        job = await this.stream(item, job);
      } catch (error) {
        if (error.status === 404) job = { ...job, state: "failed", error: error.message };
        else job = await this.poll(item, job);
      }
    }
    this.ended(item, job);
  }

  async stream(item, job) {
    const { signal } = new AbortController(); // a job is followed to its end, never stopped
    const response = await this.send(`/jobs/${encodeURIComponent(job.id)}/events`, { signal });
    for await (const { event, data } of this.events(response, signal)) {
      if (event !== "progress" && event !== "end") continue;
      job = JSON.parse(data);
      this.showJob(item, job);
      if (event === "end") return job;
    }
    throw new Error("the job's events stopped before its end");
  }

  async poll(item, job) {
    let failures = 0;
    while (!FINISHED.has(job.state)) {
      await new Promise((resolve) => setTimeout(resolve, POLL_MS));
      try {
        job = await this.request(`/jobs/${encodeURIComponent(job.id)}`);
        failures = 0;
        this.showJob(item, job);
      } catch (error) {
        if (error.status === 404 || ++failures >= POLL_FAILURES) {
          return { ...job, state: "failed", error: `the job could not be followed (${error.message})` };
        }
      }
    }
    return job;
  }

  ended(item, job) {
    this.showJob(item, job);
    item.classList.add("is-ended");
    const kind = KINDS[job.kind] ?? job.kind;
    const files = fileList(job.paths ?? []);
    if (job.state === "failed") {
      this.say(`${kind} of ${files} failed: ${job.error ?? "no reason given"}`);
    } else {
      const { nodes, summary } = resultNodes(job.result ?? {});
      item.querySelector(".job-result").replaceChildren(...nodes);
      this.say(`${kind} of ${files} done: ${summary}.`);
    }
    this.list();
    this.loadFormats();
  }
}

function carriesFiles(event) {
  return Boolean(event.dataTransfer && [...event.dataTransfer.types].includes("Files"));
}

function stageText(job) {
  const p = job.progress ?? {};
  if (job.state === "queued") return "Waiting for the changes before it";
  if (job.state === "done") return "Done";
  if (p.stage === "reading") return p.files_total ? `Reading ${p.files_done} of ${plural(p.files_total, "file")}` : "Reading";
  if (p.stage === "embedding") {
    return p.chunks_to_embed ? `Embedding ${p.chunks_embedded} of ${plural(p.chunks_to_embed, "passage")}` : "Embedding";
  }
  if (p.stage === "writing") return "Writing the index";
  return "Starting";
}

// What a finished job did (``ragchains ingest --json``'s result): the lines to show, and a
// sentence for the live region.
function resultNodes(result) {
  const nodes = [];
  const said = [];
  const named = (label, paths) => {
    if (!paths?.length) return;
    said.push(`${paths.length} ${label.toLowerCase()}`);
    nodes.push(el("p", { class: "job-line" }, el("strong", {}, `${label}: `), paths.join(", ")));
  };
  named("Added", result.added);
  named("Updated", result.updated);
  named("Removed", result.removed);
  named("Unchanged", result.unchanged);
  const reasons = (label, items, kind) => {
    if (!items?.length) return;
    said.push(`${items.length} ${label.toLowerCase()}`);
    nodes.push(
      el("p", { class: `job-line ${kind}` }, el("strong", {}, `${label}:`)),
      el(
        "ul",
        { class: `reasons ${kind}` },
        items.map((s) => el("li", {}, el("span", { class: "doc-name" }, s.source), ` — ${s.reason}`)),
      ),
    );
  };
  reasons("Skipped", result.skipped, "skipped");
  reasons("Partly read", result.partly_read, "partly");
  if (result.kept_previous?.length) {
    nodes.push(el("p", { class: "job-line" }, el("strong", {}, "Previous version kept: "), result.kept_previous.join(", ")));
  }
  // ``chunks`` counts the whole collection's after the job, ``embedded`` the job's own.
  const counts = [
    typeof result.embedded === "number" && result.embedded ? `${plural(result.embedded, "passage")} embedded` : null,
    typeof result.chunks === "number" ? `${plural(result.chunks, "passage")} in the collection now` : null,
  ].filter(Boolean);
  if (counts.length) nodes.push(el("p", { class: "job-line hint" }, `${counts.join("; ")}.`));
  for (const note of result.notes ?? []) nodes.push(el("p", { class: "job-line hint" }, note));
  return { nodes, summary: said.join(", ") || "nothing changed" };
}

function stateNodes(doc) {
  const nodes = [el("span", { class: `state state-${doc.state.replace(/\s+/g, "-")}` }, doc.state)];
  if (doc.ocr_pages) {
    const confidence = doc.ocr_confidence != null ? `${Math.round(doc.ocr_confidence * 100)}% confidence` : "confidence unknown";
    nodes.push(el("small", { class: "ocr" }, `OCR ${confidence}, ${plural(doc.ocr_pages, "page")}`));
  }
  if (doc.left_out?.length) {
    nodes.push(
      el("small", { class: "reason" }, "Left out:"),
      el("ul", { class: "reasons" }, doc.left_out.map((reason) => el("li", {}, reason))),
    );
  }
  if (doc.skipped_reason) {
    const lead = doc.state === "skipped" ? "Skipped: " : "Its new version was not read: ";
    nodes.push(el("small", { class: "reason" }, lead, doc.skipped_reason));
  }
  return nodes;
}
