// format.js - the console's words and numbers: quantities in the plan's
// unit, instants in the browser's zone and a window's own, durations,
// and the forecast sentence of PRODUCT.md section 7.  Pure functions of
// what the API answered; nothing here computes usage.
const BROWSER_TZ = Intl.DateTimeFormat().resolvedOptions().timeZone;
export const browserZone = () => BROWSER_TZ;

const numFmt = new Intl.NumberFormat(undefined, { maximumFractionDigits: 3 });
export const num = (v) => (v === null || v === undefined ? '–' : numFmt.format(v));

// "Thu 14:00" in zone tz (the browser's when undefined), with the date
// when it is not within the coming week.
export function when(iso, tz) {
  const d = new Date(iso);
  const far = Math.abs(d - Date.now()) > 6 * 86400e3;
  const opts = { weekday: 'short', hour: '2-digit', minute: '2-digit', hourCycle: 'h23' };
  if (far) Object.assign(opts, { day: 'numeric', month: 'short' });
  if (tz) opts.timeZone = tz;
  return new Intl.DateTimeFormat(undefined, opts).format(d);
}

// "2026-12-03 14:05:09" in the browser's zone (the requests table).
export function stamp(iso) {
  const d = new Date(iso);
  return new Intl.DateTimeFormat(undefined, {
    year: 'numeric', month: '2-digit', day: '2-digit',
    hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23',
  }).format(d);
}

// A span in words: "2 days", "5 hours", "40 minutes", "under a minute".
export function span(seconds) {
  const s = Math.abs(seconds);
  const units = [[86400, 'day'], [3600, 'hour'], [60, 'minute']];
  for (const [n, name] of units) {
    if (s >= n) {
      const k = Math.round(s / n);
      return `${k} ${name}${k === 1 ? '' : 's'}`;
    }
  }
  return 'under a minute';
}

// "7 days" for a basis of 604800 s; "hour" reads "the last hour".
function basisWords(seconds) {
  const w = span(seconds);
  return w.startsWith('1 ') ? w.slice(2) : w;
}

// The zone a window resets in: a calendar window's own tz (from
// /v1/plans); other windows count from each charge and have none.
export function windowZone(spec) {
  return spec && spec.type === 'calendar' && spec.tz ? spec.tz : null;
}

// The reset instant in the browser's zone and the window's own.
export function resetText(iso, spec) {
  if (!iso) return 'no reset: this window does not run out by time';
  const mine = `${when(iso)} your time (${BROWSER_TZ})`;
  const tz = windowZone(spec);
  if (tz && tz !== BROWSER_TZ) return `${mine} · ${when(iso, tz)} ${tz}, the window's zone`;
  if (tz) return `${mine}, the window's zone too`;
  return `${mine} · ${when(iso, 'UTC')} UTC`;
}

// What a window is, from its /v1/plans spec: "rolling 5 hours".
export function describe(spec, view) {
  const type = (spec && spec.type) || view.type;
  if (!spec) return type;
  switch (type) {
    case 'rolling': return `rolling ${span(spec.length_s)}`;
    case 'session': return `session of ${span(spec.length_s)} from the first use`;
    case 'calendar':
      return `calendar ${spec.every}${spec.at ? `, resets ${spec.at}` : ', resets on the billing day'}${spec.tz ? ` ${spec.tz}` : ''}`;
    case 'rate': return `rate ${num(spec.limit)} per ${span(spec.per_s)}`;
    case 'concurrency': return 'requests in flight';
    default: return type;
  }
}

// The forecast sentence of one window (PRODUCT.md section 7): from the
// window's "forecast" {basis_s, weight_per_hour, exhausted_at,
// before_reset} when the gateway gives one, else from the older
// top-level forecast list ({name, full_at, next_recovery}): what comes
// back if nothing more is used.
export function forecastText(view, unit, legacy) {
  const f = view.forecast;
  if (f && typeof f === 'object' && 'exhausted_at' in f) {
    const pace = `At your pace of the last ${basisWords(f.basis_s)}`
      + (f.weight_per_hour !== undefined ? ` (${num(f.weight_per_hour)} ${unit} an hour)` : '');
    if (!f.exhausted_at) return `${pace} this does not run out.`;
    const out = when(f.exhausted_at);
    if (f.before_reset && view.reset_at) {
      const gap = (new Date(view.reset_at) - new Date(f.exhausted_at)) / 1000;
      return `${pace} this runs out ${out}, ${span(gap)} before it resets.`;
    }
    if (f.before_reset) return `${pace} this runs out ${out}.`;
    return `${pace} this would run out ${out}, but it ${view.reset_at ? 'resets' : 'recovers'} first.`;
  }
  if (legacy) {
    if (legacy.full_at) return `If nothing more is used, all of it is back ${when(legacy.full_at)}.`;
    if (view.used > 0 && legacy.next_recovery)
      return `If nothing more is used, ${num(legacy.next_recovery.remaining)} ${unit} are free again ${when(legacy.next_recovery.at)}.`;
    return view.used > 0 ? 'If nothing more is used, nothing comes back before it resets.'
      : 'Nothing used yet: the whole allowance is free.';
  }
  return 'This gateway gives no forecast for this window.';
}
