// The pool view: per model, workers, slots in use, queue depth by tier, jobs in flight and
// tokens/s; crash recoveries and lost jobs. Everything comes from GET /metrics (the numbers
// an operator's Prometheus scrapes), read every 2 s; tokens/s is the counter's rate between
// two reads.
"use strict";

const TIERS = ["priority", "default", "flex", "batch", "suspect"];
let previous = null; // {at, tokens: {model: n}}

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

function draw(samples) {
  const perModel = {};
  const model = (name) => (perModel[name] ||= { tiers: {} });
  const totals = {};
  for (const s of samples) {
    const m = s.labels.model;
    if (s.name === "tokenspool_workers") model(m).workers = s.value;
    else if (s.name === "tokenspool_slots") model(m).slots = s.value;
    else if (s.name === "tokenspool_jobs_in_flight") model(m).inFlight = s.value;
    else if (s.name === "tokenspool_batch_lines_in_flight") model(m).batch = s.value;
    else if (s.name === "tokenspool_queue_depth_by_tier") model(m).tiers[s.labels.tier] = s.value;
    else if (s.name === "tokenspool_tokens_generated_total") model(m).tokens = s.value;
    else if (s.name === "tokenspool_attempts_requeued_total") {
      const label = s.labels.reason === "preempt" ? "batch lines preempted" : "recovered: " + s.labels.reason;
      totals[label] = s.value;
    }
    else if (s.name === "tokenspool_jobs_lost_total") totals["jobs lost"] = s.value;
  }
  const now = performance.now();
  const box = document.getElementById("models");
  box.replaceChildren();
  for (const name of Object.keys(perModel).sort()) {
    const m = perModel[name];
    const section = document.createElement("section");
    section.className = "model";
    section.dataset.model = name;
    const h = document.createElement("h2");
    h.textContent = name;
    const dl = document.createElement("dl");
    dl.className = "figures";
    figure(dl, "workers (warm)", m.workers ?? 0);
    figure(dl, "slots in use", (m.inFlight ?? 0) + " / " + (m.slots ?? 0));
    figure(dl, "batch lines running", m.batch ?? 0);
    figure(dl, "queued", TIERS.map((t) => t + " " + (m.tiers[t] ?? 0)).join(", "));
    let rate = "…";
    if (previous && previous.tokens[name] !== undefined && now > previous.at) {
      rate = (((m.tokens ?? 0) - previous.tokens[name]) / ((now - previous.at) / 1000)).toFixed(1);
    }
    figure(dl, "tokens/s", rate);
    section.append(h, dl);
    box.append(section);
  }
  if (!Object.keys(perModel).length) box.textContent = "No model is served or queued.";
  const recovery = document.getElementById("recovery");
  recovery.replaceChildren();
  for (const label of Object.keys(totals).sort()) figure(recovery, label, totals[label]);
  previous = { at: now, tokens: Object.fromEntries(Object.entries(perModel).map(([k, v]) => [k, v.tokens ?? 0])) };
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
