// Follows one tokenspool stream with the `eventsource` package, which reconnects by
// itself (sending Last-Event-ID) exactly as browsers do. Prints one JSON line per message
// and per connection error; closes on [DONE]. Usage: node follow.mjs URL [timeout_ms]
import { EventSource } from "eventsource";

const [url, timeoutMs = "60000"] = process.argv.slice(2);
const es = new EventSource(url);
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");

// Never process.exit(): a pipe's writes are asynchronous in Node, and exiting drops those
// still pending (a fast stream's last hundreds of lines). Closing everything lets Node end
// once stdout has drained, with the exit code set here.
const timer = setTimeout(() => {
  out({ timeout: true });
  es.close();
  process.exitCode = 1;
}, Number(timeoutMs));

es.onmessage = (e) => {
  out({ id: e.lastEventId, data: e.data });
  if (e.data === "[DONE]") {
    es.close();
    clearTimeout(timer);
    process.exitCode = 0;
  }
};
es.onerror = (e) => out({ error: e.message ?? "connection error", readyState: es.readyState });
