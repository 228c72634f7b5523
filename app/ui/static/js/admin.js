// The admin page: documents with live ingest progress, upload, delete, KV coverage, tier stats and a
// plot of recent TTFT by mode. Refreshes every few seconds; ingest jobs stream their progress (SSE).

import { ApiError, api, authHeaders, el, errorMessage, fmtBytes, fmtPct, readSSE, setApiKey,
  watchReadiness } from "./api.js";
import { drawTtftChart } from "./chart.js";

const $ = (id) => document.getElementById(id);
// Coverage is computed over every chunk, so poll briskly only while something is being ingested.
const REFRESH_BUSY_MS = 2000;
const REFRESH_IDLE_MS = 10000;
const PAGE_SIZE = 20;
const STAGES = ["parse", "chunk", "embed", "kv", "commit"];
const STAGE_NAMES = { parse: "Parsing", chunk: "Chunking", embed: "Embedding", kv: "Precomputing KV cache",
  commit: "Committing" };
// A running job's stage after its own stages: its duplicates wait for the outcome of their originals.
const WAITING = "waiting";
const MAX_JOB_CARDS = 6;

let offset = 0;
let refreshTimer = null;
let lastStats = null;
const watchedJobs = new Map(); // job id -> card element

// ---- errors and the API key ------------------------------------------------------------------

function showError(message) {
  const banner = $("admin-error");
  banner.textContent = message;
  banner.hidden = !message;
}

function handleError(err) {
  if (err instanceof ApiError && err.status === 401) {
    $("keybar").hidden = false;
    showError("");
    return;
  }
  if (err instanceof ApiError && err.status === 503) {
    showError(`Server not ready: ${err.message}`);
    return;
  }
  showError(err.message || String(err));
}

$("key-save").addEventListener("click", () => {
  setApiKey($("api-key").value.trim());
  $("keybar").hidden = true;
  refresh();
});

// ---- cards -------------------------------------------------------------------------------------

function covBar(fresh, stale, missing, big = false) {
  const total = fresh + stale + missing;
  const bar = el("div", { class: `covbar${big ? " big" : ""}`, title:
    `${fresh} fresh · ${stale} stale · ${missing} missing` });
  if (!total) return bar;
  for (const [cls, n] of [["fresh", fresh], ["stale", stale], ["missing", missing]]) {
    if (n) bar.append(el("span", { class: cls, style: `width:${(100 * n) / total}%` }));
  }
  return bar;
}

function renderCards(coverage, stats) {
  // Every document counts, as in the table below; the detail says how many of them are ready.
  const byStatus = stats.documents_by_status;
  const total = Object.values(byStatus).reduce((a, b) => a + b, 0);
  $("card-docs").textContent = total;
  $("card-docs-detail").textContent =
    `${byStatus.ready ?? 0} ready · ${byStatus.pending ?? 0} ingesting · ${byStatus.failed ?? 0} failed`;
  $("purge-failed").hidden = !byStatus.failed;

  const hasChunks = coverage.chunks_total > 0;
  $("card-coverage").textContent = hasChunks ? fmtPct(coverage.coverage, coverage.coverage < 1 ? 1 : 0) : "–";
  $("card-coverage-bar").replaceWith(Object.assign(
    covBar(coverage.chunks_fresh, coverage.chunks_stale, coverage.chunks_missing, true), { id: "card-coverage-bar" }));
  $("card-coverage-detail").textContent = hasChunks
    ? `${coverage.chunks_fresh} fresh · ${coverage.chunks_stale} stale · ${coverage.chunks_missing} missing of ${coverage.chunks_total} chunks`
    : "no chunks yet";

  const tiers = $("card-tiers");
  tiers.replaceChildren(el("tr", {}, el("td", { class: "muted" }, "tier"), el("td", { class: "muted" }, "stored"),
    el("td", { class: "muted" }, "hit rate")));
  for (const t of stats.kv_tiers) {
    tiers.append(el("tr", { "data-tier": t.name }, el("td", {}, t.name, t.available ? "" : " (down)"),
      el("td", {}, `${fmtBytes(t.num_bytes)} · ${t.num_entries}`), el("td", {}, fmtPct(t.hit_rate, 1))));
  }
  const fresh = Object.entries(coverage.bytes_by_tier).map(([tier, n]) => `${tier} ${fmtBytes(n)}`);
  $("card-tiers-detail").textContent = fresh.length ? `fresh entries: ${fresh.join(" · ")}` : "";
  // the bill: what the store's format costs per token, the disk budget and how much of it is used
  const fp = stats.kv_footprint;
  const footprint = [
    ["format", fp.bytes_per_token == null ? fp.storage_dtype
      : `${fp.storage_dtype} · ${fmtBytes(fp.bytes_per_token)}/token · ${fmtBytes(fp.bytes_per_million_tokens)} per 1M tokens`],
    ["disk budget", fp.disk_budget_bytes == null ? "no disk tier"
      : `${fmtBytes(fp.disk_bytes)} of ${fmtBytes(fp.disk_budget_bytes)} (${fmtPct(fp.disk_bytes / fp.disk_budget_bytes, 0)}) · ${fp.disk_entries} entries · evicts by ${fp.eviction}`],
  ];
  $("card-footprint").replaceChildren(
    ...footprint.map(([k, v]) => el("tr", { "data-footprint": k }, el("td", {}, k), el("td", {}, v))));

  const rows = [
    ["model", stats.served_model
      ? `${stats.served_model.display_name} (${stats.served_model.name}) · ${stats.served_model.parameters_label} parameters`
        + (stats.served_model.origin_quantisation ? ` · from ${stats.served_model.origin_quantisation}` : "")
        + ` · ${stats.served_model.compute_dtype}`
        + (stats.served_model.decode_weights && stats.served_model.decode_weights !== "same"
          ? ` · decode ${stats.served_model.decode_weights}` : "")
      : "–"],
    ["compute", stats.compute ? `${stats.compute.dtype} (${stats.compute.requested}: ${stats.compute.reason})` : "–"],
    ["embedder", stats.embedder_compute ? `${stats.embedder_compute.dtype} (${stats.embedder_compute.requested})` : "–"],
    ["default answer", stats.default_mode === "blend"
      ? `blend · ${stats.default_selector} · recompute ${fmtPct(stats.default_recompute_ratio, 0)}` : stats.default_mode],
    ["blend settings", stats.blend_settings ? stats.blend_settings.label : "–"],
    ["check parts", stats.blend_settings ? checkParts(stats.blend_settings.check_parts) : "–"],
    ["calibration", stats.calibration ? `${stats.calibration.state}: ${stats.calibration.detail}` : "–"],
    ["engine queue", stats.queue_depth ?? "–"],
    ["prefill rate", stats.prefill_tokens_per_s ? `${Math.round(stats.prefill_tokens_per_s)} tok/s` : "–"],
    ["ingest", stats.ingest_chunks_per_s ? `${stats.ingest_chunks_per_s} chunks/s` : "–"],
    ["ask KV hits / misses", stats.ask_kv_hits == null ? "–" : `${stats.ask_kv_hits} / ${stats.ask_kv_misses}`],
    ["conversations", stats.conversations === null || stats.conversations === undefined ? "–"
      : `${stats.conversations} · ${stats.conversation_turns} turns`],
    ["storage", stats.storage.ok ? `ok · ${fmtBytes(stats.storage.free_bytes ?? 0)} free`
      : `FAULT: ${stats.storage.last_fault ?? "low disk space"} · ${fmtBytes(stats.storage.free_bytes ?? 0)} free`],
  ];
  $("card-serving").replaceChildren(...rows.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, v))));
}

// A record's check parts (bench ship), short: /api/stats' blend_settings.check_parts has their figures.
const CHECK_PART_NAMES = { similar_check: "similar pages", similar_several_check: "several values",
                           followups_check: "follow-ups", heldout_check: "held-out",
                           long_answers_check: "long answers" };
function checkParts(parts) {
  if (!parts || !parts.length || parts.every((p) => p.state === "not recorded")) return "none recorded";
  const state = (p) => (p.state === "met" ? "met"
    : p.state === "not recorded" ? "not recorded"
    : p.state === "below target" ? `below today's target (${(p.misses ?? []).join("; ")})`
    : `run on other ${p.differs_in.join(", ")}`);
  return parts.map((p) => `${CHECK_PART_NAMES[p.name] ?? p.title} ${state(p)}`).join(" · ");
}

// ---- documents table ---------------------------------------------------------------------------

// Two clicks instead of confirm(): no modal, and a stray click does nothing.
function armTwoClick(button, action) {
  const label = button.textContent;
  let armed = null;
  button.addEventListener("click", async () => {
    if (!armed) {
      button.textContent = "Confirm";
      button.classList.add("confirm");
      armed = setTimeout(() => {
        armed = null;
        button.textContent = label;
        button.classList.remove("confirm");
      }, 4000);
      return;
    }
    clearTimeout(armed);
    armed = null;
    button.disabled = true;
    try {
      await action();
      await refresh();
    } catch (err) {
      handleError(err);
    } finally {
      button.disabled = false;
      button.textContent = label;
      button.classList.remove("confirm");
    }
  });
  return button;
}

function deleteButton(doc) {
  const button = el("button", { class: "btn small danger", type: "button", "data-action": "delete" }, "Delete");
  return armTwoClick(button, () => api(`/documents/${encodeURIComponent(doc.id)}`, { method: "DELETE" }));
}

armTwoClick($("purge-failed"), async () => {
  const { deleted } = await api("/documents?status=failed", { method: "DELETE" });
  $("docs-sub").textContent = `deleted ${deleted} failed`;
});

$("status-filter").addEventListener("change", () => {
  offset = 0;
  refresh();
});

function coverageText(cov) {
  const parts = [`${cov.chunks_fresh}/${cov.chunks_total} fresh`];
  if (cov.chunks_stale) parts.push(`${cov.chunks_stale} stale`);
  if (cov.chunks_missing) parts.push(`${cov.chunks_missing} missing`);
  return parts.join(" · ");
}

function renderDocuments(page, coverage) {
  const byDoc = new Map(coverage.documents.map((d) => [d.document_id, d]));
  const body = $("docs-body");
  body.replaceChildren();
  if (!page.documents.length) {
    body.append(el("tr", {}, el("td", { colspan: 7, class: "muted" },
      offset ? "No more documents." : $("status-filter").value ? `No ${$("status-filter").value} documents.`
        : "No documents yet. Upload some above.")));
  }
  for (const doc of page.documents) {
    const cov = byDoc.get(doc.id);
    const sub = [doc.collection && doc.collection !== "default" ? `collection: ${doc.collection}` : null,
      doc.source && doc.source !== doc.title ? doc.source : null,
      doc.tags.length ? `tags: ${doc.tags.join(", ")}` : null].filter(Boolean).join(" · ");
    const status = el("td", {}, el("span", { class: `badge ${doc.status}`, title: doc.error || "" }, doc.status));
    if (doc.status === "pending") status.append(el("div", { class: "inline-progress", "data-job": doc.job_id }, "queued"));
    if (doc.status === "failed" && doc.error) status.append(el("div", { class: "inline-progress error-text" }, doc.error));
    const covCell = el("td", { class: "cov" });
    if (cov) {
      covCell.append(covBar(cov.chunks_fresh, cov.chunks_stale, cov.chunks_missing),
        el("div", { class: "covtext" }, coverageText(cov)));
    } else {
      covCell.append(el("span", { class: "muted" }, "–"));
    }
    body.append(el("tr", { "data-doc-id": doc.id, "data-status": doc.status },
      el("td", { class: "title" }, el("div", { class: "t", title: doc.title }, doc.title), sub ? el("div", { class: "sub" }, sub) : null),
      status,
      el("td", { class: "num" }, doc.num_chunks),
      el("td", { class: "num" }, doc.num_tokens),
      covCell,
      el("td", { class: "muted" }, new Date(doc.created_at).toLocaleString()),
      el("td", { class: "actions" }, doc.status === "pending" ? null : deleteButton(doc))));
    if (doc.status === "pending" && doc.job_id && !watchedJobs.has(doc.job_id)) watchJob(doc.job_id, doc.title);
  }
  labelCells(body);
  const filter = $("status-filter").value;
  $("docs-sub").textContent = filter ? `${page.total} ${filter}` : `${page.total} total`;
  const last = Math.min(offset + page.documents.length, page.total);
  $("page-info").textContent = page.total ? `${offset + 1}–${last} of ${page.total}` : "";
  $("prev").disabled = offset === 0;
  $("next").disabled = offset + PAGE_SIZE >= page.total;
}

$("prev").addEventListener("click", () => { offset = Math.max(0, offset - PAGE_SIZE); refresh(); });
$("next").addEventListener("click", () => { offset += PAGE_SIZE; refresh(); });

// ---- ingest jobs -------------------------------------------------------------------------------

function jobFraction(job) {
  if (job.status === "succeeded" || job.stage === WAITING) return 1;
  const index = STAGES.indexOf(job.stage);
  if (index < 0) return 0;
  const p = job.progress[job.stage] || { done: 0, total: 0 };
  return (index + (p.total ? p.done / p.total : 0)) / STAGES.length;
}

// A job's errors split: duplicates (content already stored, or being stored by another job: not a failure)
// and the failures.
function jobErrors(job) {
  const duplicates = job.errors.filter((e) => e.code === "duplicate");
  return { duplicates, failures: job.errors.filter((e) => e.code !== "duplicate") };
}

// The documents a job added: its commit's count; a job that does not report it (one from an older server)
// counts its own documents that were neither dropped as duplicates nor failed.
function documentsAdded(job) {
  const ready = job.progress.commit ? job.progress.commit.ready : undefined;
  if (ready !== undefined) return ready;
  const kept = job.document_ids.filter((id) => !job.duplicate_ids.includes(id)).length;
  return Math.max(kept - jobErrors(job).failures.length, 0);
}

function stageText(job) {
  if (job.status === "queued") return "waiting for the ingest worker";
  if (job.status === "running" && job.stage === WAITING && !job.cancel_requested) {
    return "waiting for the originals of its duplicates (other jobs are ingesting them)";
  }
  if (job.status === "running") {
    const p = job.progress[job.stage] || { done: 0, total: 0 };
    const name = STAGE_NAMES[job.stage] || job.stage || "starting";
    const kvAdded = job.stage === "kv" && p.bytes ? ` · KV +${fmtBytes(p.bytes)}` : "";
    return job.cancel_requested ? "cancelling…" : `${name} ${p.done}/${p.total}${kvAdded}`;
  }
  const chunks = job.progress.kv ? job.progress.kv.total : 0;
  const kvBytes = job.progress.kv && job.progress.kv.bytes ? `, KV cache +${fmtBytes(job.progress.kv.bytes)}` : "";
  const { duplicates } = jobErrors(job);
  const copies = duplicates.length ? `, ${duplicates.length} duplicate(s) of stored documents` : "";
  if (job.status === "succeeded") {
    return `done: ${documentsAdded(job)} new document(s)${copies}, ${chunks} chunk(s)${kvBytes}`;
  }
  return job.status;
}

function updateJobCard(card, job) {
  card.dataset.status = job.status;
  const badge = card.querySelector(".badge");
  badge.className = `badge ${job.status}`;
  badge.textContent = job.status;
  card.querySelector(".progress > span").style.width = `${Math.round(jobFraction(job) * 100)}%`;
  card.querySelector(".stage").textContent = stageText(job);
  const { duplicates, failures } = jobErrors(job);
  const errors = card.querySelector(".errors");
  errors.replaceChildren(...failures.map((e) => el("li", {}, `${e.source ?? "job"}: ${e.error}`)));
  // Duplicates are no failure: their content is stored, under the document each names.
  const copies = card.querySelector(".duplicates");
  copies.hidden = !duplicates.length;
  copies.querySelector("summary").textContent = `${duplicates.length} duplicate(s): already stored`;
  copies.querySelector("ul").replaceChildren(...duplicates.map((e) => el("li", {},
    `${e.source ?? "document"}: same content as document ${(e.document_id || "").slice(0, 8)}`)));
  const cancel = card.querySelector("[data-action=cancel]");
  cancel.hidden = !(job.status === "queued" || job.status === "running") || job.cancel_requested;
  // The matching document rows show the same stage inline.
  for (const cell of document.querySelectorAll(`.inline-progress[data-job="${job.job_id}"]`)) {
    cell.textContent = stageText(job);
  }
}

function jobName(job) {
  // Its documents and the duplicates submit answered with a stored document (those are not among them).
  const n = job.document_ids.length + job.duplicate_ids.filter((id) => !job.document_ids.includes(id)).length;
  return `job ${job.job_id.slice(0, 8)} · ${n} document${n === 1 ? "" : "s"}`;
}

// Jobs started elsewhere (API, CLI, another browser) show up too: running ones are followed live,
// finished ones as they ended.
function showServerJobs(jobs) {
  for (const job of [...jobs].reverse()) {
    if (watchedJobs.has(job.job_id)) continue;
    if (job.status === "queued" || job.status === "running") watchJob(job.job_id, jobName(job));
    else updateJobCard(addJobCard(job.job_id, jobName(job)), job);
  }
}

function addJobCard(jobId, name) {
  const cancel = el("button", { class: "btn small", type: "button", "data-action": "cancel" }, "Cancel");
  const card = el("li", { class: "job", "data-job-id": jobId, "data-status": "queued" },
    el("div", { class: "head" }, el("span", { class: "name", title: name }, name),
      el("span", { class: "badge queued" }, "queued"), cancel),
    el("div", { class: "progress" }, el("span", { style: "width:0%" })),
    el("div", { class: "stage" }, "submitted"),
    el("ul", { class: "errors" }),
    el("details", { class: "duplicates", hidden: true }, el("summary", {}), el("ul", {})));
  cancel.addEventListener("click", async () => {
    try {
      updateJobCard(card, await api(`/ingest/jobs/${jobId}/cancel`, { method: "POST" }));
    } catch (err) {
      handleError(err);
    }
  });
  watchedJobs.set(jobId, card);
  const list = $("jobs");
  list.prepend(card);
  while (list.children.length > MAX_JOB_CARDS) list.lastElementChild.remove();
  return card;
}

async function watchJob(jobId, name) {
  const card = addJobCard(jobId, name);
  try {
    const response = await fetch(`/ingest/jobs/${jobId}/events`, { headers: authHeaders() });
    if (!response.ok) throw new ApiError(response.status, await errorMessage(response));
    for await (const { event, data } of readSSE(response)) {
      if (event === "progress" || event === "done") updateJobCard(card, data);
      if (event === "done") break;
      if (event === "error") throw new Error(data.message);
    }
  } catch (err) {
    card.querySelector(".stage").textContent = `lost track of the job: ${err.message}`;
  }
  await refresh();
}

const fileInput = $("files");
const dropzone = $("dropzone");
dropzone.addEventListener("dragover", (event) => { event.preventDefault(); dropzone.classList.add("over"); });
dropzone.addEventListener("dragleave", () => dropzone.classList.remove("over"));
dropzone.addEventListener("drop", (event) => {
  event.preventDefault();
  dropzone.classList.remove("over");
  fileInput.files = event.dataTransfer.files;
});

$("upload-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const files = [...fileInput.files];
  $("upload-error").textContent = "";
  if (!files.length) {
    $("upload-error").textContent = "Choose at least one file.";
    return;
  }
  const form = new FormData();
  for (const file of files) form.append("files", file, file.name);
  if ($("tags").value.trim()) form.append("tags", $("tags").value.trim());
  if ($("collection").value.trim()) form.append("collection", $("collection").value.trim());
  const button = $("upload-btn");
  button.disabled = true;
  try {
    const accepted = await api("/ingest", { method: "POST", body: form });
    fileInput.value = "";
    const name = files.length === 1 ? files[0].name : `${files.length} files`;
    watchJob(accepted.job_id, name);
    refresh();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) handleError(err);
    else $("upload-error").textContent = err.message;
  } finally {
    button.disabled = false;
  }
});

// ---- collections and keys ----------------------------------------------------------------------

function fmtDate(iso) {
  return iso ? new Date(iso).toLocaleString() : "never";
}

// On a phone the tables stack each row into label: value lines (app.css): every cell gets its column's
// header as `data-label`, so Delete, Revoke and "Last used" stay on screen instead of off to the right.
function labelCells(body) {
  const headers = [...body.closest("table").querySelectorAll("thead th")].map((th) => th.textContent.trim());
  for (const row of body.rows) {
    [...row.cells].forEach((cell, i) => {
      if (!cell.colSpan || cell.colSpan === 1) cell.dataset.label = headers[i] || "";
    });
  }
}

function renderCollections(collections, isAdmin) {
  const body = $("collections-body");
  body.replaceChildren();
  if (!collections.length) {
    body.append(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No collections yet: upload documents.")));
  }
  for (const c of collections) {
    const notReady = c.num_documents - c.num_ready_documents;
    const del = isAdmin ? armTwoClick(el("button", { class: "btn small danger", type: "button", "data-action": "delete",
      title: `Delete every document of ${c.name}` }, "Delete"),
    () => api(`/collections/${encodeURIComponent(c.name)}`, { method: "DELETE" })) : null;
    body.append(el("tr", { "data-collection": c.name },
      el("td", { class: "title" }, el("div", { class: "t" }, c.name)),
      el("td", { class: "num" }, c.num_documents, notReady ? el("div", { class: "sub" }, `${notReady} not ready`) : null),
      el("td", { class: "num" }, c.num_chunks),
      el("td", { class: "cov" }, el("div", { class: "covtext" }, `${fmtPct(c.coverage, c.coverage < 1 ? 1 : 0)} · ${c.chunks_fresh} fresh`)),
      el("td", { class: "actions" }, del)));
  }
  labelCells(body);
}

// What a sync changed, by file: "+3 added · 1 changed · -2 removed · 194 unchanged" (zeros left out but the
// unchanged count, so a sync that changed nothing still says what it compared).
function syncChanges(c) {
  const parts = [];
  if (c.added) parts.push(`+${c.added} added`);
  if (c.changed) parts.push(`${c.changed} changed`);
  if (c.removed) parts.push(`-${c.removed} removed`);
  parts.push(`${c.unchanged || 0} unchanged`);
  if (c.failed) parts.push(`${c.failed} failed`);
  if (c.skipped) parts.push(`${c.skipped} skipped`);
  return parts.join(" · ");
}

function renderSyncs(syncs) {
  $("syncs-panel").hidden = !syncs.length;
  const body = $("syncs-body");
  body.replaceChildren();
  for (const s of syncs) {
    body.append(el("tr", { "data-collection": s.collection },
      el("td", { class: "title" }, el("div", { class: "t", title: s.folder }, s.folder)),
      el("td", {}, s.collection),
      el("td", {}, fmtDate(s.synced_at)),
      el("td", {}, syncChanges(s.changes))));
  }
  labelCells(body);
}

function renderKeys(keys) {
  $("keys-panel").hidden = keys === null;
  if (keys === null) return;
  const body = $("keys-body");
  body.replaceChildren();
  if (!keys.keys.length) {
    body.append(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "No collection keys.")));
  }
  for (const k of keys.keys) {
    const revoke = armTwoClick(el("button", { class: "btn small danger", type: "button", "data-action": "revoke" },
      "Revoke"), () => api(`/admin/keys/${encodeURIComponent(k.key_id)}`, { method: "DELETE" }));
    body.append(el("tr", { "data-key-id": k.key_id },
      el("td", { class: "title" }, el("div", { class: "t" }, k.name), el("div", { class: "sub" }, k.key_id)),
      el("td", {}, k.collections.join(", "), k.can_ingest ? el("div", { class: "sub" }, "may ingest") : null),
      el("td", {}, fmtDate(k.created_at)),
      el("td", {}, fmtDate(k.last_used_at)),
      el("td", { class: "actions" }, revoke)));
  }
  labelCells(body);
}

$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  $("key-form-error").textContent = "";
  const collections = $("key-collections").value.split(",").map((c) => c.trim()).filter(Boolean);
  try {
    const made = await api("/admin/keys", { method: "POST", json: { name: $("key-name").value.trim(), collections,
      can_ingest: $("key-ingest").checked } });
    $("key-secret-value").textContent = made.key;
    $("key-secret").hidden = false;
    $("key-form").reset();
    refresh();
  } catch (err) {
    $("key-form-error").textContent = err.message;
  }
});

// ---- refresh loop ------------------------------------------------------------------------------

let inFlight = null;
let again = false;

// One refresh at a time: a call while one runs asks for another afterwards, so an older response can
// never overwrite a newer one (e.g. a "pending" row after its job's "done").
async function refresh() {
  if (inFlight) {
    again = true;
    return inFlight;
  }
  clearTimeout(refreshTimer);
  inFlight = load();
  try {
    await inFlight;
  } finally {
    inFlight = null;
  }
  if (again) {
    again = false;
    await refresh();
  } else if (!document.hidden) {
    refreshTimer = setTimeout(refresh, busy() ? REFRESH_BUSY_MS : REFRESH_IDLE_MS);
  }
}

async function load() {
  try {
    const filter = $("status-filter").value;
    const [page, coverage, stats, jobs, collections, syncs, keys] = await Promise.all([
      api(`/documents?offset=${offset}&limit=${PAGE_SIZE}${filter ? `&status=${filter}` : ""}`),
      api("/api/coverage"), api("/api/stats"), api(`/ingest/jobs?limit=${MAX_JOB_CARDS}`), api("/collections"),
      api("/syncs"),
      // Only the admin key manages keys: a collection key gets a 403 here, and the panel stays hidden.
      api("/admin/keys").catch((err) => (err instanceof ApiError && err.status === 403 ? null : Promise.reject(err)))]);
    showError("");
    renderCollections(collections.collections, keys !== null);
    renderSyncs(syncs.syncs);
    renderKeys(keys);
    renderCards(coverage, stats);
    renderDocuments(page, coverage);
    showServerJobs(jobs.jobs);
    lastStats = stats;
    drawTtftChart($("ttft-chart"), $("ttft-legend"), stats.recent, stats.ttft_by_mode);
    $("chart-sub").textContent = `by mode · last ${stats.recent.length} answers`;
  } catch (err) {
    handleError(err);
  }
}

function busy() {
  return [...watchedJobs.values()].some((card) => ["queued", "running"].includes(card.dataset.status));
}

// A hidden tab does not poll; coming back refreshes at once.
document.addEventListener("visibilitychange", () => {
  if (document.hidden) clearTimeout(refreshTimer);
  else refresh();
});

window.addEventListener("resize", () => {
  if (lastStats) drawTtftChart($("ttft-chart"), $("ttft-legend"), lastStats.recent, lastStats.ttft_by_mode);
});

watchReadiness($("server-status"), refresh);
