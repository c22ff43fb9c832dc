// openai.test.mjs - the metering proxy driven by the official `openai` npm
// package, unmodified, as a real client would use it (node --test).
//
// Starts tests/upstream's double ($QG_UPSTREAM_BIN, default build/) and
// `$QG_BIN serve --upstream http://127.0.0.1:DOUBLE` (default
// build/quotagate) on free ports in a temporary directory, with the rules
// of tests/sdk/rules.yaml, and checks with `new OpenAI({baseURL: proxy})`:
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
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');
const QG_BIN = process.env.QG_BIN || join(ROOT, 'build', 'quotagate');
const DOUBLE_BIN = process.env.QG_UPSTREAM_BIN || join(ROOT, 'build', 'upstream_double');
const RULES = join(HERE, 'rules.yaml');
const ADMIN_KEY = 'sdk-test-admin-key';
const SERVICE_KEY = 'sdk-test-service-key';
const START_TIMEOUT_MS = 10000;

let tmp;
let dbl;     // {child, port, log}
let srv;     // {child, port, log}
let base;    // http://127.0.0.1:PORT

// Spawn BIN ARGS and resolve with the port of its "<name>: listening on
// http://127.0.0.1:PORT" stdout line.
function startListening(bin, args, env) {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(bin, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const proc = { child, port: 0, log: '' };
    let out = '';
    let done = false;
    const fail = (why) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      child.kill('SIGKILL');
      reject(new Error(`${bin}: ${why}\n---- output ----\n${proc.log}`));
    };
    const timer = setTimeout(() => fail(`no listening line within ${START_TIMEOUT_MS} ms`),
      START_TIMEOUT_MS);
    child.on('error', (e) => fail(e.message));
    child.on('exit', (code, sig) => fail(`exited (${code ?? sig}) before listening`));
    child.stderr.on('data', (d) => { proc.log += d; });
    child.stdout.on('data', (d) => {
      proc.log += d;
      if (done) return;
      out += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(out);
      if (m) {
        done = true;
        clearTimeout(timer);
        proc.port = Number(m[1]);
        resolvePromise(proc);
      }
    });
  });
}

function stop(proc) {
  if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null)
    return Promise.resolve();
  return new Promise((res) => {
    const t = setTimeout(() => proc.child.kill('SIGKILL'), 5000);
    proc.child.once('exit', () => { clearTimeout(t); res(); });
    proc.child.kill('SIGTERM');
  });
}

async function adminPost(path, body) {
  const r = await fetch(`${base}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${ADMIN_KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  const j = await r.json();
  assert.equal(r.status, 200, `${path}: ${JSON.stringify(j)}`);
  return j;
}

// A subject on PLAN and a fresh subject key for it.
async function subjectKey(subject, plan) {
  await adminPost('/v1/admin/subjects', { subject, plan });
  const k = await adminPost('/v1/admin/keys', { subject });
  assert.match(k.key, /^qgk_/);
  return k.key;
}

async function used(subject, window) {
  const r = await fetch(`${base}/v1/usage/${subject}`,
    { headers: { Authorization: `Bearer ${ADMIN_KEY}` } });
  const j = await r.json();
  assert.equal(r.status, 200, JSON.stringify(j));
  const w = j.windows.find((x) => x.name === window);
  assert.ok(w, `no window ${window} in ${JSON.stringify(j)}`);
  return w.used;
}

// quotagate_http_requests_total{route="chat_completions",code=CODE}
async function proxyAnswers(code) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const re = new RegExp(
    `^quotagate_http_requests_total\\{route="chat_completions",code="${code}"\\} (\\d+)$`, 'm');
  const m = re.exec(text);
  return m ? Number(m[1]) : 0;
}

async function doubleCount() {
  const j = await (await fetch(`http://127.0.0.1:${dbl.port}/_double/count`)).json();
  return j.count;
}

async function doubleLast() {
  return (await fetch(`http://127.0.0.1:${dbl.port}/_double/last`)).json();
}

// The double's prompt tokens: ceil(bytes of every message text / 4).
const promptTokens = (messages) =>
  Math.ceil(messages.reduce((s, m) => s + Buffer.byteLength(m.content), 0) / 4);
// rules.yaml: light = per_request 1 + 1 point per input or output token.
const lightWeight = (prompt, completion) => 1 + prompt + completion;
const words = (n) => Array.from({ length: n }, (_, i) => `tok${i}`).join(' ');

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
    apiKey, baseURL: `${base}/v1`, maxRetries, timeout: 30000, fetch: recordingFetch,
  });
  return { c, sent };
}

before(async () => {
  tmp = mkdtempSync(join(tmpdir(), 'qg-sdk-'));
  dbl = await startListening(DOUBLE_BIN, ['--listen', '127.0.0.1:0'], process.env);
  const env = { ...process.env, QUOTAGATE_ADMIN_KEY: ADMIN_KEY, QUOTAGATE_SERVICE_KEY: SERVICE_KEY };
  delete env.QUOTAGATE_UPSTREAM_KEY;
  srv = await startListening(QG_BIN, ['serve', '-c', RULES, '--listen', '127.0.0.1:0',
    '--data', join(tmp, 'data'), '--upstream', `http://127.0.0.1:${dbl.port}`], env);
  base = `http://127.0.0.1:${srv.port}`;
});

after(async () => {
  await stop(srv);
  await stop(dbl);
  if (tmp) rmSync(tmp, { recursive: true, force: true });
});

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
