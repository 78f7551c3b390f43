// A reasoning model's thinking through openai-node (tests/integration/test_reasoning.py): chat's
// streamed reasoning_content, and the Responses helper's reasoning item and events.
// Usage: node reasoning.mjs <base url> <model>; prints one JSON line with what the client saw.
import OpenAI from "openai";

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
const ask = "Is 17 a prime number?";

const chat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: ask }], max_tokens: 24, temperature: 0, stream: true,
  thinking_budget: 6,
});
let chatThinking = "", chatContent = "";
for await (const chunk of chat) {
  for (const choice of chunk.choices) {
    chatThinking += choice.delta.reasoning_content ?? "";
    chatContent += choice.delta.content ?? "";
  }
}

// The ResponseStream helper accumulates a snapshot and throws on any event it does not know.
const stream = client.responses.stream({ model, input: ask, max_output_tokens: 24, temperature: 0, thinking_budget: 6 });
let deltas = "";
const kinds = [];
for await (const event of stream) {
  kinds.push(event.type);
  if (event.type === "response.reasoning_text.delta") deltas += event.delta;
}
const final = await stream.finalResponse();
const item = final.output.find((o) => o.type === "reasoning");
console.log(JSON.stringify({
  chatThinking, chatContent, deltas, kinds,
  items: final.output.map((o) => o.type),
  itemText: item ? item.content.map((c) => c.text).join("") : null,
  outputText: final.output_text,
}));
