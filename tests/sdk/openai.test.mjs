// openai.test.mjs - the metering proxy driven by the official `openai` npm
// package, unmodified, as a real client would use it (node --test).
//
// Starts the upstream double and the gateway (harness.mjs, rules of
// tests/sdk/rules.yaml) and checks with `new OpenAI({baseURL: proxy})`:
//   - a plain chat completion is charged exactly the weight of the double's
//     deterministic token counts (1 + prompt + completion for "light");
//   - a stream the caller did not ask usage for yields every content chunk,
//     no usage-only chunk, and is charged exactly;
//   - a short refusal (x-should-retry true, Retry-After <= 2 s) is retried
//     once by the SDK after waiting what the headers said, then succeeds;
//   - a long refusal (x-should-retry false) is a 429 APIError carrying the
//     structured body (error.type quota_exceeded) and is not retried.
// Requests are counted three ways: a fetch wrapper (what the SDK sent),
// /metrics (what the proxy answered) and /_double/count (what reached the
// upstream).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import {
  stack, start, stop, subjectKey, used, proxyAnswers, doubleCount, doubleLast, words,
} from './harness.mjs';

// The double's prompt tokens: ceil(bytes of every message text / 4).
const promptTokens = (messages) =>
  Math.ceil(messages.reduce((s, m) => s + Buffer.byteLength(m.content), 0) / 4);
// rules.yaml: light = per_request 1 + 1 point per input or output token.
const lightWeight = (prompt, completion) => 1 + prompt + completion;
// rules.yaml: large = per_request 2 + 1 point per input or output token.
const largeWeight = (prompt, completion) => 2 + prompt + completion;

// An OpenAI client whose fetch records every request it makes.
function client(apiKey, maxRetries) {
  const sent = [];
  const recordingFetch = async (url, init) => {
    const rec = { url: String(url), start: performance.now() };
    sent.push(rec);
    const res = await fetch(url, init);
    rec.end = performance.now();
    rec.status = res.status;
    rec.headers = res.headers;
    return res;
  };
  const c = new OpenAI({
    apiKey, baseURL: `${stack.base}/v1`, maxRetries, timeout: 30000, fetch: recordingFetch,
  });
  return { c, sent };
}

before(start);
after(stop);

test('plain chat completion is charged the weight of the real tokens', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-plain', 'roomy');
  const { c } = client(key, 2);
  const messages = [{ role: 'user', content: 'Count to five, please.' }];
  const r = await c.chat.completions.create({ model: 'light', messages, max_tokens: 5 });
  const p = promptTokens(messages);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.content, words(5));
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens], [p, 5]);
  assert.equal(await used('sdk-plain', 'burst_5h'), lightWeight(p, 5));
  // The subject key stayed at the gateway.
  const last = await doubleLast();
  assert.equal(last.path, '/v1/chat/completions');
  assert.ok(!JSON.stringify(last.headers).includes(key), 'subject key forwarded upstream');
});

test('stream without include_usage: all content, no usage chunk, charged exactly', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-stream', 'roomy');
  const { c } = client(key, 2);
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Stream eight words to me.' },
  ];
  const stream = await c.chat.completions.create(
    { model: 'light', messages, max_tokens: 8, stream: true });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const content = chunks.map((ch) => ch.choices[0]?.delta?.content ?? '').join('');
  assert.equal(content, words(8));
  assert.equal(chunks.filter((ch) => ch.choices[0]?.delta?.content).length, 8,
    'one chunk per token');
  assert.ok(chunks.every((ch) => ch.choices.length === 1), 'a usage-only chunk reached the caller');
  assert.ok(chunks.every((ch) => !ch.usage), 'usage reached the caller');
  assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  // The gateway asked the upstream for usage on the caller's behalf...
  const last = await doubleLast();
  assert.equal(last.body_json.stream_options?.include_usage, true);
  // ...and charged it exactly.
  const p = promptTokens(messages);
  assert.equal(await used('sdk-stream', 'burst_5h'), lightWeight(p, 8));
});

test('short refusal: the SDK waits Retry-After, retries once and succeeds', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-paced', 'paced');
  const { c, sent } = client(key, 1);
  const messages = [{ role: 'user', content: 'hi' }];
  const p = promptTokens(messages);
  // The first call takes the rate window's only request for 2 s.
  await c.chat.completions.create({ model: 'light', messages, max_tokens: 2 });
  assert.equal(sent.length, 1);
  const ok0 = await proxyAnswers(200), refused0 = await proxyAnswers(429);
  const upstream0 = await doubleCount();

  const t0 = performance.now();
  const r = await c.chat.completions.create({ model: 'light', messages, max_tokens: 2 });
  const elapsed = performance.now() - t0;
  assert.equal(r.choices[0].message.content, words(2));

  assert.equal(sent.length, 3, 'the SDK retried exactly once');
  const [, refusal, retry] = sent;
  assert.equal(refusal.status, 429);
  assert.equal(refusal.headers.get('x-should-retry'), 'true');
  const ra = Number(refusal.headers.get('retry-after'));
  const raMs = Number(refusal.headers.get('retry-after-ms'));
  assert.ok(ra >= 1 && ra <= 2, `Retry-After ${ra}`);
  assert.ok(raMs > (ra - 1) * 1000 && raMs <= ra * 1000, `retry-after-ms ${raMs} vs ${ra}`);
  assert.equal(retry.status, 200);
  // The SDK waited what it was told (it prefers retry-after-ms, the exact
  // value behind the rounded-up Retry-After); timers may fire ~1 ms early.
  const wait = retry.start - refusal.end;
  assert.ok(wait >= raMs - 5, `waited ${wait.toFixed(1)} ms, told ${raMs} ms`);
  assert.ok(elapsed >= raMs - 5 && elapsed >= (ra - 1) * 1000, `elapsed ${elapsed.toFixed(1)} ms`);
  assert.ok(elapsed < 20000, `elapsed ${elapsed.toFixed(1)} ms`);

  // The proxy answered one refusal and one success; only the retry went upstream.
  assert.equal(await proxyAnswers(429) - refused0, 1);
  assert.equal(await proxyAnswers(200) - ok0, 1);
  assert.equal(await doubleCount() - upstream0, 1);
  const last = await doubleLast();
  assert.equal(last.headers['x-stainless-retry-count'], '1');
  // Two admitted calls charged; the refusal charged nothing.
  assert.equal(await used('sdk-paced', 'burst_5h'), 2 * lightWeight(p, 2));
});

test('long refusal: 429 APIError with the structured body, not retried', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-capped', 'capped');
  const { c, sent } = client(key, 2);
  const messages = [{ role: 'user', content: 'one question' }];
  const p = promptTokens(messages);
  await c.chat.completions.create({ model: 'light', messages, max_tokens: 3 });
  const refused0 = await proxyAnswers(429);
  const upstream0 = await doubleCount();
  sent.length = 0;

  let err;
  try {
    await c.chat.completions.create({ model: 'light', messages, max_tokens: 3 });
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof OpenAI.APIError, `expected an APIError, got ${err}`);
  assert.ok(err instanceof OpenAI.RateLimitError);
  assert.equal(err.status, 429);
  assert.equal(err.type, 'quota_exceeded');
  assert.equal(err.error.type, 'quota_exceeded');
  assert.equal(err.error.window, 'daily_req');
  assert.match(err.error.message, /daily_req/);
  assert.equal(err.headers.get('x-should-retry'), 'false');
  assert.ok(Number(err.headers.get('retry-after')) > 60, 'a long wait');
  assert.match(err.headers.get('x-request-id') ?? '', /./);

  assert.equal(sent.length, 1, 'the SDK did not retry');
  assert.equal(await proxyAnswers(429) - refused0, 1);
  assert.equal(await doubleCount() - upstream0, 0);
  assert.equal(await used('sdk-capped', 'burst_5h'), lightWeight(p, 3));
});

test('downgrade: the response names the lighter model, headers say so', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-dg', 'dg');
  const { c } = client(key, 0);
  const messages = [{ role: 'user', content: 'hi' }];
  const p = promptTokens(messages);
  // 2 + 1 + 15 = 18 of large_5h's 20 points: served by "large" itself.
  const first = await c.chat.completions.create({ model: 'large', messages, max_tokens: 15 });
  assert.equal(first.model, 'large');
  assert.equal(await used('sdk-dg', 'large_5h'), largeWeight(p, 15));
  const upstream0 = await doubleCount();

  // The next "large" call (2 + 1 + 5 more) does not fit: downgraded to "light".
  const { data: r, response } = await c.chat.completions
    .create({ model: 'large', messages, max_tokens: 5 }).withResponse();
  assert.equal(response.status, 200);
  assert.equal(r.model, 'light', 'the SDK reports the model that served the call');
  assert.equal(r.choices[0].message.content, words(5));
  assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens], [p, 5]);
  assert.equal(response.headers.get('x-quotagate-downgraded-from'), 'large');
  assert.equal(response.headers.get('x-quotagate-model'), 'light');
  // The upstream was asked for "light", once.
  assert.equal(await doubleCount() - upstream0, 1);
  assert.equal((await doubleLast()).body_json.model, 'light');
  // Charged as "light"; the large window was not charged again.
  assert.equal(await used('sdk-dg', 'light_5h'), lightWeight(p, 5));
  assert.equal(await used('sdk-dg', 'large_5h'), largeWeight(p, 15));
  assert.equal(await used('sdk-dg', 'burst_5h'), largeWeight(p, 15) + lightWeight(p, 5));
});
