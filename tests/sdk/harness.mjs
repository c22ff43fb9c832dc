// harness.mjs - shared by the tests/sdk/*.test.mjs files: starts
// tests/upstream's double ($QG_UPSTREAM_BIN, default build/) and
// `$QG_BIN serve --upstream http://127.0.0.1:DOUBLE` (default
// build/quotagate) on free ports in a temporary directory with the rules of
// tests/sdk/rules.yaml, and offers the admin, usage, metrics and double
// look-ups the tests check with.  Not a test file itself (node --test only
// runs *.test.mjs here).
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');
const QG_BIN = process.env.QG_BIN || join(ROOT, 'build', 'quotagate');
const DOUBLE_BIN = process.env.QG_UPSTREAM_BIN || join(ROOT, 'build', 'upstream_double');
const RULES = join(HERE, 'rules.yaml');
export const ADMIN_KEY = 'sdk-test-admin-key';
export const SERVICE_KEY = 'sdk-test-service-key';
const START_TIMEOUT_MS = 10000;

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

function stopProc(proc) {
  if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null)
    return Promise.resolve();
  return new Promise((res) => {
    const t = setTimeout(() => proc.child.kill('SIGKILL'), 5000);
    proc.child.once('exit', () => { clearTimeout(t); res(); });
    proc.child.kill('SIGTERM');
  });
}

// The running double and gateway (filled by start(), emptied by stop()).
export const stack = { tmp: null, dbl: null, srv: null, base: null };

export async function start() {
  stack.tmp = mkdtempSync(join(tmpdir(), 'qg-sdk-'));
  stack.dbl = await startListening(DOUBLE_BIN, ['--listen', '127.0.0.1:0'], process.env);
  const env = { ...process.env, QUOTAGATE_ADMIN_KEY: ADMIN_KEY, QUOTAGATE_SERVICE_KEY: SERVICE_KEY };
  delete env.QUOTAGATE_UPSTREAM_KEY;
  stack.srv = await startListening(QG_BIN, ['serve', '-c', RULES, '--listen', '127.0.0.1:0',
    '--data', join(stack.tmp, 'data'), '--upstream', `http://127.0.0.1:${stack.dbl.port}`], env);
  stack.base = `http://127.0.0.1:${stack.srv.port}`;
  return stack;
}

export async function stop() {
  await stopProc(stack.srv);
  await stopProc(stack.dbl);
  if (stack.tmp) rmSync(stack.tmp, { recursive: true, force: true });
  stack.tmp = stack.dbl = stack.srv = stack.base = null;
}

export async function adminPost(path, body) {
  const r = await fetch(`${stack.base}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${ADMIN_KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  const j = await r.json();
  assert.equal(r.status, 200, `${path}: ${JSON.stringify(j)}`);
  return j;
}

// A subject on PLAN and a fresh subject key for it.
export async function subjectKey(subject, plan) {
  await adminPost('/v1/admin/subjects', { subject, plan });
  const k = await adminPost('/v1/admin/keys', { subject });
  assert.match(k.key, /^qgk_/);
  return k.key;
}

// The points SUBJECT has used in WINDOW.
export async function used(subject, window) {
  const r = await fetch(`${stack.base}/v1/usage/${subject}`,
    { headers: { Authorization: `Bearer ${ADMIN_KEY}` } });
  const j = await r.json();
  assert.equal(r.status, 200, JSON.stringify(j));
  const w = j.windows.find((x) => x.name === window);
  assert.ok(w, `no window ${window} in ${JSON.stringify(j)}`);
  return w.used;
}

// quotagate_http_requests_total{route=ROUTE,code=CODE}
export async function proxyAnswers(code, route = 'chat_completions') {
  const text = await (await fetch(`${stack.base}/metrics`)).text();
  const re = new RegExp(
    `^quotagate_http_requests_total\\{route="${route}",code="${code}"\\} (\\d+)$`, 'm');
  const m = re.exec(text);
  return m ? Number(m[1]) : 0;
}

export async function doubleCount() {
  const j = await (await fetch(`http://127.0.0.1:${stack.dbl.port}/_double/count`)).json();
  return j.count;
}

export async function doubleLast() {
  return (await fetch(`http://127.0.0.1:${stack.dbl.port}/_double/last`)).json();
}

// The double's completion text for N tokens: "tok0 tok1 ...".
export const words = (n) => Array.from({ length: n }, (_, i) => `tok${i}`).join(' ');
