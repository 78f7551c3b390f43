// Anthropic's Messages API through @anthropic-ai/sdk (tests/integration/test_messages.py).
// Usage: node messages.mjs <base url> <api key> <model> <case>; prints one JSON line with what the client saw.
import Anthropic from "@anthropic-ai/sdk";

const [base, apiKey, model, which] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey, maxRetries: 0 });
const ask = [{ role: "user", content: "Tell me about foxes." }];
const story = {
  name: "save_story",
  description: "Save a short story.",
  input_schema: {
    type: "object",
    properties: { title: { type: "string" }, story: { type: "string", minLength: 40, maxLength: 120 } },
    required: ["title", "story"],
  },
};

const cases = {
  // The MessageStream helper accumulates the message from the events and throws on any it cannot place.
  async stream() {
    const stream = client.messages.stream({ model, max_tokens: 24, messages: ask, temperature: 0 });
    let text = "";
    const kinds = [];
    stream.on("text", (delta) => { text += delta; });
    for await (const event of stream) kinds.push(event.type);
    const final = await stream.finalMessage();
    const created = await client.messages.create({ model, max_tokens: 24, messages: ask, temperature: 0 });
    const counted = await client.messages.countTokens({ model, messages: ask });
    return {
      text, kinds, final_text: final.content[0].text, stop_reason: final.stop_reason,
      created_text: created.content[0].text, usage: final.usage, counted: counted.input_tokens,
    };
  },
  // A tool call streamed as input_json deltas, its input parsed by the helper, then its result sent back.
  async tool() {
    const first = [{ role: "user", content: "Write and save a story about a fox." }];
    const choice = { type: "any", disable_parallel_tool_use: true };
    const stream = client.messages.stream({ model, max_tokens: 200, tools: [story], tool_choice: choice, messages: first, temperature: 0 });
    let json = "";
    stream.on("inputJson", (partial) => { json += partial; });
    const final = await stream.finalMessage();
    const call = final.content.find((b) => b.type === "tool_use");
    const answer = await client.messages.create({
      model, max_tokens: 12, tools: [story], tool_choice: { type: "none" }, temperature: 0,
      messages: [...first, { role: "assistant", content: final.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "Saved." }] }],
    });
    return { streamed: JSON.parse(json), input: call.input, stop_reason: final.stop_reason, answer: answer.content.map((b) => b.type) };
  },
  // Anthropic's error shape becomes the SDK's typed errors.
  async errors() {
    const out = {};
    try { await client.messages.create({ model, max_tokens: 8, messages: [{ role: "assistant", content: "x" }] }); }
    catch (e) { out.bad = [e.constructor.name, e.status, e.error?.error?.type]; }
    try { await client.messages.create({ model: "no-such-model", max_tokens: 8, messages: ask }); }
    catch (e) { out.missing = [e.constructor.name, e.status, e.error?.error?.type]; }
    try { await new Anthropic({ baseURL: base, apiKey: "wrong", maxRetries: 0 }).messages.create({ model, max_tokens: 8, messages: ask }); }
    catch (e) { out.key = [e.constructor.name, e.status, e.error?.error?.type]; }
    return out;
  },
};

const result = await cases[which]();
console.log(JSON.stringify(result));
