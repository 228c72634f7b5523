// A small SVG chart of recent time-to-first-token, one colour per mode (no chart library).

import { el, fmtMs } from "./api.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const MODES = ["blend", "full", "prefix", "reuse"];

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  for (const child of children) node.append(child);
  return node;
}

function modeColor(mode) {
  const value = getComputedStyle(document.documentElement).getPropertyValue(`--mode-${mode}`).trim();
  return value || "#667085";
}

// 1, 2, 2.5, 5 × 10^k: the smallest "nice" step giving at most `count` intervals up to `max`.
function niceStep(max, count) {
  const raw = max / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 2.5, 5, 10]) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

// Tick labels in one unit for the whole axis (never "0 ms" next to "5.00 s"), with as many decimals as
// the step needs.
export function axisLabel(value, yMax, step) {
  if (yMax < 1000) return `${Math.round(value)} ms`;
  const stepS = step / 1000;
  const decimals = Number.isInteger(stepS) ? 0 : Number.isInteger(stepS * 10) ? 1 : 2;
  return `${(value / 1000).toFixed(decimals)} s`;
}

// Runs of at least two points of one mode that are neighbours in the answer order and all had context.
export function runs(points) {
  const out = [];
  let current = [];
  for (const point of points) {
    const joins = current.length && point.i === current[current.length - 1].i + 1 && point.r.num_context_tokens;
    if (!joins) {
      if (current.length > 1) out.push(current);
      current = point.r.num_context_tokens ? [point] : [];
    } else {
      current.push(point);
    }
  }
  if (current.length > 1) out.push(current);
  return out;
}

export function drawTtftChart(target, legend, recent, byMode) {
  const width = Math.max(target.clientWidth || 0, 320);
  const height = 240;
  const m = { left: 58, right: 14, top: 12, bottom: 30 };
  const plotW = width - m.left - m.right;
  const plotH = height - m.top - m.bottom;
  target.setAttribute("viewBox", `0 0 ${width} ${height}`);
  target.replaceChildren();
  legend.replaceChildren();

  if (!recent.length) {
    target.append(svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle", class: "empty-chart" },
      "No questions answered yet — ask one on the chat page"));
    return;
  }

  const maxTtft = Math.max(...recent.map((r) => r.ttft_ms), 1);
  const step = niceStep(maxTtft, 4);
  const yMax = Math.ceil(maxTtft / step) * step;
  const x = (i) => m.left + (recent.length === 1 ? plotW / 2 : (i / (recent.length - 1)) * plotW);
  const y = (v) => m.top + plotH - (v / yMax) * plotH;

  const grid = svg("g", { class: "grid" });
  const axis = svg("g", { class: "axis" });
  for (let v = 0; v <= yMax + step / 2; v += step) {
    grid.append(svg("line", { x1: m.left, x2: width - m.right, y1: y(v), y2: y(v) }));
    axis.append(svg("text", { x: m.left - 8, y: y(v) + 4, "text-anchor": "end", class: "tick" },
      axisLabel(v, yMax, step)));
  }
  axis.append(svg("text", { x: m.left, y: height - 8 }, "older"));
  axis.append(svg("text", { x: width - m.right, y: height - 8, "text-anchor": "end" }, "newer"));
  axis.append(svg("text", { x: m.left + plotW / 2, y: height - 8, "text-anchor": "middle" },
    `last ${recent.length} answers`));
  target.append(grid, axis);

  const seen = MODES.filter((mode) => recent.some((r) => r.mode === mode));
  for (const mode of [...seen, ...new Set(recent.map((r) => r.mode).filter((md) => !MODES.includes(md)))]) {
    const color = modeColor(mode);
    const points = recent.map((r, i) => ({ r, i })).filter(({ r }) => r.mode === mode);
    const group = svg("g", { "data-mode": mode });
    // A line joins only answers next to each other in time with context: another mode's answer, or one
    // without documents (its prompt is the question alone), is a gap, never a long line across the chart.
    for (const run of runs(points)) {
      group.append(svg("polyline", {
        points: run.map(({ r, i }) => `${x(i)},${y(r.ttft_ms)}`).join(" "),
        fill: "none", stroke: color, "stroke-width": 1.5, "stroke-opacity": 0.55,
      }));
    }
    for (const { r, i } of points) {
      const ratio = r.mode === "blend" ? ` (${r.selector}) · recompute ${(r.recompute_ratio * 100).toFixed(0)}%` : "";
      const bare = !r.num_context_tokens;
      const what = bare ? " · no documents (left out of p50/p95)" : "";
      group.append(svg("circle", {
        cx: x(i), cy: y(r.ttft_ms), r: 4, fill: bare ? "none" : color, stroke: color, "stroke-width": bare ? 1.5 : 0,
        class: bare ? "no-context" : "",
      }, svg("title", {}, `${r.mode}: TTFT ${fmtMs(r.ttft_ms)}${ratio} · ${r.num_prompt_tokens} prompt tokens${what}`)));
    }
    target.append(group);
    const stats = byMode[mode];
    legend.append(el("span", {},
      el("span", { class: "swatch", style: `background:${color}` }),
      el("b", {}, mode), stats ? ` p50 ${fmtMs(stats.ttft_ms_p50)} · p95 ${fmtMs(stats.ttft_ms_p95)} · n=${stats.count}` : ""));
  }
}
