// The passage viewer of the source panel: a cited chunk shown in its document, highlighted.
//
//   PDF        the cited page drawn by PDF.js, the chunk's recorded line boxes over it and,
//              in a quoted answer, the quoted sentence's boxes stronger; previous / next page
//   image      a scanned page (PNG from the server, TIFF included) with the chunk's OCR boxes
//   text       Markdown, HTML, Word, PowerPoint (by slide), plain text: the document rendered
//              (sanitised Markdown), the chunk's blocks and table rows highlighted
//   table      CSV, JSON and Excel rows: the header and the rows around the cited one
//
// Everything comes from this server (/files/{id}, /files/{id}/view, /files/{id}/image): the
// original file by its id, readable only with the caller's key.

import { el } from "./dom.js";
import { blocks, render, renderTokens } from "./markdown.js";

const PDFJS = "/ui/vendor/pdfjs/";
const ROWS_AROUND = 5;
const OPEN_PDFS = 3;
const HEAD_CHARS = 30; // a chunk's first and last characters, to find where it starts and ends

// Whitespace-free text: chunks, files and PDF text layers differ in spacing only.
const flat = (text) => String(text ?? "").replace(/\s+/g, "");

// ------------------------------------------------------------------------- the viewer
export class Viewer {
  // ``container``: where documents are drawn; ``request(path, as)``: a GET on this server
  // with the caller's key (as "json", "text" or "blob"); ``headers()``: that key as headers.
  constructor(container, { request, headers }) {
    this.container = container;
    this.request = request;
    this.headers = headers;
    this.pdfs = new Map(); // file id -> PDF.js document promise
    this.shown = 0; // bumped on each show: a slower, older show stops drawing
  }

  // Show ``source`` (a /chat source: file_id, format, location, text) in its document;
  // ``quote``: the sentence a quoted answer copied from it, highlighted more strongly.
  // A test for a drawing under way: true once a newer one started.
  ticket() {
    const mine = ++this.shown;
    return () => mine !== this.shown;
  }

  async show(source, quote) {
    const stale = this.ticket();
    this.container.replaceChildren(el("p", { class: "viewer-note" }, "Opening the document…"));
    if (!source.file_id) return this.showChunk(source, null);
    try {
      const view = await this.request(
        `/files/${encodeURIComponent(source.file_id)}/view${tableQuery(source)}`,
        "json",
      );
      if (stale()) return;
      if (view.kind === "pdf") await this.showPdf(source, view, quote, source.location?.page ?? 1, stale);
      else if (view.kind === "image") await this.showImage(source, view, source.location?.page ?? 1, stale);
      else if (view.kind === "table") this.showTable(source, view);
      else if (view.kind === "text") await this.showText(source, view, quote, stale);
      else this.showChunk(source, null);
    } catch (error) {
      if (!stale()) this.showChunk(source, `The document cannot be shown (${error.message}); the cited passage:`);
    }
  }

  clear() {
    this.shown++;
    this.container.replaceChildren();
  }

  // The chunk's own text, rendered: for other retrievers' sources, and when the file is gone.
  showChunk(source, note) {
    const text = source.text ?? "(the text of this chunk was not sent)";
    const shown = el("blockquote", { class: "source-text" }, render(reblock(text, SOFT_WRAPPED.has(source.format) || / {2}\n/.test(text))));
    nestHeadings(shown);
    this.container.replaceChildren(...(note ? [el("p", { class: "viewer-note" }, note), shown] : [shown]));
  }

  // ----------------------------------------------------------------------- PDF
  async pdf(fileId) {
    if (!this.pdfs.has(fileId)) {
      const loading = import(`${PDFJS}pdf.min.mjs`).then((pdfjs) => {
        pdfjs.GlobalWorkerOptions.workerSrc = `${PDFJS}pdf.worker.min.mjs`;
        const task = pdfjs.getDocument({
          url: `/files/${encodeURIComponent(fileId)}`,
          httpHeaders: this.headers(),
          cMapUrl: `${PDFJS}cmaps/`,
          standardFontDataUrl: `${PDFJS}standard_fonts/`,
          wasmUrl: `${PDFJS}wasm/`,
          iccUrl: `${PDFJS}iccs/`,
          verbosity: 0,
        });
        return task.promise.then((doc) => ({ pdfjs, doc }));
      });
      loading.catch(() => this.pdfs.delete(fileId));
      this.pdfs.set(fileId, loading);
      // A few documents stay open for going back and forth; the oldest is let go.
      while (this.pdfs.size > OPEN_PDFS) {
        const [oldest, opened] = this.pdfs.entries().next().value;
        this.pdfs.delete(oldest);
        opened.then(({ doc }) => doc.destroy()).catch(() => {});
      }
    }
    return this.pdfs.get(fileId);
  }

  async showPdf(source, view, quote, pageNumber, stale) {
    const { pdfjs, doc } = await this.pdf(source.file_id);
    if (stale()) return;
    const pages = doc.numPages;
    pageNumber = Math.min(Math.max(1, pageNumber), pages);
    const page = await doc.getPage(pageNumber);
    const natural = page.getViewport({ scale: 1 });
    const width = Math.max(200, this.container.clientWidth - 2);
    const viewport = page.getViewport({ scale: width / natural.width });
    const ratio = window.devicePixelRatio || 1;
    const canvas = el("canvas", { class: "page-image", "aria-hidden": "true" });
    canvas.width = Math.floor(viewport.width * ratio);
    canvas.height = Math.floor(viewport.height * ratio);
    canvas.style.width = `${viewport.width}px`;
    canvas.style.height = `${viewport.height}px`;
    await page.render({
      canvas,
      viewport,
      transform: ratio === 1 ? null : [ratio, 0, 0, ratio, 0, 0],
    }).promise;
    if (stale()) return;
    const frame = el("div", { class: "page-frame", role: "img", "aria-label": `Page ${pageNumber} of ${view.name}` }, canvas);
    frame.style.width = `${viewport.width}px`;
    frame.style.height = `${viewport.height}px`;
    const location = source.location ?? {};
    frame.dataset.pageWidth = String(location.page_width || natural.width);
    if (pageNumber === (location.page ?? 1)) {
      const scale = viewport.width / (location.page_width || natural.width);
      for (const box of location.boxes ?? []) frame.append(mark(box, scale, "hl"));
      if (quote) {
        const found = await quoteBoxes(pdfjs, page, viewport, quote);
        const points = viewport.width / natural.width;
        for (const box of found) frame.append(mark(box, points, "hl hl-quote"));
      }
    }
    const nav = pager(`Page ${pageNumber} of ${pages}`, pageNumber, pages, (n) =>
      this.showPdf(source, view, quote, n, this.ticket()),
    );
    this.container.replaceChildren(nav, frame);
    reveal(frame.querySelector(".hl-quote") ?? frame.querySelector(".hl"), this.container);
  }

  // ----------------------------------------------------------------------- scans
  async showImage(source, view, pageNumber, stale) {
    const pages = view.pages ?? 1;
    pageNumber = Math.min(Math.max(1, pageNumber), pages);
    const blob = await this.request(
      `/files/${encodeURIComponent(source.file_id)}/image?page=${pageNumber}`,
      "blob",
    );
    if (stale()) return;
    const url = URL.createObjectURL(blob);
    const image = el("img", { class: "page-image", alt: `Page ${pageNumber} of ${view.name}`, src: url });
    await image.decode().catch(() => {});
    if (stale()) return URL.revokeObjectURL(url);
    const frame = el("div", { class: "page-frame" }, image);
    const nav = pager(`Page ${pageNumber} of ${pages}`, pageNumber, pages, (n) =>
      this.showImage(source, view, n, this.ticket()),
    );
    this.container.replaceChildren(nav, frame);
    const [naturalWidth] = view.page_sizes?.[pageNumber - 1] ?? [image.naturalWidth];
    const scale = image.clientWidth / (naturalWidth || image.naturalWidth);
    frame.dataset.pageWidth = String(naturalWidth || image.naturalWidth);
    const location = source.location ?? {};
    if (pageNumber === (location.page ?? 1)) {
      for (const box of location.boxes ?? []) frame.append(mark(box, scale, "hl"));
    }
    image.addEventListener("load", () => URL.revokeObjectURL(url), { once: true });
    reveal(frame.querySelector(".hl"), this.container);
  }

  // ----------------------------------------------------------------------- rows
  showTable(source, view) {
    const table = view.table ?? {};
    const cited = source.location?.row ?? null;
    const rows = table.rows ?? [];
    const body = rows.map((row) =>
      el(
        "tr",
        { class: row.row === cited ? "hit" : null, "aria-current": row.row === cited ? "true" : null },
        el("th", { scope: "row" }, String(row.row)),
        row.cells.map((cell) => el("td", {}, cell)),
      ),
    );
    const first = rows[0]?.row;
    const last = rows.at(-1)?.row;
    const caption = [
      table.sheet ? `Sheet ${table.sheet}` : null,
      // Row numbers are the file's (a sheet's count its header rows); total_rows counts records.
      table.total_rows != null ? `${table.total_rows} ${table.total_rows === 1 ? "row" : "rows"}` : null,
      rows.length ? `showing rows ${first}–${last}` : "no rows",
    ].filter(Boolean).join(" · ");
    const node = el(
      "div",
      { class: "table-view" },
      el(
        "table",
        {},
        el("caption", {}, caption),
        el("thead", {}, el("tr", {}, el("th", { scope: "col" }, "Row"), (table.columns ?? []).map((c) => el("th", { scope: "col" }, c)))),
        el("tbody", {}, body),
      ),
    );
    this.container.replaceChildren(node);
    reveal(node.querySelector("tr.hit"), this.container);
  }

  // ----------------------------------------------------------------------- text
  async showText(source, view, quote, stale) {
    const location = source.location ?? {};
    const parts = view.parts ?? [];
    let text;
    if (view.format === "pptx") {
      const slides = parts.filter((p) => p.slide != null);
      const slide = location.slide ?? slides[0]?.slide ?? 1;
      const index = Math.max(0, slides.findIndex((p) => p.slide === slide));
      return this.showSlide(source, view, slides, index, quote);
    } else if (view.format === "markdown") {
      // The file itself reads best: its blank lines and wrapped paragraphs as written.
      text = stripFrontMatter(await this.request(`/files/${encodeURIComponent(source.file_id)}`, "text"));
      if (stale()) return;
    } else {
      text = parts.map((part) => reblock(part.text, SOFT_WRAPPED.has(view.format))).join("\n\n");
    }
    const doc = documentNode(text, source.text, quote, location.section);
    this.container.replaceChildren(doc);
    reveal(doc.querySelector(".hit"), this.container);
  }

  showSlide(source, view, slides, index, quote) {
    const part = slides[index];
    if (!part) return this.showChunk(source, null);
    const cited = part.slide === (source.location?.slide ?? part.slide);
    const lines = part.text.split("\n");
    if (part.title && lines[0]?.trim() === part.title.trim()) lines[0] = `### ${part.title}`;
    const doc = documentNode(reblock(lines.join("\n")), cited ? source.text : null, cited ? quote : null, null);
    const nav = pager(`Slide ${part.slide} of ${slides.length}`, index + 1, slides.length, (n) =>
      this.showSlide(source, view, slides, n - 1, quote),
      "slide",
    );
    this.container.replaceChildren(nav, el("div", { class: "slide" }, doc));
    reveal(doc.querySelector(".hit"), this.container);
  }
}

function tableQuery(source) {
  const location = source.location ?? {};
  if (location.row == null) return "";
  const query = new URLSearchParams({ row: String(location.row), around: String(ROWS_AROUND) });
  if (location.sheet) query.set("sheet", location.sheet);
  return `?${query}`;
}

function stripFrontMatter(text) {
  return text.replace(/^---\s*\n[\s\S]*?\n---\s*\n/, "");
}

// A loader's text as Markdown blocks. Loaders keep tables and lists as Markdown lines but
// drop the blank lines between blocks: Markdown and HTML sections end each block with two
// spaces (their lines within a paragraph are soft wraps); Word, slides and plain text give
// one paragraph per line.
function reblock(text, softWraps = false) {
  const out = [];
  let previous = null;
  let ended = true;
  for (const raw of String(text).split("\n")) {
    const line = raw.replace(/\s+$/, "");
    if (!line.trim()) {
      previous = null;
      continue;
    }
    const kind = /^\s*\|/.test(line)
      ? "table"
      : /^\s*(?:[-*+]|\d{1,3}[.)])\s/.test(line)
        ? "list"
        : /^#{1,6}\s/.test(line)
          ? "heading"
          : "other";
    const continues =
      kind === previous && (kind === "table" || kind === "list" || (kind === "other" && softWraps && !ended));
    if (previous !== null && !continues) out.push("");
    out.push(line);
    previous = kind;
    ended = / {2}$/.test(raw) || kind === "heading";
  }
  return out.join("\n");
}

const SOFT_WRAPPED = new Set(["markdown", "html"]);

// ------------------------------------------------------------------------- highlighting
// The units a reader sees: a block, a table row, a list item; each with the DOM element it
// becomes and its source text.
function documentNode(text, chunkText, quote, section) {
  const tokens = blocks(text);
  const links = tokens.links ?? {};
  const root = el("div", { class: "document" });
  const units = [];
  for (const token of tokens) {
    if (token.type === "space") continue;
    const fragment = renderTokens([token], links);
    const wrapper = el("div", { class: "block" });
    wrapper.append(fragment);
    nestHeadings(wrapper);
    root.append(wrapper);
    if (token.type === "table") {
      const lines = token.raw.split("\n").filter((line) => line.trim());
      const rows = wrapper.querySelectorAll("tr");
      // lines: header, rule, body rows; rows: header, body rows
      units.push({ node: rows[0], raw: lines[0], heading: false });
      lines.slice(2).forEach((line, n) => units.push({ node: rows[n + 1], raw: line }));
    } else if (token.type === "list") {
      const items = wrapper.querySelectorAll(":scope > ul > li, :scope > ol > li");
      token.items.forEach((item, n) => units.push({ node: items[n] ?? wrapper, raw: item.raw }));
    } else if (token.type !== "hr") {
      units.push({ node: wrapper, raw: token.raw, heading: token.type === "heading", depth: token.depth, text: token.text });
    }
  }
  if (chunkText) highlight(units, chunkText, section);
  if (quote) emphasise(units, quote);
  return root;
}

// A document's headings sit under the panel's own (h2): its h1 becomes h3, and so on.
function nestHeadings(root) {
  for (const heading of root.querySelectorAll("h1, h2, h3, h4, h5, h6")) {
    const level = Math.min(6, Number(heading.tagName[1]) + 2);
    const nested = document.createElement(`h${level}`);
    nested.append(...heading.childNodes);
    heading.replaceWith(nested);
  }
}

// Marks the run of units the chunk covers: from the unit it starts in to the one it ends in,
// searched from its section's heading when known.
function highlight(units, chunkText, section) {
  const chunk = flat(chunkText);
  if (!chunk) return;
  const head = chunk.slice(0, HEAD_CHARS);
  const tail = chunk.slice(-HEAD_CHARS);
  let from = 0;
  const heading = section ? section.split(" > ").at(-1).trim() : null;
  if (heading) {
    const at = units.findIndex((u) => u.heading && flat(u.text) === flat(heading));
    if (at >= 0) from = at;
  }
  const starts = (u) => {
    const f = flat(u.raw);
    return f.length > 1 && (chunk.startsWith(f) || f.includes(head));
  };
  let start = units.findIndex((u, n) => n >= from && starts(u));
  if (start < 0) start = units.findIndex(starts);
  if (start < 0) return;
  for (let n = start; n < units.length; n++) {
    const f = flat(units[n].raw);
    if (n > start && !chunk.includes(f) && !f.includes(tail)) break;
    units[n].node.classList.add("hit");
    if (f.includes(tail)) break;
  }
}

// Marks the units the quoted sentence (or table row) was copied from, more strongly.
function emphasise(units, quote) {
  const lines = quote
    .split("\n")
    .map((line) => flat(line.replace(/^\s*[-*+]\s+/, "").replace(/\*\*/g, "")))
    .filter((line) => line.length >= 8 && !/^\|?[-:|]+\|?$/.test(line));
  for (const unit of units) {
    const f = flat(unit.raw).replace(/\*\*/g, "");
    if (!unit.node.classList.contains("hit")) continue;
    if (lines.some((line) => f.includes(line) || (line.length > 20 && line.includes(f) && f.length > 8))) {
      unit.node.classList.add("quote");
    }
  }
}

// The boxes of ``quote`` on a PDF page, from its text layer (none on a scan).
async function quoteBoxes(pdfjs, page, viewport, quote) {
  const content = await page.getTextContent();
  const owner = []; // per character of ``text``: [item, character within it]
  let text = "";
  content.items.forEach((item, i) => {
    for (let c = 0; c < (item.str ?? "").length; c++) {
      if (/\s/.test(item.str[c])) continue;
      text += item.str[c];
      owner.push([i, c]);
    }
  });
  const wanted = flat(
    quote
      .replace(/\[[^\]\n]{1,300}\]/g, "")
      .replace(/^\s*[-*+]\s+/gm, "")
      .replace(/\*\*/g, ""),
  );
  if (wanted.length < 8) return [];
  let at = text.indexOf(wanted);
  let length = wanted.length;
  if (at < 0) {
    // The quote may end past the page, or hold a line the text layer has otherwise:
    // its first sixty characters place it.
    length = Math.min(60, wanted.length);
    at = text.indexOf(wanted.slice(0, length));
  }
  if (at < 0) return [];
  const spans = new Map(); // item -> [first, last] character
  for (const [item, c] of owner.slice(at, at + length)) {
    const span = spans.get(item);
    spans.set(item, span ? [Math.min(span[0], c), Math.max(span[1], c)] : [c, c]);
  }
  const boxes = [];
  for (const [i, [first, last]] of spans) {
    const item = content.items[i];
    const [, , c, d, e, f] = pdfjs.Util.transform(viewport.transform, item.transform);
    const size = Math.hypot(c, d);
    const width = item.width * viewport.scale;
    const chars = item.str.length || 1;
    const x0 = e + (width * first) / chars;
    const x1 = e + (width * (last + 1)) / chars;
    // In PDF points, as the recorded boxes are.
    const box = [x0, f - size, x1, f + size * 0.25].map((v) => v / viewport.scale);
    boxes.push(box);
  }
  return boxes;
}

// ------------------------------------------------------------------------- pieces
function mark([x0, top, x1, bottom], scale, kind) {
  const pad = 2;
  const node = el("div", { class: kind, "data-box": [x0, top, x1, bottom].map((v) => v.toFixed(1)).join(",") });
  node.style.left = `${x0 * scale - pad}px`;
  node.style.top = `${top * scale - pad}px`;
  node.style.width = `${(x1 - x0) * scale + 2 * pad}px`;
  node.style.height = `${(bottom - top) * scale + 2 * pad}px`;
  return node;
}

function pager(label, current, count, go, noun = "page") {
  return el(
    "div",
    { class: "pager", role: "group", "aria-label": `${noun[0].toUpperCase()}${noun.slice(1)}s` },
    el("button", { type: "button", disabled: current <= 1, onclick: () => go(current - 1) }, `Previous ${noun}`),
    el("span", { class: "pager-label", "aria-live": "polite" }, label),
    el("button", { type: "button", disabled: current >= count, onclick: () => go(current + 1) }, `Next ${noun}`),
  );
}

// Scrolls the panel so ``node`` is in view, a little below its top.
function reveal(node, container) {
  if (!node) return;
  const panel = container.closest(".source-panel") ?? container;
  const top = node.getBoundingClientRect().top - panel.getBoundingClientRect().top + panel.scrollTop;
  panel.scrollTop = Math.max(0, top - panel.clientHeight / 3);
}
