// `specula serve` with the real `openai` npm package (pinned in scripts/setup_server_tests.sh), run
// by tests/server/test_openai_client.py against its server: chat and completions, streaming and
// not, and the client's stream helper. Exits non-zero (with the reason) on any mismatch.
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
  console.log("ok");
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
