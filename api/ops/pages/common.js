// What both pages share: the API key (kept in this tab's sessionStorage), authorised
// requests, and a reader of Server-Sent Events from a fetch() response.
"use strict";

const KEY_ITEM = "tokenspool.key";

function apiKey() {
  return sessionStorage.getItem(KEY_ITEM) || "";
}

function headers(extra) {
  const h = Object.assign({ "Content-Type": "application/json" }, extra || {});
  const key = apiKey();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

// A key form: <form id="key-form"><input id="key"> ... ; calls onSaved after a change.
function setUpKeyForm(onSaved) {
  const form = document.getElementById("key-form");
  const input = document.getElementById("key");
  input.value = apiKey();
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY_ITEM, input.value.trim());
    onSaved();
  });
}

async function errorMessage(resp) {
  try {
    const body = await resp.json();
    if (body && body.error && body.error.message) return body.error.message;
  } catch (_) {
    // not JSON: the status says it
  }
  return "HTTP " + resp.status;
}

// Reads an SSE body: calls onEvent({id, data, comments}) per event; resolves at its end.
async function readEvents(resp, onEvent, signal) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let event = { id: null, data: [], comments: [] };
  for (;;) {
    if (signal && signal.aborted) {
      await reader.cancel();
      return;
    }
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl).replace(/\r$/, "");
      buffer = buffer.slice(nl + 1);
      if (line === "") {
        if (event.data.length) onEvent({ id: event.id, data: event.data.join("\n"), comments: event.comments });
        event = { id: null, data: [], comments: [] };
      } else if (line.startsWith(":")) {
        event.comments.push(line.slice(1).trim());
      } else if (line.startsWith("id:")) {
        event.id = line.slice(3).trim();
      } else if (line.startsWith("data:")) {
        event.data.push(line.slice(5).replace(/^ /, ""));
      }
    }
  }
}
