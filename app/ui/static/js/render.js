// Markdown for answers and passages, rendered by the server (POST /api/render: markdown-it with raw HTML
// off, then the nh3 sanitizer), so nothing a document or the model writes can run in this page.

import { api } from "./api.js";

// `passage`: a passage cut from a document, which may start inside a code block (the server reopens it).
async function renderHtml(text, passage = false) {
  const { html } = await api("/api/render", { method: "POST", json: { text, passage } });
  return html;
}

// [n] marks outside code become buttons that open source n.
function linkCitations(root, sources, onCite) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) => (node.parentElement.closest("code, pre, a") ? NodeFilter.FILTER_REJECT
      : /\[\d+\]/.test(node.nodeValue) ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_SKIP),
  });
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  for (const node of nodes) {
    const parts = node.nodeValue.split(/(\[\d+\])/);
    const fragment = document.createDocumentFragment();
    for (const part of parts) {
      const match = /^\[(\d+)\]$/.exec(part);
      const source = match && sources.find((s) => s.rank === Number(match[1]));
      if (source) {
        const button = document.createElement("button");
        Object.assign(button, { className: "cite", type: "button", title: source.title, textContent: part });
        button.addEventListener("click", () => onCite(source));
        fragment.append(button);
      } else if (part) {
        fragment.append(part);
      }
    }
    node.replaceWith(fragment);
  }
}

// Each whole-name occurrence of `names` outside code blocks (inline code included: identifiers are often
// backticked) is wrapped in <mark class="unsupported">: the server found it in none of the sources.
export function markUnsupported(root, names) {
  if (!names.length) return;
  const escaped = [...new Set(names)].sort((a, b) => b.length - a.length)
    .map((n) => n.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const pattern = new RegExp(`(?<![\\w.])(${escaped.join("|")})(?![\\w])`, "g");
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) => (node.parentElement.closest("pre, mark") ? NodeFilter.FILTER_REJECT
      : NodeFilter.FILTER_ACCEPT),
  });
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  for (const node of nodes) {
    const parts = node.nodeValue.split(pattern);
    if (parts.length === 1) continue;
    const fragment = document.createDocumentFragment();
    // split() with one capture group: odd indices are the names.
    parts.forEach((part, i) => {
      if (i % 2) {
        fragment.append(Object.assign(document.createElement("mark"), {
          className: "unsupported", textContent: part, title: "None of the sources contains this name",
        }));
      } else if (part) {
        fragment.append(part);
      }
    });
    node.replaceWith(fragment);
  }
}

// Renders `text` into `target` (replacing what is there), then links [n] citations to `sources`.
// `passage`: `text` is a source passage (see renderHtml).
export async function renderInto(target, text, sources = [], onCite = () => {}, { passage = false } = {}) {
  let html;
  try {
    html = await renderHtml(text, passage);
  } catch {
    target.textContent = text; // the server cannot render: plain text is still right
    return;
  }
  target.innerHTML = html; // sanitized by the server's allow-list (see app/services/render.py)
  target.classList.add("markdown");
  if (sources.length) linkCitations(target, sources, onCite);
}

// While an answer streams: render the text so far at most every `intervalMs`, newest text wins, and a
// reply that arrives after a newer one started is dropped.
export class StreamRenderer {
  constructor(target, intervalMs = 200) {
    this.target = target;
    this.intervalMs = intervalMs;
    this.pending = null;
    this.timer = null;
    this.generation = 0;
    this.closed = false;
  }

  update(text) {
    if (this.closed) return;
    this.pending = text;
    if (this.timer === null) this.timer = setTimeout(() => this.flush(), this.intervalMs);
  }

  async flush() {
    this.timer = null;
    if (this.closed || this.pending === null) return;
    const text = this.pending;
    this.pending = null;
    const generation = ++this.generation;
    let html;
    try {
      html = await renderHtml(text);
    } catch {
      return;
    }
    if (!this.closed && generation === this.generation) {
      this.target.innerHTML = html;
      this.target.classList.add("markdown");
    }
  }

  // Stop for good (the final render takes over).
  close() {
    this.closed = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }
}
