// The chat page: POST /ask with stream=true and render its Server-Sent Events as they arrive:
// `sources` (numbered passages), `token` (text deltas), `done` (timings) or `error`.
// Turns stack into a conversation: each question after the first carries the `conversation_id` the
// first answer named, so the server puts the earlier turns in the prompt. "New chat" starts over;
// "Recent conversations" reopens a stored one (GET /conversations, GET /conversations/{id}). Without a
// key the server lists nobody's conversations (every keyless caller would see the others'): the page
// remembers the ids it started and lists those (GET /conversations?ids=…).

import { api, apiKey, authHeaders, el, errorMessage, fmtMs, fmtPct, readSSE, setSessionKey, watchReadiness }
  from "./api.js";
import { markUnsupported, renderInto, StreamRenderer } from "./render.js";

const $ = (id) => document.getElementById(id);

const MAX_REPEAT_CHARS = 160; // of the withheld repeat shown in the note (a loop of code lines can be long)

// Why an answer ended when it did not end by itself, as the note's parts (null: it did). A stop is never
// silent: an answer cut off or stopped mid-way otherwise looks like one that ended mid-sentence.
function finishNote(result) {
  switch (result.finish_reason) {
    case "length":
      return [`answer cut off at ${result.usage.completion_tokens} tokens`
        + " (ask again with a higher Max tokens for more)"];
    case "repetition": {
      const line = result.repeated_line ? result.repeated_line.text : "";
      if (!line) return ["stopped: the answer started repeating itself"];
      const shown = line.length > MAX_REPEAT_CHARS ? `${line.slice(0, MAX_REPEAT_CHARS)}…` : line;
      return ["stopped: the answer started repeating: «", el("span", { class: "repeat" }, shown), "»"];
    }
    case "cancelled":
      return ["stopped: the server stopped before the answer was done"];
    default:
      return null;
  }
}

const form = $("ask-form");
const question = $("question");
const mode = $("mode");
const ratio = $("ratio");
const ratioOut = $("ratio-out");
const ratioWrap = $("ratio-wrap");
const topK = $("top-k");
const maxTokens = $("max-tokens");
const thread = $("thread");
const button = $("ask-btn");
const dialog = $("passage");
const recent = $("recent");
const recentList = $("recent-list");
const convLabel = $("conv-label");

let conversationId = null; // the conversation the next question continues (null: a new one)
let numTurns = 0;

const STARTED_STORAGE = "blendrag.startedConversations";
const MAX_STARTED = 100;

function startedConversations() {
  try {
    const ids = JSON.parse(localStorage.getItem(STARTED_STORAGE) || "[]");
    return Array.isArray(ids) ? ids.filter((id) => typeof id === "string") : [];
  } catch {
    return [];
  }
}

function rememberStarted(id) {
  const ids = [id, ...startedConversations().filter((x) => x !== id)].slice(0, MAX_STARTED);
  localStorage.setItem(STARTED_STORAGE, JSON.stringify(ids));
}

function setConversation(id, title) {
  conversationId = id;
  thread.dataset.conversation = id || "";
  convLabel.textContent = id ? (title ? `“${title}”` : "") : "";
  convLabel.title = id ? `conversation ${id}` : "";
  if (id) history.replaceState(null, "", `#c=${encodeURIComponent(id)}`);
  else history.replaceState(null, "", location.pathname);
}

function showEmpty() {
  thread.replaceChildren(el("div", { class: "empty", id: "empty" },
    el("h1", {}, "Ask your documents"),
    el("p", {}, "Answers start fast: every passage was read by the model when it was ingested, and its "
      + "cached state is blended in at question time. Follow-up questions continue the conversation.")));
}

function newChat() {
  setConversation(null);
  numTurns = 0;
  showEmpty();
  question.focus();
}

function syncControls() {
  ratioOut.value = fmtPct(Number(ratio.value));
  // Only blend has a recompute ratio; the other modes fix it (full = 1, prefix/reuse = 0).
  ratioWrap.hidden = mode.value !== "blend";
}

function openPassage(source) {
  $("passage-title").textContent = `[${source.rank}] ${source.title}${source.section && source.section !== source.title ? ` · ${source.section}` : ""}`;
  const meta = [];
  if (source.page) meta.push(`p. ${source.page}`);
  // A reopened conversation's sources are references only (no score, no text).
  if (source.score !== undefined) meta.push(`score ${source.score.toFixed(3)}`);
  meta.push(`chunk ${source.chunk_id}`);
  $("passage-meta").textContent = meta.join(" · ");
  const body = $("passage-text");
  const text = source.text || source.snippet || "The passage text is not stored with the conversation.";
  body.textContent = text;
  dialog.showModal();
  // A passage may start inside a code block its chunk does not show opening: rendered as its document reads.
  renderInto(body, text, [], undefined, { passage: true });
}

const NOTICES = {
  "nothing ingested yet": "Nothing ingested yet",
  "no documents match": "No documents match",
  "the documents do not cover this question": "Your documents do not cover this question",
};

// The answer with " [n]" after each sentence the server attributed to source n (before its closing
// punctuation), unless the model already cited it there.
export function withCitationMarks(answer, citations) {
  let out = "";
  let position = 0;
  for (const c of [...citations].sort((a, b) => a.end - b.end)) {
    const sentence = answer.slice(c.start, c.end);
    if (sentence.includes(`[${c.rank}]`)) continue;
    const punct = /[.!?]+["')\]]*$/.exec(sentence);
    const at = punct ? c.end - punct[0].length : c.end;
    out += answer.slice(position, at) + ` [${c.rank}]`;
    position = at;
  }
  return out + answer.slice(position);
}

// One question and its answer, updated as events arrive.
class Turn {
  constructor(text, number) {
    this.sources = [];
    this.finished = false;
    this.answer = el("div", { class: "answer streaming", "data-testid": "answer" },
      el("span", { class: "waiting" }, "Retrieving passages…"));
    this.sourceList = el("ol", { class: "sources", hidden: true, "data-testid": "sources" });
    this.stats = el("div", { class: "stats", hidden: true, "data-testid": "stats" });
    this.root = el("article", { class: "panel turn", "data-state": "streaming", "data-testid": "turn" },
      el("div", { class: "question" }, number > 1 ? el("span", { class: "n" }, `#${number}`) : null, text),
      this.answer, this.sourceList, this.stats);
    this.text = "";
    this.numDeltas = 0;
    this.renderer = new StreamRenderer(this.answer);
  }

  setSources(sources, notice) {
    this.sources = sources;
    this.sourcesNotice = notice || ""; // shown in the source list; `done` repeats it in its own notice
    this.sourceList.replaceChildren(el("li", { class: "label" }, sources.length
      ? `Sources (${sources.length})` : el("span", { class: "notice", "data-testid": "notice" },
        `${NOTICES[notice] || "No documents match"}: the answer comes from the model alone, not from your documents`)));
    for (const s of sources) {
      const page = s.page ? ` · p. ${s.page}` : "";
      // A reopened conversation's sources carry no text or score: shown, not opened.
      const stored = s.score === undefined;
      this.sourceList.append(el("li", {},
        el("button", { class: "source", type: "button", title: s.snippet || s.title, "data-rank": s.rank,
                       disabled: stored, onclick: stored ? null : () => openPassage(s) },
          el("span", { class: "n" }, `[${s.rank}]`), el("span", { class: "t" }, s.title + page),
          // The heading the passage sits under: three passages of one page are told apart by it (a page's
          // opening heading is usually its title already).
          s.section && s.section !== s.title ? el("span", { class: "sec", "data-testid": "section" }, s.section) : null,
          stored ? null : el("span", { class: "s" }, s.score.toFixed(2)))));
    }
    this.sourceList.hidden = false;
    if (!this.text) {
      this.answer.replaceChildren(el("span", { class: "waiting" },
        sources.length ? `Blending ${sources.length} cached passage${sources.length > 1 ? "s" : ""}…`
          : "Thinking…"));
    }
  }

  addText(delta) {
    this.text += delta;
    if (!this.answer.classList.contains("markdown")) this.answer.textContent = this.text;
    this.renderer.update(this.text);
    this.numDeltas += 1;
    this.root.dataset.deltas = String(this.numDeltas); // how many token events arrived (tests read it)
  }

  // The final answer as Markdown, with [n] citations turned into buttons that open the passage.
  async renderAnswer(text) {
    this.renderer.close();
    await renderInto(this.answer, text, this.sources, openPassage);
    this.root.dataset.rendered = "true";
  }

  // The done event's notice above the answer, where it is read first (e.g. that most of the code names it
  // writes are in no source: likely invented). The sources' own notice, which the done's begins with, is
  // already shown in the source list.
  showNotice(notice) {
    let text = notice || "";
    if (this.sourcesNotice && text.startsWith(this.sourcesNotice)) {
      text = text.slice(this.sourcesNotice.length).replace(/^; /, "");
    }
    if (!text) return;
    this.answer.before(el("div", { class: "answer-notice", role: "note", "data-testid": "answer-notice" }, text));
  }

  done(result) {
    this.finished = true;
    this.answer.classList.remove("streaming");
    const answer = withCitationMarks(result.answer || this.text, result.citations || []);
    const unsupported = [...new Set((result.unsupported_identifiers || []).map((u) => u.identifier))];
    this.renderAnswer(answer).then(() => {
      if (!answer) this.answer.append(el("span", { class: "muted" }, "(empty answer)"));
      this.showNotice(result.notice);
      if (unsupported.length) {
        // Names the model wrote that no source holds: likely invented, so never shown as if sourced.
        markUnsupported(this.answer, unsupported);
        this.answer.after(el("div", { class: "unsupported-note", "data-testid": "unsupported" },
          "Not in any source (may be invented): ",
          ...unsupported.flatMap((n, i) => [i ? ", " : "", el("code", {}, n)])));
      }
      const note = finishNote(result);
      if (note) {
        // Beside the answer, not in it: the answer element holds the model's text alone.
        this.answer.after(el("div", { class: "muted finish-note", "data-testid": "finish-note",
                                      "data-reason": result.finish_reason }, ...note));
      }
      // The rendered answer can be taller than the streamed text: keep the timing line above the composer.
      if (this.root === thread.lastElementChild) revealEnd(this);
    });
    const t = result.timings;
    const items = [el("span", { "data-k": "ttft" }, "TTFT ", el("b", {}, fmtMs(t.ttft_ms)))];
    if (t.full_prefill_estimate_ms !== null && t.full_prefill_estimate_ms !== undefined && result.mode !== "full") {
      // A full prefill would pay retrieval plus the plain prefill of the whole prompt, without KV loading.
      const fullTtft = t.retrieval_ms + t.full_prefill_estimate_ms;
      const saved = fullTtft - t.ttft_ms;
      const what = result.mode === "blend" ? "blending" : `${result.mode} mode`;
      items.push(saved > 0
        ? el("span", { class: "saved", "data-k": "saved" }, `${what} saved `, el("b", {}, `~${fmtMs(saved)}`),
          ` vs full prefill (est. ${fmtMs(fullTtft)})`)
        : el("span", { "data-k": "saved" }, `no time saved vs full prefill (est. ${fmtMs(fullTtft)})`));
    }
    items.push(el("span", { "data-k": "mode" }, "mode ", el("b", {}, result.mode),
      result.mode === "blend" ? ` (${result.selector}) · recompute ${fmtPct(result.recompute_ratio, 1)}` : ""));
    items.push(el("span", { "data-k": "kv" }, "KV ", el("b", {}, result.kv_hits), " hit / ",
      el("b", {}, result.kv_misses), " miss"));
    items.push(el("span", {}, "tokens ", el("b", {}, result.usage.prompt_tokens), " in / ",
      el("b", {}, result.usage.completion_tokens), " out"));
    if (t.decode_tokens_per_s !== null && t.decode_tokens_per_s !== undefined) {
      // The answer's decode alone (tokens after the first ÷ the time after it): the speed it was written at.
      items.push(el("span", { "data-k": "decode", title: "decode: tokens after the first ÷ their time" },
        el("b", {}, t.decode_tokens_per_s.toFixed(1)), " tokens/s"));
    }
    const historyTokens = result.usage.history_tokens || 0;
    if (historyTokens > 0) {
      items.push(el("span", { "data-k": "history" }, "history ", el("b", {}, historyTokens), " tok, ",
        el("b", {}, result.usage.history_reused_tokens || 0), " reused"));
    }
    if (result.history_dropped_turns > 0) {
      items.push(el("span", { "data-k": "dropped" }, `${result.history_dropped_turns} oldest turn`
        + `${result.history_dropped_turns > 1 ? "s" : ""} left out (history budget)`));
    }
    items.push(el("span", {}, "total ", el("b", {}, fmtMs(t.total_ms))));
    this.stats.replaceChildren(...items);
    this.stats.hidden = false;
    this.root.dataset.state = "done";
  }

  fail(message) {
    this.finished = true;
    this.renderer.close();
    this.answer.classList.remove("streaming");
    if (!this.text) this.answer.replaceChildren();
    this.answer.append(el("div", { class: "error-text", "data-testid": "error" }, message));
    this.root.dataset.state = "error";
  }
}

async function ask(text, turn) {
  const body = { question: text, mode: mode.value, stream: true };
  if (mode.value === "blend") body.recompute_ratio = Number(ratio.value);
  if (topK.value) body.top_k = Number(topK.value);
  if (maxTokens.value) body.max_tokens = Number(maxTokens.value); // empty: the server's engine.max_new_tokens
  body.conversation_id = conversationId || "new"; // the chat page keeps its conversations
  let response;
  try {
    response = await fetch("/ask", {
      method: "POST",
      headers: authHeaders({ "Content-Type": "application/json", Accept: "text/event-stream" }),
      body: JSON.stringify(body),
    });
  } catch (err) {
    turn.fail(`Could not reach the server: ${err.message}`);
    return;
  }
  if (!response.ok) {
    if (response.status === 401) {
      askForKey();
      turn.fail("This server needs a key to answer: enter it above, then ask again.");
      return;
    }
    turn.fail(await errorMessage(response));
    return;
  }
  try {
    for await (const { event, data } of readSSE(response)) {
      if (event === "sources") turn.setSources(data.sources, data.notice);
      else if (event === "token") turn.addText(data.text);
      else if (event === "done") {
        turn.done(data);
        if (data.conversation_id && data.conversation_id !== conversationId) {
          if (!conversationId) rememberStarted(data.conversation_id);
          setConversation(data.conversation_id, conversationId ? null : text);
        }
      }
      else if (event === "error") turn.fail(data.message);
    }
  } catch (err) {
    turn.fail(`The answer stream broke: ${err.message}`);
    return;
  }
  if (!turn.finished) turn.fail("The answer stream ended early.");
}

// The composer sticks to the bottom of the window: scroll so that the end of a turn (its last sources
// and the timing line) sits just above it, not underneath.
function revealEnd(turn) {
  const visibleBottom = window.innerHeight - form.getBoundingClientRect().height;
  const overlap = turn.root.getBoundingClientRect().bottom - visibleBottom;
  if (overlap > 0) window.scrollBy({ top: overlap + 12, behavior: "smooth" });
}

// Start from the server's own defaults (top-k, mode, recompute ratio), not numbers baked into the page.
async function loadDefaults() {
  try {
    const defaults = await api("/api/defaults");
    topK.value = String(defaults.top_k);
    topK.placeholder = String(defaults.top_k);
    maxTokens.placeholder = String(defaults.max_tokens); // left empty: an answer gets the server's cap
    mode.value = defaults.mode;
    ratio.value = String(defaults.recompute_ratio);
    syncControls();
    form.dataset.defaults = "server";
  } catch (err) {
    if (err.status === 401) askForKey();
    form.dataset.defaults = "page"; // unreachable server: the fields stay empty, /ask fills them in
  }
}

// ---- the key, when the server wants one ---------------------------------------------------------------

// A 401 while a key is set means the server refused that key: say so (and forget it), rather than
// showing the empty key field again as if none had been entered.
function askForKey() {
  const refused = $("key-refused");
  if (apiKey()) {
    setSessionKey("");
    refused.textContent = "The server refused this key: check it and enter it again.";
    refused.hidden = false;
  }
  $("keybar").hidden = false;
  $("api-key").focus();
}

$("key-save").addEventListener("click", () => {
  const key = $("api-key").value.trim();
  if (!key) return;
  setSessionKey(key); // this tab only: closing it forgets the key
  $("api-key").value = "";
  $("key-refused").hidden = true;
  $("keybar").hidden = true;
  loadDefaults();
  loadRecent();
});

// ---- recent conversations ---------------------------------------------------------------------------

function ago(iso) {
  const s = (Date.now() - Date.parse(iso)) / 1000;
  if (!(s >= 0)) return "";
  if (s < 60) return "just now";
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return new Date(iso).toLocaleDateString();
}

async function loadRecent() {
  let page;
  const started = startedConversations();
  if (!apiKey() && !started.length) {
    recentList.replaceChildren(el("li", { class: "muted" }, "No conversations yet"));
    return;
  }
  const ids = apiKey() ? "" : `&ids=${encodeURIComponent(started.join(","))}`;
  try {
    page = await api(`/conversations?limit=20${ids}`);
  } catch (err) {
    if (err.status === 401) askForKey();
    recentList.replaceChildren(el("li", { class: "muted" }, err.status === 401 ? "A key is needed"
      : `Could not load: ${err.message}`));
    return;
  }
  if (!page.conversations.length) {
    recentList.replaceChildren(el("li", { class: "muted" }, "No conversations yet"));
    return;
  }
  recentList.replaceChildren(...page.conversations.map((c) => el("li", {},
    el("button", { type: "button", "data-id": c.id, "aria-current": c.id === conversationId ? "true" : null,
                   onclick: () => { recent.open = false; reopen(c.id); } },
      el("span", { class: "t" }, c.title),
      el("span", { class: "m" }, `${c.num_turns} turn${c.num_turns === 1 ? "" : "s"} · ${ago(c.updated_at)}`)))));
}

// Show a stored conversation's turns (answers, sources and timing lines) and continue it.
async function reopen(id) {
  let conv;
  try {
    conv = await api(`/conversations/${encodeURIComponent(id)}`);
  } catch (err) {
    if (err.status === 404) {
      newChat();
      return;
    }
    const failed = new Turn("", 1);
    thread.replaceChildren(failed.root);
    failed.fail(`Could not open the conversation: ${err.message}`);
    return;
  }
  thread.replaceChildren();
  numTurns = 0;
  for (const stored of conv.turns) {
    numTurns += 1;
    const turn = new Turn(stored.question, numTurns);
    thread.append(turn.root);
    turn.setSources(stored.sources);
    turn.done({
      answer: stored.answer,
      mode: stored.mode,
      selector: stored.selector,
      recompute_ratio: stored.recompute_ratio,
      timings: { full_prefill_estimate_ms: null, ...stored.timings },
      usage: { prompt_tokens: 0, completion_tokens: 0, ...stored.usage },
      kv_hits: stored.usage.kv_hits ?? 0,
      kv_misses: stored.usage.kv_misses ?? 0,
      history_dropped_turns: 0,
    });
  }
  setConversation(conv.id, conv.title);
  revealEnd({ root: thread.lastElementChild || thread });
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const text = question.value.trim();
  if (!text || button.disabled) return;
  $("empty")?.remove();
  numTurns += 1;
  const turn = new Turn(text, numTurns);
  thread.append(turn.root);
  revealEnd(turn);
  question.value = "";
  button.disabled = true;
  try {
    await ask(text, turn);
  } finally {
    button.disabled = false;
    question.focus({ preventScroll: true });
    revealEnd(turn);
  }
});

question.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    form.requestSubmit();
  }
});
mode.addEventListener("change", syncControls);
ratio.addEventListener("input", syncControls);
$("passage-close").addEventListener("click", () => dialog.close());
$("new-chat").addEventListener("click", newChat);
recent.addEventListener("toggle", () => {
  if (recent.open) loadRecent();
});
document.addEventListener("click", (event) => {
  if (recent.open && !recent.contains(event.target)) recent.open = false;
});
dialog.addEventListener("click", (event) => {
  if (event.target === dialog) dialog.close(); // a click on the backdrop
});

syncControls();
loadDefaults();
const fromHash = /^#c=(.+)$/.exec(location.hash);
if (fromHash) reopen(decodeURIComponent(fromHash[1]));
watchReadiness($("server-status"));
question.focus();
