// The official OpenAI client (npm `openai`) against numesh serve: node check.mjs BASE_URL.
// Lists the models, asks for a completion and a chat completion, each whole and streamed (the
// stream's text must add up to the whole one's), and checks that bad requests surface as the
// client's BadRequestError with OpenAI's fields. Prints one line per check; exits 1 when any
// fails.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "unused", maxRetries: 0 });
let failures = 0;
const check = (ok, what) => {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures++;
};

const models = await client.models.list();
const model = models.data[0]?.id;
check(typeof model === "string", `models.list() gives the model (${model})`);

const request = { model, prompt: "hello world", max_tokens: 12, temperature: 0 };
const whole = await client.completions.create(request);
const text = whole.choices[0].text;
check(typeof text === "string" && whole.choices[0].finish_reason === "length",
      `completions.create: ${JSON.stringify(text)} (${whole.choices[0].finish_reason})`);
check(whole.usage.completion_tokens === 12 && whole.usage.prompt_tokens > 0,
      `usage ${JSON.stringify(whole.usage)}`);

let streamed = "";
let finish = null;
for await (const chunk of await client.completions.create({ ...request, stream: true })) {
  streamed += chunk.choices[0].text;
  finish = chunk.choices[0].finish_reason ?? finish;
}
check(streamed === text && finish === "length", `the stream adds up: ${JSON.stringify(streamed)}`);

// ignore_eos (llama-server's extension, passed through by the client as it is): the random model
// may pick its EOS id early, and the checks want 12 tokens.
const chatRequest = {
  model,
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "hello" }],
  max_completion_tokens: 12,
  temperature: 0,
  ignore_eos: true,
};
const chat = await client.chat.completions.create(chatRequest);
const reply = chat.choices[0].message;
check(reply.role === "assistant" && typeof reply.content === "string" &&
        chat.choices[0].finish_reason === "length" && chat.usage.completion_tokens === 12,
      `chat.completions.create: ${JSON.stringify(reply.content)} (${chat.choices[0].finish_reason})`);

let chatStreamed = "";
let role = null;
let chatFinish = null;
for await (const chunk of await client.chat.completions.create({ ...chatRequest, stream: true })) {
  const delta = chunk.choices[0].delta;
  role = role ?? delta.role ?? null;
  chatStreamed += delta.content ?? "";
  chatFinish = chunk.choices[0].finish_reason ?? chatFinish;
}
check(chatStreamed === reply.content && role === "assistant" && chatFinish === "length",
      `the chat stream adds up: ${JSON.stringify(chatStreamed)} (${role}, ${chatFinish})`);

const scored = await client.chat.completions.create({ ...chatRequest, logprobs: true,
                                                     top_logprobs: 2 });
const content = scored.choices[0].logprobs?.content ?? [];
check(content.length === 12 && content.every((e) => e.logprob <= 0 && e.top_logprobs.length === 2 &&
                                                    Array.isArray(e.bytes)),
      `chat logprobs: ${content.length} tokens, the first ${JSON.stringify(content[0])}`);

try {
  await client.chat.completions.create({ model, messages: [] });
  check(false, "empty messages are refused");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "messages" &&
          e.type === "invalid_request_error",
        `empty messages: ${e.constructor.name} ${e.status} param=${e.param} type=${e.type}`);
}

try {
  await client.completions.create({ model, prompt: [1], max_tokens: -1 });
  check(false, "a negative max_tokens is refused");
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "max_tokens" &&
          e.type === "invalid_request_error",
        `a negative max_tokens: ${e.constructor.name} ${e.status} param=${e.param} type=${e.type}`);
}
process.exit(failures === 0 ? 0 : 1);
