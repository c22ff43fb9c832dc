// plot.js - a window's history chart (uPlot on a <canvas>): usage per
// bucket from /v1/usage/history as bars, for a rolling window also what
// the window counted at each bucket (the sum of the buckets inside its
// length, so at the bucket's granularity), the recovery schedule of
// /v1/usage from now on (what the window holds if nothing more is used),
// and the limit as a line.  Every point is a figure the API gave or a
// sum of them.
import uPlot from 'uplot';

const COLORS = { bars: '#8fb3d9', window: '#1f4e79', recovery: '#2e7d32', limit: '#c62828' };

// Sorted unique x values and, per series, a value or null at each.
function align(seriesPoints) {
  const xs = [...new Set(seriesPoints.flatMap((pts) => pts.map((p) => p[0])))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const ys = seriesPoints.map((pts) => {
    const col = new Array(xs.length).fill(null);
    for (const [x, y] of pts) col[at.get(x)] = y;
    return col;
  });
  return [xs, ...ys];
}

// What a rolling window of length_s counted at each bucket: the bucket and
// those before it that start within length_s of its end.
function slidingSums(buckets, bucketS, lengthS) {
  const out = [];
  let sum = 0;
  let lo = 0;
  for (let i = 0; i < buckets.length; i++) {
    sum += buckets[i].value;
    const end = buckets[i].x + bucketS;
    while (buckets[lo].x < end - lengthS) sum -= buckets[lo++].value;
    out.push([buckets[i].x, sum]);
  }
  return out;
}

// d: { view (the /v1/usage window), unit, rollingS (length of a rolling
// window, else 0), history (the /v1/usage/history answer, or null),
// fromMs (where the chart's span starts), nowMs }.  Returns the uPlot
// instance.
export function drawChart(el, d) {
  const v = d.view;
  const sec = (iso) => Math.floor(new Date(iso).getTime() / 1000);
  const nowS = Math.floor(d.nowMs / 1000);
  const counted = v.unit === 'requests' ? 'requests' : 'weight';
  const buckets = d.history
    ? d.history.buckets.map((b) => ({ x: sec(b.start), value: Number(b[counted]) || 0 }))
    : [];
  const series = [{}];
  const points = [];

  if (buckets.length) {
    points.push(buckets.map((b) => [b.x, b.value]));
    series.push({
      label: `per ${d.history.bucket_s >= 86400 ? 'day' : 'hour'}`,
      stroke: COLORS.bars, fill: COLORS.bars,
      paths: uPlot.paths.bars({ size: [0.8, 64], align: 1 }),
      points: { show: false },
    });
    if (d.rollingS > 0) {
      points.push(slidingSums(buckets, d.history.bucket_s, d.rollingS));
      series.push({ label: 'in the window', stroke: COLORS.window, width: 2, points: { show: false } });
    }
  }
  const recovery = [[nowS, v.used]];
  for (const r of v.recovers || []) recovery.push([sec(r.at), Math.max(0, v.limit - r.remaining)]);
  points.push(recovery);
  series.push({
    label: 'if nothing more is used', stroke: COLORS.recovery, width: 2, dash: [6, 4],
    paths: uPlot.paths.stepped({ align: 1 }), points: { show: false },
  });
  // the span: from the history's start to the last recovery step, and at
  // least an hour past now
  const xsAll = points.flatMap((pts) => pts.map((p) => p[0]));
  const x0 = Math.min(Math.floor(d.fromMs / 1000), ...xsAll);
  const x1 = Math.max(nowS + 3600, ...xsAll);
  points.push([[x0, v.limit], [x1, v.limit]]);
  series.push({ label: 'limit', stroke: COLORS.limit, width: 1.5, points: { show: false } });

  const data = align(points);
  const width = () => Math.max(240, el.clientWidth);
  const u = new uPlot({
    width: width(),
    height: 200,
    series: series.map((s, i) => (i ? { spanGaps: true, ...s } : s)),
    scales: { y: { range: (self, lo, hi) => [0, Math.max(hi, v.limit) * 1.08 || 1] } },
    axes: [{}, { label: d.unit, size: 56 }],
    legend: { live: false },
    cursor: { drag: { x: false, y: false } },
  }, data, el);
  let queued = false;
  window.addEventListener('resize', () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      u.setSize({ width: width(), height: 200 });
    });
  });
  return u;
}
