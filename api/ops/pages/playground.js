// The playground: a streamed chat that survives a reload. The answer in progress (its
// completion id, the last event id and the text so far) is kept in sessionStorage; a page
// loaded with one resumes it through GET /v1/chat/completions/{id}?stream=true with
// Last-Event-ID, so no text is lost or repeated. A takeover after a worker died shows a note.
// A reasoning model's thinking (reasoning_content, or vLLM's reasoning) is shown apart, in a
// collapsible block above the answer. Images (attached, or pasted into the message box) go
// with the message as chat `image_url` parts holding data: URLs, for a model that reads them.
"use strict";

const CHAT_ITEM = "tokenspool.chat";
const PENDING_ITEM = "tokenspool.pending";
const RECOVERED = "continued on another worker";

const $ = (id) => document.getElementById(id);
let controller = null; // aborts the stream being read
let current = null; // the answer in progress (also in sessionStorage)
let attached = []; // data: URLs of the images the next message sends

function load(item, fallback) {
  try {
    return JSON.parse(sessionStorage.getItem(item)) || fallback;
  } catch (_) {
    return fallback;
  }
}

function save(item, value) {
  if (value === null) sessionStorage.removeItem(item);
  else sessionStorage.setItem(item, JSON.stringify(value));
}

function status(text) {
  $("status").textContent = text;
}

function messageItem(role) {
  const li = document.createElement("li");
  li.className = "msg " + role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role;
  const thinking = document.createElement("details");
  thinking.className = "thinking";
  const label = document.createElement("summary");
  label.textContent = "Thinking";
  const reasoning = document.createElement("div");
  reasoning.className = "reasoning";
  thinking.append(label, reasoning);
  const content = document.createElement("div");
  content.className = "content";
  const calls = document.createElement("pre");
  calls.className = "calls";
  const note = document.createElement("p");
  note.className = "note";
  const pictures = document.createElement("div");
  pictures.className = "images";
  li.append(who, thinking, pictures, content, calls, note);
  $("transcript").append(li);
  return li;
}

function show(li, msg) {
  li.querySelector(".reasoning").textContent = msg.reasoning || "";
  li.querySelector(".thinking").hidden = !msg.reasoning;
  li.querySelector(".content").textContent = msg.content || "";
  const calls = msg.tool_calls && msg.tool_calls.length ? JSON.stringify(msg.tool_calls, null, 2) : "";
  li.querySelector(".calls").textContent = calls;
  li.querySelector(".note").textContent = msg.note || "";
  li.querySelector(".images").replaceChildren(...(msg.images || []).map((url) => thumbnail(url)));
  li.scrollIntoView({ block: "end" });
}

function thumbnail(url) {
  const img = document.createElement("img");
  img.src = url;
  img.alt = "an image sent with the message";
  return img;
}

function showAttached() {
  $("attachments").replaceChildren(
    ...attached.map((url, i) => {
      const item = document.createElement("li");
      const drop = document.createElement("button");
      drop.type = "button";
      drop.textContent = "Remove";
      drop.setAttribute("aria-label", "Remove image " + (i + 1));
      drop.addEventListener("click", () => {
        attached.splice(i, 1);
        showAttached();
      });
      item.append(thumbnail(url), drop);
      return item;
    })
  );
}

function attach(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) continue;
    const reader = new FileReader();
    reader.onload = () => {
      attached.push(reader.result);
      showAttached();
    };
    reader.readAsDataURL(file);
  }
}

function render() {
  $("transcript").replaceChildren();
  for (const msg of load(CHAT_ITEM, [])) show(messageItem(msg.role), msg);
}

async function loadModels() {
  const select = $("model");
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (!resp.ok) {
      status("Models: " + (await errorMessage(resp)));
      return;
    }
    const chosen = select.value;
    select.replaceChildren();
    for (const m of (await resp.json()).data) {
      if (m.kinds && !m.kinds.includes("chat")) continue; // an embedding model: nothing to chat with
      const opt = document.createElement("option");
      opt.value = m.id;
      opt.textContent = m.id + " (" + m.workers + (m.workers === 1 ? " worker)" : " workers)");
      select.append(opt);
    }
    if (chosen) select.value = chosen;
    if (!select.value && select.options.length) select.selectedIndex = 0;
    if (!select.options.length) status("No model is served: start a worker.");
  } catch (err) {
    status("Models: " + err.message);
  }
}

function requestBody(history) {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of history) {
    const msg = { role: m.role, content: m.content || "" };
    if (m.images && m.images.length) {
      const parts = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
      msg.content = [{ type: "text", text: m.content || "" }, ...parts];
    }
    if (m.tool_calls && m.tool_calls.length) msg.tool_calls = m.tool_calls;
    messages.push(msg);
  }
  const body = {
    model: $("model").value,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
  if ($("json-mode").checked) body.response_format = { type: "json_object" };
  const tools = $("tools").value.trim();
  if (tools) body.tools = JSON.parse(tools);
  return body;
}

function busy(on) {
  $("send").disabled = on;
  $("stop").disabled = !on;
}

// One event of the answer's stream; returns true at [DONE].
function onEvent(ev, li) {
  if (ev.comments.includes(RECOVERED)) {
    current.recovered = true;
    current.note = "recovered: another worker took over and went on";
  }
  if (ev.data === "[DONE]") return true;
  const chunk = JSON.parse(ev.data);
  if (chunk.error) {
    current.note = "error: " + chunk.error.message;
  } else {
    current.id = chunk.id;
    if (ev.id) current.lastEventId = ev.id;
    if (chunk.usage) current.usage = chunk.usage;
    for (const choice of chunk.choices || []) {
      const delta = choice.delta || {};
      const thought = delta.reasoning_content || delta.reasoning;
      if ((delta.content || thought) && current.firstAt === null && !current.resumed) current.firstAt = Date.now();
      if (thought) current.reasoning = (current.reasoning || "") + thought;
      if (delta.content) current.content += delta.content;
      for (const call of delta.tool_calls || []) {
        const slot = (current.tool_calls[call.index] ||= { id: "", type: "function", function: { name: "", arguments: "" } });
        if (call.id) slot.id = call.id;
        if (call.function && call.function.name) slot.function.name += call.function.name;
        if (call.function && call.function.arguments) slot.function.arguments += call.function.arguments;
      }
      if (choice.finish_reason) current.finish = choice.finish_reason;
    }
  }
  save(PENDING_ITEM, current);
  show(li, current);
  return false;
}

function finish(li) {
  const stats = [];
  if (current.firstAt !== null && !current.resumed) stats.push("TTFT " + (current.firstAt - current.startedAt) + " ms");
  if (current.usage && current.firstAt !== null) {
    const seconds = (Date.now() - current.firstAt) / 1000;
    if (seconds > 0) stats.push((current.usage.completion_tokens / seconds).toFixed(1) + " tokens/s");
  }
  if (current.finish) stats.push("finish: " + current.finish);
  if (current.resumed) stats.push("resumed after a reload");
  const note = [current.note, stats.join(" · ")].filter(Boolean).join(" — ");
  const history = load(CHAT_ITEM, []);
  history.push({
    role: "assistant",
    content: current.content,
    reasoning: current.reasoning || "",
    tool_calls: current.tool_calls.filter(Boolean),
    note,
  });
  save(CHAT_ITEM, history);
  save(PENDING_ITEM, null);
  current = null;
  show(li, history[history.length - 1]);
  li.dataset.done = "true";
  status("");
}

async function follow(resp, li) {
  controller = controller || new AbortController();
  let done = false;
  await readEvents(resp, (ev) => {
    done = onEvent(ev, li) || done;
  }, controller.signal);
  if (done) finish(li);
  else if (current) status("The stream was cut: reload the page to resume it.");
}

// Sends the request for the answer in progress (`current`) and follows its stream.
async function stream(li, url, init, failure) {
  busy(true);
  controller = new AbortController();
  try {
    const resp = await fetch(url, Object.assign({ headers: headers(init.extra), signal: controller.signal }, init.request));
    if (!resp.ok) {
      current.note = failure + (await errorMessage(resp));
      show(li, current);
      save(PENDING_ITEM, null);
      current = null;
      return;
    }
    status("");
    await follow(resp, li);
  } catch (err) {
    if (current) status("The stream was cut (" + err.message + "): reload the page to resume it.");
  } finally {
    busy(false);
  }
}

async function send(ev) {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || current) return;
  let body;
  const history = load(CHAT_ITEM, []);
  history.push(attached.length ? { role: "user", content: text, images: attached } : { role: "user", content: text });
  try {
    body = requestBody(history);
  } catch (err) {
    status("Tools: not valid JSON (" + err.message + ")");
    return;
  }
  try {
    save(CHAT_ITEM, history);
  } catch (_) {
    status("The images are too large to keep in this tab: send smaller ones.");
    return;
  }
  show(messageItem("user"), history[history.length - 1]);
  $("prompt").value = "";
  attached = [];
  showAttached();
  const li = messageItem("assistant");
  current = { id: null, lastEventId: null, content: "", tool_calls: [], note: "", startedAt: Date.now(), firstAt: null, resumed: false };
  save(PENDING_ITEM, current);
  await stream(li, "/v1/chat/completions", { request: { method: "POST", body: JSON.stringify(body) } }, "error: ");
}

async function resume() {
  current = load(PENDING_ITEM, null);
  if (!current) return;
  const li = messageItem("assistant");
  if (!current.id) {
    save(PENDING_ITEM, null);
    current.note = "the answer was cut before it began: send the message again";
    show(li, current);
    current = null;
    return;
  }
  current.resumed = true;
  show(li, current);
  status("Resuming the answer…");
  const extra = current.lastEventId ? { "Last-Event-ID": current.lastEventId } : {};
  if (!current.lastEventId) {
    current.content = "";
    current.reasoning = "";
  }
  const url = "/v1/chat/completions/" + encodeURIComponent(current.id) + "?stream=true";
  await stream(li, url, { extra }, "could not resume: ");
}

async function stop() {
  if (!current || !current.id) {
    if (controller) controller.abort();
    return;
  }
  const url = "/v1/chat/completions/" + encodeURIComponent(current.id) + "/cancel";
  const resp = await fetch(url, { method: "POST", headers: headers() });
  if (!resp.ok && controller) controller.abort(); // the stream ends by itself after a cancel
}

function clearChat() {
  if (current) return;
  save(CHAT_ITEM, []);
  render();
}

document.addEventListener("DOMContentLoaded", () => {
  setUpKeyForm(loadModels);
  $("ask").addEventListener("submit", send);
  $("stop").addEventListener("click", stop);
  $("clear").addEventListener("click", clearChat);
  $("image").addEventListener("change", (ev) => {
    attach(ev.target.files);
    ev.target.value = "";
  });
  $("prompt").addEventListener("paste", (ev) => {
    const files = [...(ev.clipboardData ? ev.clipboardData.files : [])];
    if (files.some((f) => f.type.startsWith("image/"))) {
      ev.preventDefault();
      attach(files);
    }
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) {
      ev.preventDefault();
      $("ask").requestSubmit();
    }
  });
  render();
  loadModels().then(resume);
});
