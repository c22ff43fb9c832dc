// console.test.mjs - the usage console (GET /console) in a real browser:
// Debian's chromium, headless, driven by playwright-core (node --test).
//
// Starts `$QG_BIN serve` (default build/quotagate) on a free port with a
// temporary --data and tests/console/rules.yaml, makes usage with real
// /v1/check and /v1/settle calls, then:
//   - the page and its assets: Content-Type, Cache-Control, ETag, a CSP
//     without inline script, no URL of another origin in any file, and no
//     request to another origin while the page runs;
//   - a subject key signs in: every window of /v1/usage is on the page
//     with used / limit / remaining / reset_at as the API gives them (read
//     from the data-window / data-field hooks), a chart canvas of non-zero
//     size in its data-chart drawn from /v1/usage/history, and its
//     forecast sentence; the latest requests as /v1/usage/requests lists
//     them; the plan's statements as /v1/plans words them;
//   - at a 375-pixel viewport nothing overflows sideways;
//   - the admin key opens the org and sees its members and its windows;
//   - nothing was logged as an error in the browser console.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(HERE, '..', '..');
const QG_BIN = process.env.QG_BIN || join(ROOT, 'build', 'quotagate');
const CHROMIUM = process.env.QG_CHROMIUM || '/usr/bin/chromium';
const ADMIN_KEY = 'console-test-admin-key';
const SERVICE_KEY = 'console-test-service-key';
const ORG = 'acme';
const MEMBERS = ['con-alice', 'con-bob'];

const srv = { child: null, base: null, tmp: null, log: '' };
let browser;
// everything the browser logged as an error, or threw, on any page
const browserErrors = [];
// requests any page made to another origin
const foreign = [];

function startServer() {
  srv.tmp = mkdtempSync(join(tmpdir(), 'qg-console-'));
  const env = { ...process.env, QUOTAGATE_ADMIN_KEY: ADMIN_KEY, QUOTAGATE_SERVICE_KEY: SERVICE_KEY };
  return new Promise((res, rej) => {
    const child = spawn(QG_BIN, ['serve', '-c', join(HERE, 'rules.yaml'), '--listen', '127.0.0.1:0',
      '--data', join(srv.tmp, 'data')], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    srv.child = child;
    const timer = setTimeout(() => rej(new Error(`no listening line in 10 s\n${srv.log}`)), 10000);
    child.on('exit', (c, s) => rej(new Error(`quotagate exited (${c ?? s})\n${srv.log}`)));
    child.stderr.on('data', (d) => { srv.log += d; });
    child.stdout.on('data', (d) => {
      srv.log += d;
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(srv.log);
      if (m && !srv.base) {
        clearTimeout(timer);
        srv.base = m[1];
        res();
      }
    });
  });
}

async function call(method, path, key, body) {
  const headers = { Authorization: `Bearer ${key}` };
  if (body) headers['Content-Type'] = 'application/json';
  const r = await fetch(`${srv.base}${path}`, { method, headers, body: body && JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

async function ok(method, path, key, body) {
  const r = await call(method, path, key, body);
  assert.equal(r.status, 200, `${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

// A member of the org on plan team, and a key for it.
async function member(subject) {
  await ok('POST', '/v1/admin/subjects', ADMIN_KEY, { subject, plan: 'team', org: ORG });
  return (await ok('POST', '/v1/admin/keys', ADMIN_KEY, { subject })).key;
}

// Real usage: model checks settled with what was produced, one
// cancelled, and a weight-only check; every reservation settled so that
// no concurrency lease is left behind.
async function makeUsage(subject, n) {
  for (let i = 0; i < n; i++) {
    const rid = `${subject}-r${i}`;
    await ok('POST', '/v1/check', SERVICE_KEY, {
      subject, request_id: rid, model: i % 2 ? 'light' : 'standard', input_tokens: 1000 + 100 * i,
      max_output_tokens: 800,
    });
    await ok('POST', '/v1/settle', SERVICE_KEY, {
      request_id: rid, status: i === 2 ? 'cancelled' : 'completed', input_tokens: 1000 + 100 * i,
      output_tokens: 120 + 10 * i,
    });
  }
  const rid = `${subject}-w`;
  await ok('POST', '/v1/check', SERVICE_KEY, { subject, request_id: rid, weight: 2.5 });
  await ok('POST', '/v1/settle', SERVICE_KEY, { request_id: rid, status: 'completed', weight: 2.5 });
}

async function newPage(viewport) {
  const ctx = await browser.newContext({ viewport, timezoneId: 'America/New_York', locale: 'en-US' });
  const page = await ctx.newPage();
  const origin = new URL(srv.base).origin;
  page.on('console', (m) => { if (m.type() === 'error') browserErrors.push(`console: ${m.text()}`); });
  page.on('pageerror', (e) => browserErrors.push(`page: ${e.message}`));
  await page.route('**/*', (route) => {
    const u = route.request().url();
    if (new URL(u).origin === origin || u.startsWith('data:')) return route.continue();
    foreign.push(u);
    return route.abort();
  });
  return page;
}

async function signIn(page, key) {
  await page.goto(`${srv.base}/console`);
  await page.fill('input[name=key]', key);
  await page.click('#signin-form button[type=submit]');
}

// "1,234.5" as the page wrote it (en-US) -> 1234.5
const parseShown = (s) => Number(s.replace(/,/g, '').trim());

before(async () => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing (scripts/deps.sh test installs chromium)`);
  await startServer();
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
});

after(async () => {
  if (browser) await browser.close();
  if (srv.child && srv.child.exitCode === null) {
    await new Promise((res) => {
      const t = setTimeout(() => srv.child.kill('SIGKILL'), 5000);
      srv.child.once('exit', () => { clearTimeout(t); res(); });
      srv.child.kill('SIGTERM');
    });
  }
  if (srv.tmp) rmSync(srv.tmp, { recursive: true, force: true });
});

test('the page and its assets: types, caching, CSP, nothing from another origin', async () => {
  const r = await fetch(`${srv.base}/console`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/html; charset=utf-8/);
  assert.equal(r.headers.get('cache-control'), 'no-cache');
  const csp = r.headers.get('content-security-policy');
  assert.match(csp, /script-src 'self'/);
  assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval/);
  const html = await r.text();
  assert.doesNotMatch(html, /<script(?![^>]*\bsrc=)[^>]*>/, 'an inline script in index.html');
  const assets = [...html.matchAll(/(?:src|href)="(\/console\/[^"]+)"/g)].map((m) => m[1]);
  assert.ok(assets.some((a) => a.endsWith('.js')) && assets.some((a) => a.endsWith('.css')), html);
  const types = { js: /^text\/javascript/, css: /^text\/css/, svg: /^image\/svg\+xml/ };
  for (const a of [...assets, '/console']) {
    const x = await fetch(`${srv.base}${a}`);
    assert.equal(x.status, 200, a);
    const ext = a.split('.').pop();
    if (types[ext]) {
      assert.match(x.headers.get('content-type'), types[ext], a);
      assert.match(x.headers.get('cache-control'), /immutable/, a);
    }
    const text = await x.text();
    // XML namespace names are not fetched; any other URL would be
    const urls = [...text.matchAll(/https?:\/\/[^\s"'`)<>]+/g)].map((m) => m[0])
      .filter((u) => !u.startsWith('http://www.w3.org/'));
    assert.deepEqual(urls, [], `${a} names another origin`);
    const etag = x.headers.get('etag');
    assert.ok(etag, `${a} has no ETag`);
    const again = await fetch(`${srv.base}${a}`, { headers: { 'If-None-Match': etag } });
    assert.equal(again.status, 304, `${a} revalidated`);
  }
});

test('a subject key: every window as /v1/usage gives it, chart, forecast, 375 px', { timeout: 60000 }, async () => {
  const keys = {};
  for (const m of MEMBERS) keys[m] = await member(m);
  await makeUsage(MEMBERS[0], 5);
  await makeUsage(MEMBERS[1], 2);
  const subject = MEMBERS[0];
  const before = await ok('GET', '/v1/usage', keys[subject]);
  const page = await newPage({ width: 1280, height: 900 });
  await signIn(page, keys[subject]);
  await page.waitForSelector('#view[data-ready]', { timeout: 20000 });
  const after = await ok('GET', '/v1/usage', keys[subject]);
  assert.equal(await page.textContent('#view h1'), subject);
  assert.ok(before.windows.length >= 4, JSON.stringify(before));

  for (const v of before.windows) {
    const w = after.windows.find((x) => x.name === v.name && x.scope === v.scope);
    const sel = `[data-window="${v.name}"]`;
    assert.equal(await page.locator(sel).count(), 1, `${v.name} on the page once`);
    const card = page.locator(sel);
    for (const field of ['used', 'limit', 'remaining']) {
      const el = card.locator(`[data-field="${field}"]`);
      const shown = parseShown(await el.textContent());
      assert.equal(Number(await el.getAttribute('data-value')), shown, `${v.name}.${field} text and value`);
      // a rate window drains between the two reads: the page's figure lies
      // between them; every other window holds still
      const [lo, hi] = [Math.min(v[field], w[field]), Math.max(v[field], w[field])];
      assert.ok(shown >= lo - 0.001 && shown <= hi + 0.001,
        `${v.name}.${field}: page ${shown}, /v1/usage ${v[field]} then ${w[field]}`);
      if (v.type !== 'rate') assert.equal(shown, v[field], `${v.name}.${field}`);
    }
    const reset = await card.locator('[data-field="reset_at"]').getAttribute('datetime');
    if (v.type !== 'rate' && v.type !== 'concurrency') assert.equal(reset, v.reset_at || '', `${v.name}.reset_at`);
    const resetText = await card.locator('[data-field="reset_at"]').textContent();
    if (v.reset_at) assert.match(resetText, /your time \(America\/New_York\)/, resetText);
    if (v.name === 'weekly') assert.match(resetText, /Europe\/Berlin, the window's zone/, resetText);

    const forecast = (await card.locator('[data-field="forecast"]').textContent()).trim();
    if (v.forecast && 'exhausted_at' in v.forecast) {
      assert.match(forecast, /^At your pace of the last /, forecast);
      assert.equal(/run out/.test(forecast) && !/does not run out/.test(forecast), !!v.forecast.exhausted_at, forecast);
    } else {
      const legacy = (before.forecast || []).find((f) => f.name === v.name);
      assert.ok(legacy, `${v.name}: no forecast of any kind in /v1/usage`);
      assert.match(forecast, legacy.full_at ? /^If nothing more is used, all of it is back / : /^(If nothing more is used|Nothing used yet)/, forecast);
    }

    const canvas = card.locator(`[data-chart="${v.name}"] canvas`).first();
    const box = await canvas.boundingBox();
    assert.ok(box && box.width > 0 && box.height > 0, `${v.name}: chart of ${JSON.stringify(box)}`);
  }
  // every chart drew its history (no note that it could not be read),
  // but concurrency's, which has none
  for (const v of before.windows)
    assert.equal(await page.locator(`[data-chart="${v.name}"] .note`).count(), v.type === 'concurrency' ? 1 : 0, v.name);
  // the latest requests, newest first, as /v1/usage/requests lists them
  const latest = await ok('GET', '/v1/usage/requests?limit=20', keys[subject]);
  assert.ok(latest.requests.length >= 6, JSON.stringify(latest));
  const rows = await page.locator('#requests tr[data-request]').evaluateAll((els) => els.map((e) => e.dataset.request));
  assert.deepEqual(rows, latest.requests.map((r) => r.request_id));
  // the plan's statements, as /v1/plans words them
  const plans = await (await fetch(`${srv.base}/v1/plans`)).json();
  const team = plans.plans.find((p) => p.name === 'team');
  assert.ok(team.statements.length >= 2, JSON.stringify(team));
  const shownStatements = await page.locator('#statements li').allTextContents();
  assert.deepEqual(shownStatements, team.statements.map((s) => s.text));

  // a phone: nothing wider than the screen
  await page.setViewportSize({ width: 375, height: 800 });
  await page.waitForTimeout(300);
  const widths = await page.evaluate(() => [document.documentElement.scrollWidth, document.body.scrollWidth]);
  assert.ok(widths[0] <= 375 && widths[1] <= 375, `scrollWidth ${widths} at 375 px`);
  // signed in from the start at 375 px too (the key stays in the tab)
  await page.reload();
  await page.waitForSelector('#view[data-ready]', { timeout: 20000 });
  const w2 = await page.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(w2 <= 375, `scrollWidth ${w2} after a reload at 375 px`);
  const cookies = await page.context().cookies();
  assert.deepEqual(cookies, [], 'the key must never be a cookie');
  await page.context().close();
});

test('the admin key opens the org and sees its members', { timeout: 60000 }, async () => {
  const page = await newPage({ width: 375, height: 800 });
  await signIn(page, ADMIN_KEY);
  await page.waitForSelector('#admin:not([hidden])');
  await page.selectOption('#org', ORG);
  await page.click('#open-org button[type=submit]');
  await page.waitForSelector('#view[data-ready]', { timeout: 20000 });
  const api = await ok('GET', `/v1/orgs/${ORG}/usage`, ADMIN_KEY);
  const expected = [...MEMBERS, 'con-static'].sort();
  assert.deepEqual(api.members.map((m) => m.subject), expected);
  const shown = await page.locator('[data-member]').evaluateAll((els) => els.map((e) => e.dataset.member));
  assert.deepEqual(shown, expected);
  assert.ok(api.windows.some((w) => w.name === 'org.monthly'), JSON.stringify(api));
  for (const v of api.windows) {
    const card = page.locator(`[data-window="${v.name}"]`);
    for (const field of ['used', 'limit', 'remaining'])
      assert.equal(parseShown(await card.locator(`[data-field="${field}"]`).textContent()), v[field], `${v.name}.${field}`);
  }
  // the org's monthly window counts both members' usage
  const used = await Promise.all(MEMBERS.map(async (m) =>
    (await ok('GET', `/v1/usage/${m}`, ADMIN_KEY)).windows.find((w) => w.name === 'burst_5h').used));
  assert.equal(api.windows.find((w) => w.name === 'org.monthly').used, used[0] + used[1]);
  // a member opens from the org's list
  await page.click(`[data-member="${MEMBERS[1]}"] a`);
  await page.waitForFunction((s) => document.querySelector('#view[data-ready] h1')?.textContent === s, MEMBERS[1]);
  const w = await page.evaluate(() => document.documentElement.scrollWidth);
  assert.ok(w <= 375, `scrollWidth ${w} of a member opened by the admin`);
  await page.context().close();
});

test('nothing logged as an error, nothing asked of another origin', () => {
  assert.deepEqual(browserErrors, []);
  assert.deepEqual(foreign, []);
});
