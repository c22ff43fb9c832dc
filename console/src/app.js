// app.js - the usage console (PRODUCT.md section 7): sign-in with an API
// key, a subject's windows (used / limit / remaining in the plan's unit,
// reset in the browser's zone and the window's own, recovery schedule,
// forecast in words, history chart with the limit), its latest requests,
// its plan's statements and upcoming rule changes; for the admin key any
// subject or an organisation with its members.
//
// Views are addressed by the location's hash: "#/" (a subject key's own
// usage, or the admin's chooser), "#/subject/NAME", "#/org/NAME".  The
// page is built with DOM calls only (no HTML from data), and the stable
// hooks data-window / data-field / data-chart are the tests' and
// assistive technology's way in.
import * as api from './api.js';
import { drawChart } from './plot.js';
import * as fmt from './format.js';

const $ = (id) => document.getElementById(id);

// h('p', {class: 'x', 'data-field': 'used'}, 'text', child...)
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'on') for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const state = { who: null, plans: null, generation: 0 };

function status(text, isError) {
  const el = $('status');
  el.textContent = text || '';
  el.classList.toggle('error', !!isError);
}

async function plansOnce() {
  if (!state.plans) state.plans = await api.plans();
  return state.plans;
}

// The /v1/plans spec of a usage view (concurrency is the plan's number).
function specOf(rules, usage, v) {
  const owner = v.scope === 'org'
    ? (rules.orgs || []).find((o) => o.name === usage.org)
    : (rules.plans || []).find((p) => p.name === usage.plan);
  if (v.type === 'concurrency') return { type: 'concurrency' };
  // an org's window is "org.NAME" in /v1/usage, "NAME" in its org's spec
  const name = v.scope === 'org' && v.name.startsWith('org.') ? v.name.slice(4) : v.name;
  return owner ? (owner.windows || []).find((w) => w.name === name) || null : null;
}

// A window's length in seconds, for choosing the chart's span.
function lengthOf(spec) {
  if (!spec) return 86400;
  if (spec.length_s) return spec.length_s;
  if (spec.per_s) return spec.per_s;
  return { day: 86400, week: 604800, month: 2678400 }[spec.every] || 86400;
}

// The history a chart asks for: twice the window's length (a day at
// least, 90 days at most), hourly up to 8 days, daily beyond.
function historyQuery(name, spec, nowMs) {
  const spanS = Math.min(90 * 86400, Math.max(86400, 2 * lengthOf(spec)));
  const bucket = spanS <= 8 * 86400 ? '1h' : '1d';
  const bucketMs = bucket === '1h' ? 3600e3 : 86400e3;
  const to = Math.ceil(nowMs / bucketMs) * bucketMs;
  return {
    window: name, bucket,
    from: new Date(to - spanS * 1000).toISOString(), to: new Date(to).toISOString(),
  };
}

function figure(label, field, value, unit) {
  return h('div', { class: 'figure' },
    h('dt', {}, label),
    h('dd', {},
      h('span', { class: 'n', 'data-field': field, 'data-value': value }, fmt.num(value)),
      ' ', h('span', { class: 'unit' }, unit)));
}

function recoveryList(v) {
  const steps = v.recovers || [];
  if (!steps.length)
    return h('p', { class: 'recovery' }, v.used > 0 ? 'Nothing comes back before the reset.'
      : 'Nothing is used: there is nothing to recover.');
  const shown = steps.slice(0, 4);
  return h('div', { class: 'recovery' },
    h('span', { class: 'label' }, 'Recovery: '),
    h('ul', {}, shown.map((r) => h('li', {},
      h('time', { datetime: r.at }, fmt.when(r.at)), `: ${fmt.num(r.remaining)} ${v.unit} free`))),
    steps.length > shown.length ? h('span', { class: 'more' }, `and ${steps.length - shown.length} more steps`) : null);
}

// One window's card with the hooks of PRODUCT.md section 7.
function windowCard(v, spec, usageUnit, legacy, withChart) {
  const card = h('article', { class: 'window', 'data-window': v.name, 'aria-label': `window ${v.name}` },
    h('header', {},
      h('h3', {}, v.name),
      h('span', { class: 'kind' }, `${fmt.describe(spec, v)}${v.scope === 'org' ? ' · organisation' : ''}`)),
    h('dl', { class: 'figures' },
      figure('Used', 'used', v.used, v.unit),
      figure('Limit', 'limit', v.limit, v.unit),
      figure('Remaining', 'remaining', v.remaining, v.unit)),
    h('meter', { min: 0, max: v.limit || 1, value: Math.min(v.used, v.limit || 1), 'aria-label': `${v.name} used` }),
    h('p', { class: 'reset' }, h('span', { class: 'label' }, 'Resets: '),
      h('time', { 'data-field': 'reset_at', datetime: v.reset_at || '' }, fmt.resetText(v.reset_at, spec))),
    recoveryList(v),
    h('p', { class: 'forecast', 'data-field': 'forecast' },
      withChart || v.forecast ? fmt.forecastText(v, v.unit || usageUnit, legacy)
        : 'No forecast here: forecasts are made for each member, on their own page.'));
  if (withChart) card.append(h('div', { class: 'chart', 'data-chart': v.name }));
  return card;
}

async function loadChart(card, v, spec, paths, unit, gen) {
  const el = card.querySelector('[data-chart]');
  const nowMs = Date.now();
  const query = historyQuery(v.name, spec, nowMs);
  let history = null;
  let note = null;
  try {
    // requests in flight have no history: the ledger counts requests per
    // bucket, not how many were open at once
    if (v.type === 'concurrency') throw new Error('requests in flight are not kept over time');
    history = await api.get(paths.history(query));
    if (!Array.isArray(history.buckets)) {
      history = null;
      note = 'No history to draw (this gateway does not answer /v1/usage/history); the chart shows the recovery schedule only.';
    }
  } catch (e) {
    note = `No history to draw (${e.message}); the chart shows the recovery schedule only.`;
  }
  if (gen !== state.generation) return;
  drawChart(el, { view: v, unit: v.unit || unit, rollingS: spec && spec.type === 'rolling' ? spec.length_s : 0, history, fromMs: Date.parse(query.from), nowMs });
  if (note) el.append(h('p', { class: 'note' }, note));
}

// The latest ledger rows (/v1/usage/requests, newest first).
function requestsTable(rows) {
  if (!rows.length) return h('p', {}, 'No requests yet.');
  const cols = ['Time', 'Model', 'Tokens', 'Weight', 'Decision', 'Window'];
  return h('table', { class: 'requests' },
    h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, rows.map((r) => {
      const tokens = `${fmt.num(r.input_tokens)} in, ${fmt.num(r.output_tokens)} out${r.estimated ? ' (estimated)' : ''}`;
      const cells = [fmt.stamp(r.time), r.model || '(weight only)', tokens, fmt.num(r.weight),
        `${r.decision}${r.status ? ` (${r.status})` : ''}`, r.window || '–'];
      return h('tr', { 'data-request': r.request_id }, cells.map((c, i) => h('td', { 'data-label': cols[i] }, c)));
    })));
}

async function loadRequests(section, paths, gen) {
  let body;
  try {
    body = await api.get(paths.requests({ limit: 20 }));
  } catch (e) {
    if (gen === state.generation) section.append(h('p', { class: 'note' }, `The latest requests cannot be shown: ${e.message}.`));
    return;
  }
  if (gen !== state.generation) return;
  section.append(requestsTable(body.requests));
}

function statementsSection(plan) {
  const items = plan && plan.statements;
  return h('section', { class: 'block', id: 'statements' },
    h('h2', {}, `What plan ${plan ? plan.name : '?'} promises`),
    items && items.length
      ? h('ul', {}, items.map((s) => h('li', {}, s.text)))
      : h('p', {}, 'This gateway states no multipliers for this plan.'));
}

function changesSection(usage, planName) {
  const list = usage.upcoming_changes;
  let body;
  if (!Array.isArray(list))
    body = h('p', {}, 'This gateway\'s rules have no versions yet, so no changes are announced.');
  else if (!list.length) body = h('p', {}, `No changes are announced for plan ${planName}.`);
  else body = h('ul', {}, list.map((c) => h('li', {},
    c.effective ? h('time', { datetime: c.effective }, `${fmt.when(c.effective)}: `) : null, c.changes || c.version || '')));
  return h('section', { class: 'block', id: 'changes' }, h('h2', {}, 'Upcoming rule changes'), body);
}

async function renderSubject(subject, self) {
  const gen = ++state.generation;
  const paths = api.subjectPaths(subject, self);
  const [usage, rules] = await Promise.all([api.get(paths.usage), plansOnce()]);
  if (gen !== state.generation) return;
  const plan = (rules.plans || []).find((p) => p.name === usage.plan);
  const legacy = Array.isArray(usage.forecast) ? usage.forecast : [];
  const view = $('view');
  const requests = h('section', { class: 'block', id: 'requests' }, h('h2', {}, 'Latest requests'));
  const cards = usage.windows.map((v) => {
    const spec = specOf(rules, usage, v);
    const card = windowCard(v, spec, usage.unit, legacy.find((f) => f.name === v.name), true);
    return { card, v, spec };
  });
  view.replaceChildren(
    h('h1', {}, usage.subject),
    h('p', { class: 'sub' }, `plan ${usage.plan}`, usage.org ? ` · organisation ${usage.org}` : '',
      ` · rules ${usage.rules_version} · in ${usage.unit}`),
    h('section', { class: 'windows' }, cards.map((c) => c.card)),
    requests, statementsSection(plan), changesSection(usage, usage.plan));
  view.hidden = false;
  await Promise.all([
    ...cards.map((c) => loadChart(c.card, c.v, c.spec, paths, usage.unit, gen)),
    loadRequests(requests, paths, gen),
  ]);
  if (gen === state.generation) view.setAttribute('data-ready', '');
}

function memberRow(m, unit) {
  const open = h('a', { href: `#/subject/${encodeURIComponent(m.subject)}` }, m.subject);
  const wins = m.error ? h('span', { class: 'error' }, m.error)
    : h('ul', { class: 'compact' }, (m.windows || []).map((w) => h('li', {},
      `${w.name}: ${fmt.num(w.used)} of ${fmt.num(w.limit)} ${w.unit || unit}`)));
  return h('tr', { 'data-member': m.subject },
    h('td', { 'data-label': 'Member' }, open),
    h('td', { 'data-label': 'Plan' }, m.plan || '–'),
    h('td', { 'data-label': 'Windows' }, wins));
}

async function renderOrg(org) {
  const gen = ++state.generation;
  const [usage, rules] = await Promise.all([api.orgUsage(org), plansOnce()]);
  if (gen !== state.generation) return;
  const spec = (rules.orgs || []).find((o) => o.name === org);
  const bare = (n) => (n.startsWith('org.') ? n.slice(4) : n);
  const specFor = (v) => (spec ? (spec.windows || []).find((w) => w.name === bare(v.name)) : null);
  const view = $('view');
  view.replaceChildren(
    h('h1', {}, `Organisation ${usage.org}`),
    h('p', { class: 'sub' }, `${usage.members_total} member${usage.members_total === 1 ? '' : 's'} · in ${usage.unit}`),
    usage.windows.length
      ? h('section', { class: 'windows' }, usage.windows.map((v) => windowCard(v, specFor(v), usage.unit, null, false)))
      : h('p', {}, 'The organisation\'s windows show once it has a member.'),
    h('section', { class: 'block', id: 'members' }, h('h2', {}, 'Members'),
      usage.members.length
        ? h('table', { class: 'members' },
          h('thead', {}, h('tr', {}, ['Member', 'Plan', 'Windows'].map((c) => h('th', { scope: 'col' }, c)))),
          h('tbody', {}, usage.members.map((m) => memberRow(m, usage.unit))))
        : h('p', {}, 'No members.'),
      usage.truncated ? h('p', { class: 'note' }, `Showing ${usage.members.length} of ${usage.members_total}.`) : null));
  view.hidden = false;
  view.setAttribute('data-ready', '');
}

async function showAdmin() {
  $('admin').hidden = false;
  const rules = await plansOnce();
  const sel = $('org');
  if (!sel.options.length)
    sel.replaceChildren(...(rules.orgs || []).map((o) => h('option', { value: o.name }, o.name)));
}

async function route() {
  const k = api.key.get();
  $('view').hidden = true;
  $('view').removeAttribute('data-ready');
  status('');
  if (!k) {
    $('signin').hidden = false;
    $('admin').hidden = true;
    $('signout').hidden = true;
    $('who').textContent = '';
    $('key').focus();
    return;
  }
  $('signin').hidden = true;
  $('signout').hidden = false;
  try {
    if (!state.who) state.who = await api.whoami();
    const who = state.who;
    $('who').textContent = who.role === 'admin' ? 'admin key' : `signed in as ${who.subject}`;
    const [, kind, name] = /^#\/(subject|org)\/(.+)$/.exec(location.hash) || [];
    if (who.role === 'admin') await showAdmin();
    status('Loading…');
    if (kind === 'org' && who.role === 'admin') await renderOrg(decodeURIComponent(name));
    else if (kind === 'subject' && (who.role === 'admin' || decodeURIComponent(name) === who.subject))
      await renderSubject(decodeURIComponent(name), who.role !== 'admin');
    else if (who.role !== 'admin') await renderSubject(who.subject, true);
    status('');
  } catch (e) {
    if (e.status === 401) {
      signOut();
      $('signin-error').textContent = `Sign-in failed: ${e.message}`;
      return;
    }
    if (e.status === 403 && !state.who) {
      signOut();
      $('signin-error').textContent = 'This key cannot open the console: use a subject\'s key or the admin key.';
      return;
    }
    status(e.message, true);
  }
}

function signOut() {
  api.key.clear();
  state.who = null;
  ++state.generation;
  $('view').replaceChildren();
  route();
}

function init() {
  $('signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const k = $('key').value.trim();
    $('key').value = '';
    $('signin-error').textContent = '';
    if (!k) return;
    api.key.set(k);
    state.who = null;
    route();
  });
  $('signout').addEventListener('click', signOut);
  $('open-subject').addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = `#/subject/${encodeURIComponent($('subject').value.trim())}`;
  });
  $('open-org').addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.hash = `#/org/${encodeURIComponent($('org').value)}`;
  });
  window.addEventListener('hashchange', route);
  route();
}

init();
