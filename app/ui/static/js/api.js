// Shared helpers for the blendrag pages: API calls (with the optional API key), an SSE reader for
// fetch() bodies (EventSource cannot POST or send headers), and number formatting.

const KEY_STORAGE = "blendrag.apiKey";

// The chat page keeps the key it asks for (a collection key, typically) for this tab's session only;
// the admin page remembers the admin key across sessions. A session key wins while the tab lives.
export function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || localStorage.getItem(KEY_STORAGE) || "";
}

export function setSessionKey(key) {
  if (key) sessionStorage.setItem(KEY_STORAGE, key);
  else sessionStorage.removeItem(KEY_STORAGE);
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

export function authHeaders(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function errorMessage(response) {
  try {
    const body = await response.json();
    if (typeof body.detail === "string") return body.detail;
    if (body.error && body.error.message) return body.error.message;
    return JSON.stringify(body);
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

// fetch + JSON with the API key; throws ApiError with the server's message on a non-2xx answer.
export async function api(path, { method = "GET", json, body, headers = {}, signal } = {}) {
  const init = { method, headers: authHeaders(headers), signal };
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers["Content-Type"] = "application/json";
  } else if (body !== undefined) {
    init.body = body;
  }
  const response = await fetch(path, init);
  if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
  if (response.status === 204) return null;
  return response.json();
}

// Yields {event, data} for each Server-Sent Event of a fetch() response; `data` is parsed JSON when it
// can be. Comment lines (keep-alives) are skipped.
export async function* readSSE(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const parsed = parseBlock(block);
        if (parsed) yield parsed;
      }
    }
  } finally {
    reader.releaseLock();
  }
}

function parseBlock(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  const text = data.join("\n");
  try {
    return { event, data: JSON.parse(text) };
  } catch {
    return { event, data: text };
  }
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "–";
  if (Math.abs(ms) >= 10000) return `${(ms / 1000).toFixed(1)} s`;
  if (Math.abs(ms) >= 1000) return `${(ms / 1000).toFixed(2)} s`;
  return `${Math.round(ms)} ms`;
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${v >= 100 || i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

export function fmtPct(x, digits = 0) {
  if (x === null || x === undefined) return "–";
  return `${(x * 100).toFixed(digits)}%`;
}

// Tiny element builder: el("div", {class: "x", onclick: f}, child, "text", …)
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Marks the server status in the top bar: ready, loading or failed (polls /ready until ready).
export async function watchReadiness(target, onReady) {
  for (;;) {
    let state = "down";
    let detail = "server unreachable";
    try {
      const response = await fetch("/ready");
      const body = await response.json();
      state = body.status;
      detail = body.error || body.status;
    } catch {
      /* keep "down" */
    }
    const cls = state === "ready" ? "ok" : state === "loading" ? "warn" : "bad";
    target.replaceChildren(el("span", { class: `dot ${cls}` }), state === "ready" ? "ready" : detail);
    if (state === "ready") {
      if (onReady) onReady();
      return;
    }
    if (state === "failed") return;
    await new Promise((resolve) => setTimeout(resolve, 1500));
  }
}
