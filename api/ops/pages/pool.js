// The pool view: per model, its figures (workers, slots in use, queue depth by tier, jobs in
// flight, tokens/s, cache-aware routing), a row per worker (slots in use, prefix hit rate,
// last step time), and small charts of tokens/s, queue depth and hit rate over the last
// minutes, drawn here on canvases (nothing is fetched but /metrics); crash recoveries and lost
// jobs. Everything comes from GET /metrics (the numbers an operator's Prometheus scrapes),
// read every 2 s; a rate is the change of a counter between two reads.
"use strict";

const TIERS = ["priority", "default", "flex", "batch", "suspect"];
const HISTORY = 150; // points kept per chart: five minutes at one read every 2 s
let previous = null; // {at, models: {model: {tokens, prompt, cached}}, workers: {key: {prompt, cached}}}
const history = {}; // model -> {rate: [], queued: [], hits: []}

// Prometheus text: [{name, labels: {k: v}, value}] (comments skipped).
function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$/);
    if (!m) continue;
    const labels = {};
    for (const pair of (m[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
      labels[pair[1]] = pair[2];
    }
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function figure(dl, label, value) {
  const dt = document.createElement("dt");
  dt.textContent = label;
  const dd = document.createElement("dd");
  dd.textContent = value;
  dl.append(dt, dd);
}

// A per-second rate between two reads of a counter ("…" before the second read).
function rate(now, was, seconds) {
  return was === undefined || seconds <= 0 ? null : (now - was) / seconds;
}

function percent(part, whole) {
  return whole > 0 ? Math.round((100 * part) / whole) + " %" : "–";
}

const MODEL_FIGURES = {
  tokenspool_workers: "warm",
  tokenspool_slots: "slots",
  tokenspool_jobs_in_flight: "inFlight",
  tokenspool_batch_lines_in_flight: "batch",
  tokenspool_tokens_generated_total: "tokens",
  tokenspool_routed_jobs_total: "routed",
  tokenspool_route_fallbacks_total: "fallbacks",
  tokenspool_batch_routed_taken_total: "taken",
  tokenspool_batch_prompt_tokens_total: "prompt",
  tokenspool_batch_cached_tokens_total: "cached",
};
const WORKER_FIGURES = {
  tokenspool_worker_slots: "slots",
  tokenspool_worker_slots_in_use: "inUse",
  tokenspool_worker_step_seconds: "step",
  tokenspool_worker_prompt_tokens_total: "prompt",
  tokenspool_worker_cached_tokens_total: "cached",
};

function collect(samples) {
  const models = {};
  const model = (name) => (models[name] ||= { tiers: {}, workers: {} });
  const totals = {};
  for (const s of samples) {
    const m = s.labels.model;
    if (MODEL_FIGURES[s.name]) model(m)[MODEL_FIGURES[s.name]] = s.value;
    else if (WORKER_FIGURES[s.name]) (model(m).workers[s.labels.worker] ||= {})[WORKER_FIGURES[s.name]] = s.value;
    else if (s.name === "tokenspool_queue_depth_by_tier") model(m).tiers[s.labels.tier] = s.value;
    else if (s.name === "tokenspool_attempts_requeued_total") {
      const label = s.labels.reason === "preempt" ? "batch lines preempted" : "recovered: " + s.labels.reason;
      totals[label] = s.value;
    } else if (s.name === "tokenspool_jobs_lost_total") totals["jobs lost"] = s.value;
  }
  return { models, totals };
}

function workerTable(m, seconds) {
  const table = document.createElement("table");
  table.className = "workers";
  const head = table.createTHead().insertRow();
  for (const label of ["worker", "slots in use", "prefix hit rate", "last step"]) {
    const th = document.createElement("th");
    th.textContent = label;
    head.append(th);
  }
  const body = table.createTBody();
  for (const name of Object.keys(m.workers).sort()) {
    const w = m.workers[name];
    const was = previous?.workers[m.name + " " + name];
    const prompt = was && seconds > 0 ? (w.prompt ?? 0) - was.prompt : w.prompt ?? 0;
    const cached = was && seconds > 0 ? (w.cached ?? 0) - was.cached : w.cached ?? 0;
    const row = body.insertRow();
    row.dataset.worker = name;
    for (const text of [
      name,
      (w.inUse ?? 0) + " / " + (w.slots ?? 0),
      percent(cached, prompt),
      ((w.step ?? 0) * 1000).toFixed(1) + " ms",
    ]) {
      row.insertCell().textContent = text;
    }
  }
  return table;
}

// A small line chart of one series on a canvas (its own scale, the last value written).
function chart(label, values, unit) {
  const figureEl = document.createElement("figure");
  figureEl.className = "chart";
  const canvas = document.createElement("canvas");
  canvas.width = 220;
  canvas.height = 60;
  canvas.setAttribute("role", "img");
  const last = values.length ? values[values.length - 1] : null;
  canvas.setAttribute("aria-label", label + ": " + (last === null ? "no reading yet" : last.toFixed(1) + unit));
  const ctx = canvas.getContext("2d");
  const top = Math.max(1, ...values.filter((v) => v !== null));
  ctx.strokeStyle = ctx.fillStyle = getComputedStyle(document.body).color || "#333";
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  values.forEach((v, i) => {
    if (v === null) return;
    const x = (i / Math.max(HISTORY - 1, 1)) * (canvas.width - 2) + 1;
    const y = canvas.height - 2 - (v / top) * (canvas.height - 4);
    if (i === 0 || values[i - 1] === null) ctx.moveTo(x, y);
    else ctx.lineTo(x, y);
    ctx.fillRect(x - 1, y - 1, 2, 2); // a reading shows even before the next one joins it
  });
  ctx.stroke();
  const caption = document.createElement("figcaption");
  caption.textContent = label + (last === null ? "" : ": " + last.toFixed(1) + unit);
  figureEl.append(canvas, caption);
  return figureEl;
}

function remember(name, point) {
  const h = (history[name] ||= { rate: [], queued: [], hits: [] });
  for (const key of Object.keys(point)) {
    h[key].push(point[key]);
    if (h[key].length > HISTORY) h[key].shift();
  }
  return h;
}

function draw(samples) {
  const { models, totals } = collect(samples);
  const now = performance.now();
  const seconds = previous ? (now - previous.at) / 1000 : 0;
  const box = document.getElementById("models");
  box.replaceChildren();
  for (const name of Object.keys(models).sort()) {
    const m = Object.assign(models[name], { name });
    const was = previous?.models[name] || {};
    const tokS = rate(m.tokens ?? 0, was.tokens, seconds);
    const queued = TIERS.reduce((sum, t) => sum + (m.tiers[t] ?? 0), 0);
    const prompt = (m.prompt ?? 0) - (was.prompt ?? 0);
    const hits = was.prompt !== undefined && prompt > 0 ? (100 * ((m.cached ?? 0) - was.cached)) / prompt : null;
    const h = remember(name, { rate: tokS, queued, hits });
    const section = document.createElement("section");
    section.className = "model";
    section.dataset.model = name;
    const title = document.createElement("h2");
    title.textContent = name;
    const dl = document.createElement("dl");
    dl.className = "figures";
    figure(dl, "workers (warm)", m.warm ?? 0);
    figure(dl, "slots in use", (m.inFlight ?? 0) + " / " + (m.slots ?? 0));
    figure(dl, "batch lines running", m.batch ?? 0);
    figure(dl, "queued", TIERS.map((t) => t + " " + (m.tiers[t] ?? 0)).join(", "));
    figure(dl, "tokens/s", tokS === null ? "…" : tokS.toFixed(1));
    figure(dl, "routed jobs", (m.routed ?? 0) + " (taken by their worker " + (m.taken ?? 0) + ", back to the queue " + (m.fallbacks ?? 0) + ")");
    figure(dl, "prompt tokens from cache", percent(m.cached ?? 0, m.prompt ?? 0));
    const charts = document.createElement("div");
    charts.className = "charts";
    charts.append(chart("tokens/s", h.rate, ""), chart("queued", h.queued, ""), chart("prefix hit rate", h.hits, " %"));
    section.append(title, dl, workerTable(m, seconds), charts);
    box.append(section);
  }
  if (!Object.keys(models).length) box.textContent = "No model is served or queued.";
  const recovery = document.getElementById("recovery");
  recovery.replaceChildren();
  for (const label of Object.keys(totals).sort()) figure(recovery, label, totals[label]);
  const workers = {};
  for (const [name, m] of Object.entries(models)) {
    for (const [w, f] of Object.entries(m.workers)) workers[name + " " + w] = { prompt: f.prompt ?? 0, cached: f.cached ?? 0 };
  }
  previous = {
    at: now,
    models: Object.fromEntries(
      Object.entries(models).map(([k, v]) => [k, { tokens: v.tokens ?? 0, prompt: v.prompt ?? 0, cached: v.cached ?? 0 }])
    ),
    workers,
  };
}

async function refresh() {
  try {
    const resp = await fetch("/metrics", { headers: headers() });
    if (!resp.ok) {
      document.getElementById("status").textContent = "Metrics: " + (await errorMessage(resp));
      return;
    }
    document.getElementById("status").textContent = "";
    draw(parseMetrics(await resp.text()));
  } catch (err) {
    document.getElementById("status").textContent = "Metrics: " + err.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  setUpKeyForm(refresh);
  refresh();
  setInterval(refresh, 2000);
});
