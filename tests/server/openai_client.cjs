// `specula serve` with the real `openai` npm package (pinned in scripts/setup_server_tests.sh), run
// by tests/server/test_openai_client.py against its server: chat and completions, streaming and
// not, the client's streaming API, stop strings, response_format, logprobs, n, and a tool call on a
// second server (argv[3]) with a tool template. Exits non-zero (with the reason) on any mismatch.
const OpenAI = require("openai");
const assert = require("node:assert/strict");

async function main() {
  const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "unused", maxRetries: 0 });
  const model = "specula-target";
  const messages = [{ role: "user", content: "How do I open a file in Python?" }];

  const full = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0 });
  assert.ok(full.choices[0].message.content.length > 0);
  assert.ok(full.usage.completion_tokens > 0);

  let text = "", usage = null, finish = null;
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 32, temperature: 0, stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? "";
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(text, full.choices[0].message.content);
  assert.equal(finish, full.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, full.usage.completion_tokens);

  const helper = client.chat.completions.stream({ model, messages, max_tokens: 32, temperature: 0 });
  let deltas = "";
  helper.on("content", (delta) => { deltas += delta; });
  const final = await helper.finalChatCompletion();
  assert.equal(final.choices[0].message.content, full.choices[0].message.content);
  assert.equal(deltas, full.choices[0].message.content);

  const prompt = "def read_config(path):";
  const plain = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0 });
  let streamed = "";
  for await (const chunk of await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0, stream: true })) {
    streamed += chunk.choices.map((c) => c.text).join("");
  }
  assert.ok(plain.choices[0].text.length > 0);
  assert.equal(streamed, plain.choices[0].text);

  await assert.rejects(client.chat.completions.create({ model, messages, n: 9 }), (e) => e.status === 400 && e.param === "n");

  // stop: the text up to the stop string's first occurrence, streamed and not.
  const whole = full.choices[0].message.content;
  const stop = whole.slice(12, 15);
  assert.equal(stop.length, 3);
  const cut = whole.slice(0, whole.indexOf(stop));
  const stopped = await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0, stop: [stop] });
  assert.equal(stopped.choices[0].message.content, cut);
  assert.equal(stopped.choices[0].finish_reason, "stop");
  let stoppedStream = "";
  for await (const chunk of await client.chat.completions.create({ model, messages, max_tokens: 32, temperature: 0, stop: [stop], stream: true })) {
    for (const c of chunk.choices) stoppedStream += c.delta.content ?? "";
  }
  assert.equal(stoppedStream, cut);

  // response_format json_schema: the reply parses and has the schema's keys.
  const schema = { type: "object", properties: { name: { type: "string", maxLength: 8 }, age: { type: "integer" } },
    required: ["name", "age"], additionalProperties: false };
  const structured = await client.chat.completions.create({ model, messages, max_tokens: 64, temperature: 0,
    response_format: { type: "json_schema", json_schema: { name: "person", schema } } });
  assert.deepEqual(Object.keys(JSON.parse(structured.choices[0].message.content)).sort(), ["age", "name"]);

  // logprobs: one entry per token, each with its two alternatives.
  const scored = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 2 });
  const entries = scored.choices[0].logprobs.content;
  assert.equal(entries.length, scored.usage.completion_tokens);
  for (const e of entries) {
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 2);
  }

  // n: two choices, the same greedy text.
  const two = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, n: 2 });
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  assert.equal(two.choices[0].message.content, two.choices[1].message.content);

  // A tool call, from the server with a tool template: parsed into message.tool_calls.
  const tools = new OpenAI({ baseURL: process.argv[3] + "/v1", apiKey: "unused", maxRetries: 0 });
  const weather = { type: "function", function: { name: "get_weather", parameters: {
    type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome"] } }, required: ["city"] } } };
  const called = await tools.chat.completions.create({ model, messages: [{ role: "user", content: "Weather in Paris?" }], tools: [weather],
    tool_choice: "required", parallel_tool_calls: false, max_tokens: 200, temperature: 0 });
  assert.equal(called.choices[0].finish_reason, "tool_calls");
  assert.equal(called.choices[0].message.tool_calls.length, 1);
  assert.equal(called.choices[0].message.tool_calls[0].function.name, "get_weather");
  assert.ok(["Paris", "Rome"].includes(JSON.parse(called.choices[0].message.tool_calls[0].function.arguments).city));
  console.log("ok");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
