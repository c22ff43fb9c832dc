// anthropic.test.mjs - the metering proxy's Anthropic route driven by the
// official `@anthropic-ai/sdk` npm package, unmodified, as a real client
// would use it (node --test).
//
// Starts the upstream double and the gateway (harness.mjs, rules of
// tests/sdk/rules.yaml) and checks with
// `new Anthropic({apiKey: subjectKey, baseURL: proxy})` (the SDK appends
// /v1/messages and sends the key as x-api-key):
//   - a plain message is charged exactly the weight of the double's
//     deterministic token counts (1 + input + output for "claude-light");
//   - a streamed message (messages.stream) delivers every text delta and is
//     charged exactly: input from message_start, output from the last
//     message_delta (cumulative, not summed with message_start's 1);
//   - a quota refusal is a 429 RateLimitError carrying the structured body
//     (error.type quota_exceeded); x-should-retry false keeps the SDK from
//     retrying it even with retries allowed, and it never goes upstream.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import {
  stack, start, stop, subjectKey, used, proxyAnswers, doubleCount, doubleLast, words,
} from './harness.mjs';

const MODEL = 'claude-light';
// The double's input tokens: ceil(bytes of the system and message texts / 4).
const inputTokens = (messages, system = '') =>
  Math.ceil(messages.reduce((s, m) => s + Buffer.byteLength(m.content),
    Buffer.byteLength(system)) / 4);
// rules.yaml: claude-light = per_request 1 + 1 point per input or output token.
const weight = (input, output) => 1 + input + output;

// An Anthropic client whose fetch records every request it makes.
function client(apiKey, maxRetries) {
  const sent = [];
  const recordingFetch = async (url, init) => {
    const rec = { url: String(url) };
    sent.push(rec);
    const res = await fetch(url, init);
    rec.status = res.status;
    return res;
  };
  const c = new Anthropic({
    apiKey, baseURL: stack.base, maxRetries, timeout: 30000, fetch: recordingFetch,
  });
  return { c, sent };
}

before(start);
after(stop);

test('plain message is charged the weight of the real tokens', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-a-plain', 'roomy');
  const { c, sent } = client(key, 2);
  const messages = [{ role: 'user', content: 'Count to six, please.' }];
  const r = await c.messages.create({ model: MODEL, max_tokens: 6, messages });
  const p = inputTokens(messages);
  assert.equal(sent.length, 1);
  assert.equal(new URL(sent[0].url).pathname, '/v1/messages');
  assert.equal(r.type, 'message');
  assert.equal(r.model, MODEL);
  assert.equal(r.content[0].type, 'text');
  assert.equal(r.content[0].text, words(6));
  assert.equal(r.stop_reason, 'end_turn');
  assert.deepEqual([r.usage.input_tokens, r.usage.output_tokens], [p, 6]);
  assert.equal(await used('sdk-a-plain', 'burst_5h'), weight(p, 6));
  // The subject key stayed at the gateway; the SDK's anthropic-version went on.
  const last = await doubleLast();
  assert.equal(last.path, '/v1/messages');
  assert.ok(!JSON.stringify(last.headers).includes(key), 'subject key forwarded upstream');
  assert.match(last.headers['anthropic-version'] ?? '', /^\d{4}-\d{2}-\d{2}$/);
});

test('streamed message: all text delivered, charged from the last message_delta', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-a-stream', 'roomy');
  const { c } = client(key, 2);
  const system = 'You are terse.';
  const messages = [{ role: 'user', content: 'Stream nine words to me.' }];
  const stream = c.messages.stream({ model: MODEL, max_tokens: 9, system, messages });
  const deltas = [];
  const events = [];
  stream.on('text', (t) => deltas.push(t));
  stream.on('streamEvent', (e) => events.push(e.type));
  const final = await stream.finalMessage();
  const p = inputTokens(messages, system);
  assert.equal(deltas.length, 9, 'one text delta per token');
  assert.equal(deltas.join(''), words(9));
  assert.equal(final.content[0].text, words(9));
  assert.equal(final.stop_reason, 'end_turn');
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.equal(events.filter((e) => e === 'message_delta').length, 1);
  // The SDK's own accumulation: input from message_start, output from
  // message_delta (9, not 1 + 9).
  assert.deepEqual([final.usage.input_tokens, final.usage.output_tokens], [p, 9]);
  assert.equal((await doubleLast()).body_json.stream, true);
  // The gateway charged the same numbers.
  assert.equal(await used('sdk-a-stream', 'burst_5h'), weight(p, 9));
});

test('quota refusal: 429 APIError with the structured body', { timeout: 30000 }, async () => {
  const key = await subjectKey('sdk-a-capped', 'capped');
  const { c, sent } = client(key, 2);
  const messages = [{ role: 'user', content: 'one question' }];
  const p = inputTokens(messages);
  await c.messages.create({ model: MODEL, max_tokens: 3, messages });
  const refused0 = await proxyAnswers(429, 'messages');
  const upstream0 = await doubleCount();
  sent.length = 0;

  let err;
  try {
    await c.messages.create({ model: MODEL, max_tokens: 3, messages });
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof Anthropic.APIError, `expected an APIError, got ${err}`);
  assert.ok(err instanceof Anthropic.RateLimitError);
  assert.equal(err.status, 429);
  assert.equal(err.type, 'quota_exceeded');
  // The SDK keeps the whole body as .error.
  assert.equal(err.error.error.type, 'quota_exceeded');
  assert.equal(err.error.error.window, 'daily_req');
  assert.match(err.error.error.message, /daily_req/);
  assert.equal(err.error.retryable, true);
  assert.ok(err.error.retry_after_s > 60, 'a long wait');
  assert.match(err.message, /daily_req/);
  assert.equal(err.headers.get('x-should-retry'), 'false');
  assert.ok(Number(err.headers.get('retry-after')) > 60, 'a long wait');

  assert.equal(sent.length, 1, 'the SDK did not retry');
  assert.equal(await proxyAnswers(429, 'messages') - refused0, 1);
  assert.equal(await doubleCount() - upstream0, 0);
  assert.equal(await used('sdk-a-capped', 'burst_5h'), weight(p, 3));
});
