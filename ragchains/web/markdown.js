// Markdown as the page shows it: answers and documents rendered by marked (GFM), never with
// raw HTML from the text (it is shown as text), then sanitised by DOMPurify. No image is
// loaded (a Markdown image could call another origin), and links open in a new tab.

import { Marked } from "/ui/vendor/marked/marked.esm.js";
import DOMPurify from "/ui/vendor/dompurify/purify.es.mjs";

const escapeHtml = (text) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

const markdown = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // Raw HTML in a document or an answer is text to read, not markup to run.
    html: ({ text }) => escapeHtml(text),
    image: ({ text }) => escapeHtml(text ? `[image: ${text}]` : "[image]"),
  },
});

const PURIFY = {
  USE_PROFILES: { html: true }, // no SVG, no MathML
  FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select", "iframe", "video", "audio", "source", "picture"],
  FORBID_ATTR: ["style", "srcset"],
  RETURN_DOM_FRAGMENT: true,
};

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

// The tokens of ``text`` (block level), each keeping its source in ``raw``.
export function blocks(text) {
  return markdown.lexer(text);
}

// Sanitised DOM of some tokens of one lexed text.
export function renderTokens(tokens, links = {}) {
  const list = Object.assign([...tokens], { links });
  return DOMPurify.sanitize(markdown.parser(list), PURIFY);
}

// Sanitised DOM of a Markdown text.
export function render(text) {
  return DOMPurify.sanitize(markdown.parse(text), PURIFY);
}

// Text compared across formats: whitespace collapsed (line breaks, hard-break spaces, the
// padding of table cells), case kept.
export function squash(text) {
  return String(text ?? "").replace(/\s+/g, " ").trim();
}
