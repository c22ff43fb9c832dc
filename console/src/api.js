// api.js - the console's calls to the gateway's JSON API (docs/api.md).
// The key lives in this tab's sessionStorage only (never a cookie), and
// goes out as "Authorization: Bearer KEY" to this same origin.  A
// subject's own key reads /v1/usage...; the admin key reads
// /v1/usage/{subject}... and /v1/orgs/{org}/usage.
const KEY_SLOT = 'quotagate.key';

export const key = {
  get: () => sessionStorage.getItem(KEY_SLOT),
  set: (k) => sessionStorage.setItem(KEY_SLOT, k),
  clear: () => sessionStorage.removeItem(KEY_SLOT),
};

// An API error: status and the body's error.type / error.message.
export class ApiError extends Error {
  constructor(status, type, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.type = type || 'http_error';
  }
}

// GET path (with the key when there is one) and its JSON body.
export async function get(path, { auth = true } = {}) {
  const headers = { Accept: 'application/json' };
  const k = key.get();
  if (auth && k) headers.Authorization = `Bearer ${k}`;
  const r = await fetch(path, { headers, cache: 'no-store' });
  let body = null;
  try {
    body = await r.json();
  } catch {
    throw new ApiError(r.status, 'bad_body', `${path}: the answer is not JSON`);
  }
  if (!r.ok) {
    const e = body && body.error ? body.error : {};
    throw new ApiError(r.status, e.type, e.message);
  }
  return body;
}

const enc = encodeURIComponent;

// The paths of one subject's reads: its own (self) or, for the admin
// key, any subject's.
export function subjectPaths(subject, self) {
  const base = self ? '/v1/usage' : `/v1/usage/${enc(subject)}`;
  return {
    usage: base,
    history: (q) => `${base}/history?${new URLSearchParams(q)}`,
    requests: (q) => `${base}/requests?${new URLSearchParams(q)}`,
  };
}

export const whoami = () => get('/v1/whoami');
export const plans = () => get('/v1/plans', { auth: false });
export const orgUsage = (org) => get(`/v1/orgs/${enc(org)}/usage`);
