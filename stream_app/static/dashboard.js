// ldp-stream built-in dashboard: plain SVG charts from the worker's own API (no library, no network beyond
// this worker). Polls every second: GET campaigns (once), estimates/{c}/{a} and .../history per attribute,
// metrics (Prometheus text: reports counted, whose increase between polls is reports/s; rejections, lag) and status.
// Per attribute: a categorical one (its histogram, heatmap and privacy charts) or a numeric one (type "numeric":
// its mean over time inside the 95% band, and for Square Wave the latest distribution with the quantiles p50, p90,
// p99 and their intervals, and the quantiles over time; then its privacy chart) or an open-domain one (type "string"
// or "u64": a table of the latest step's top-K, each item's frequency with its 95% interval drawn, the campaign's
// candidates below; the frequencies of the current top items over the finals; then its privacy chart).
// Every chart is a <figure data-chart=... data-attribute=... data-points=N>; <body data-ready="true"> once
// every chart has data (the browser test waits for it).
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const POLL_MS = 1000, OPS_KEEP = 600, HEAT_STEPS = 48;
const PALETTE = ['#2f6fdb', '#e8833a', '#3fa34d', '#c4314b', '#8e6bd1', '#1fa3a3', '#b8860b', '#d16ba5'];
const ops = [];  // samples of /metrics: {time, rps, rejected: {reason: n}, lag}
let campaigns = null;

// ------------------------------------------------------------------ small helpers
function svgEl(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
function htmlEl(tag, attrs, parent, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
async function getJSON(url) {
  const r = await fetch(url, {cache: 'no-store'});
  return r.ok ? r.json() : null;
}
function fmt(x, digits) {
  if (x === null || x === undefined || !isFinite(x)) return '∞';
  const a = Math.abs(x);
  if (a >= 1e6) return (x / 1e6).toFixed(1) + 'M';
  if (a >= 1e4) return (x / 1e3).toFixed(0) + 'k';
  if (a >= 1e3) return (x / 1e3).toFixed(1) + 'k';
  return Number(x).toFixed(digits === undefined ? (a >= 10 ? 0 : a >= 1 ? 1 : 3) : digits);
}
function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return out;
}
function tickFormat(ticks) {  // as many decimals as the tick spacing needs
  const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : Math.abs(ticks[0]) || 1;
  const decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  return v => (Math.abs(v) >= 1e4 ? fmt(v) : v.toFixed(decimals));
}
function clock(t) { return new Date(t * 1000).toLocaleTimeString([], {hour12: false}); }

// a panel: <figure> with caption, note, svg and legend; reused across polls (keyed by id)
function panel(parent, id, title, chart, attribute) {
  let fig = document.getElementById(id);
  if (!fig) {
    fig = htmlEl('figure', {id, class: 'chart', 'data-chart': chart, 'data-points': '0'}, parent);
    if (attribute) fig.dataset.attribute = attribute;
    const cap = htmlEl('figcaption', {}, fig);
    htmlEl('span', {class: 'title'}, cap, title);
    htmlEl('span', {class: 'note'}, cap);
    svgEl('svg', {viewBox: '0 0 420 190', preserveAspectRatio: 'xMidYMid meet', role: 'img'}, fig);
    htmlEl('div', {class: 'legend'}, fig);
  }
  return fig;
}
function reset(fig, points, note) {
  const svg = fig.querySelector('svg');
  svg.replaceChildren();
  fig.dataset.points = String(points);
  fig.querySelector('.note').textContent = note || '';
  fig.querySelector('.legend').replaceChildren();
  if (!points) svgEl('text', {x: 210, y: 95, 'text-anchor': 'middle', class: 'empty'}, svg).textContent = 'waiting for data…';
  return svg;
}
function legend(fig, items) {
  const box = fig.querySelector('.legend');
  for (const [name, color] of items) {
    const s = htmlEl('span', {}, box);
    htmlEl('i', {style: `background:${color}`}, s);
    s.appendChild(document.createTextNode(name));
  }
}

// axes in a 420x190 view box; returns the scales
function frame(svg, xlo, xhi, ylo, yhi, opts) {
  const o = Object.assign({left: 44, right: 8, top: 8, bottom: 22, xfmt: v => fmt(v)}, opts);
  const W = 420 - o.left - o.right, H = 190 - o.top - o.bottom;
  if (!(xhi > xlo)) { xlo -= 0.5; xhi += 0.5; }
  if (!(yhi > ylo)) { yhi = ylo + (Math.abs(ylo) || 1); }
  const x = v => o.left + (v - xlo) / (xhi - xlo) * W;
  const y = v => o.top + H - (v - ylo) / (yhi - ylo) * H;
  const g = svgEl('g', {class: 'grid'}, svg), yt = niceTicks(ylo, yhi, 4), yfmt = o.yfmt || tickFormat(yt);
  for (const v of yt) {
    svgEl('line', {x1: o.left, x2: o.left + W, y1: y(v), y2: y(v)}, g);
    svgEl('text', {x: o.left - 4, y: y(v) + 3, 'text-anchor': 'end'}, g).textContent = yfmt(v);
  }
  const xt = o.xticks || niceTicks(xlo, xhi, 5);
  for (const v of xt) {
    svgEl('line', {x1: x(v), x2: x(v), y1: o.top + H, y2: o.top + H + 3}, g);
    svgEl('text', {x: x(v), y: o.top + H + 14, 'text-anchor': 'middle'}, g).textContent = o.xfmt(v);
  }
  svgEl('line', {x1: o.left, x2: o.left + W, y1: o.top + H, y2: o.top + H, stroke: '#9aa5b1'}, svg);
  return {x, y, W, H, o};
}

// series: [{name, color, points: [[x, y], ...], dash}]
function lineChart(fig, series, note, opts) {
  series = series.filter(s => s.points.length);
  const pts = series.flatMap(s => s.points);
  const svg = reset(fig, pts.length, note);
  if (!pts.length) return;
  const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
  const o = Object.assign({ymin: Math.min(0, ...ys)}, opts);
  const sc = frame(svg, Math.min(...xs), Math.max(...xs), o.ymin, Math.max(...ys) * 1.08 || 1, o);
  for (const s of series) {
    const d = s.points.map((p, i) => (i ? 'L' : 'M') + sc.x(p[0]).toFixed(1) + ',' + sc.y(p[1]).toFixed(1)).join('');
    if (o.area && series.length === 1) {
      svgEl('path', {d: d + `L${sc.x(s.points[s.points.length - 1][0])},${sc.y(o.ymin)}L${sc.x(s.points[0][0])},${sc.y(o.ymin)}Z`,
                     fill: s.color, 'fill-opacity': 0.12, stroke: 'none'}, svg);
    }
    svgEl('path', {d, fill: 'none', stroke: s.color, 'stroke-width': 1.8, 'stroke-dasharray': s.dash || ''}, svg);
    if (s.points.length < 30) for (const p of s.points) svgEl('circle', {cx: sc.x(p[0]), cy: sc.y(p[1]), r: 2.2, fill: s.color}, svg);
  }
  legend(fig, series.map(s => [s.name, s.color]));
}

// the latest estimate: bars with the 95% band, the previous step as a line over them
function histogramChart(fig, attr, latest, previous) {
  const f = (latest && latest.frequencies_norm_sub) || [];
  const svg = reset(fig, f.length, latest ? `t=${latest.t} ${latest.final ? 'final' : 'open'} · n=${fmt(latest.n)}` : '');
  fig.dataset.t = latest ? String(latest.t) : '';
  fig.dataset.previousT = previous ? String(previous.t) : '';
  if (!f.length) return;
  const h = latest.ci95_halfwidth || 0, prev = (previous && previous.frequencies_norm_sub) || [];
  const top = Math.max(...f.map(v => v + h), ...prev) * 1.05;
  const k = f.length, labels = attr.labels;
  const xticks = niceTicks(0, k - 1, 6).filter(v => Number.isInteger(v));
  const sc = frame(svg, -0.5, k - 0.5, 0, top, {xticks, xfmt: v => labels ? labels[v] : String(v)});
  const bw = sc.W / k;
  const band = svgEl('g', {}, svg), bars = svgEl('g', {}, svg);
  f.forEach((v, j) => {
    const x0 = sc.x(j - 0.5);
    svgEl('rect', {x: x0 + bw * 0.08, width: Math.max(bw * 0.84, 0.6), y: sc.y(v), height: Math.max(sc.y(0) - sc.y(v), 0),
                   fill: '#2f6fdb', 'fill-opacity': 0.85}, bars);
    if (h > 0) svgEl('rect', {x: x0, width: Math.max(bw, 0.6), y: sc.y(v + h), height: sc.y(Math.max(v - h, 0)) - sc.y(v + h),
                              fill: '#f0a04b', 'fill-opacity': 0.35}, band);
  });
  if (prev.length === k) {
    const d = prev.map((v, j) => `${j ? 'L' : 'M'}${sc.x(j - 0.5).toFixed(1)},${sc.y(v).toFixed(1)}H${sc.x(j + 0.5).toFixed(1)}`).join('');
    svgEl('path', {d, fill: 'none', stroke: '#102a43', 'stroke-width': 1.1, 'stroke-opacity': 0.8}, svg);
  }
  const items = [[`step ${latest.t}`, '#2f6fdb'], [`95% band (±${fmt(h, 4)})`, '#f0a04b']];
  if (prev.length === k) items.push([`previous step ${previous.t}`, '#102a43']);
  legend(fig, items);
}

// value x step heatmap of the final estimates (norm-sub frequencies)
function heatColor(u) {  // viridis-like ramp, u in [0, 1]
  const stops = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const p = Math.min(Math.max(u, 0), 1) * (stops.length - 1), i = Math.min(Math.floor(p), stops.length - 2), w = p - i;
  const c = stops[i].map((a, j) => Math.round(a + (stops[i + 1][j] - a) * w));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}
function heatmapChart(fig, attr, finals) {
  finals = finals.filter(d => d.frequencies_norm_sub).slice(-HEAT_STEPS);
  const svg = reset(fig, finals.length, finals.length ? `steps ${finals[0].t}–${finals[finals.length - 1].t}` : '');
  if (!finals.length) return;
  const k = attr.k, ts = finals.map(d => d.t);
  const vmax = Math.max(1e-9, ...finals.flatMap(d => d.frequencies_norm_sub));
  const sc = frame(svg, ts[0] - 0.5, ts[ts.length - 1] + 0.5, -0.5, k - 0.5,
                   {xticks: niceTicks(ts[0], ts[ts.length - 1], 6).filter(Number.isInteger), xfmt: v => 't' + v,
                    yfmt: v => (attr.labels ? attr.labels[Math.round(v)] : String(Math.round(v))) || ''});
  const cw = sc.W / ts.length, ch = sc.H / k;
  const g = svgEl('g', {'shape-rendering': 'crispEdges'}, svg);
  finals.forEach((d, i) => d.frequencies_norm_sub.forEach((v, j) => {
    svgEl('rect', {x: sc.x(d.t - 0.5), width: cw + 0.3, y: sc.y(j + 0.5), height: ch + 0.3, fill: heatColor(Math.sqrt(v / vmax))}, g);
  }));
  legend(fig, [[`0`, heatColor(0)], [`${fmt(vmax / 4, 3)}`, heatColor(0.5)], [`${fmt(vmax, 3)} (√ scale)`, heatColor(1)]]);
}

function privacyChart(fig, finals, latest) {
  const pick = key => finals.filter(d => d[key] !== null && d[key] !== undefined).map(d => [d.t, d[key]]);
  const bound = latest && latest.eps_longitudinal_bound;
  lineChart(fig, [
    {name: 'worst-case longitudinal ε', color: '#c4314b', points: pick('eps_longitudinal_worst')},
    {name: 'ε∞ (memoized value)', color: '#2f6fdb', points: pick('eps_inf'), dash: '5 3'},
    {name: 'ε1 (first report)', color: '#3fa34d', points: pick('eps_1'), dash: '2 2'},
  ], latest ? `bound ${bound === null || bound === undefined ? '∞' : fmt(bound, 2)}` : '', {xfmt: v => 't' + v});
}

// ------------------------------------------------------------------ numeric attributes
const QUANTILE_COLORS = {p50: '#3fa34d', p90: '#e8833a', p99: '#c4314b'};
const qColor = (q, i) => QUANTILE_COLORS[q] || PALETTE[(i + 4) % PALETTE.length];
const known = x => x !== null && x !== undefined && isFinite(x);
const num = x => (known(x) && Math.abs(x) < 1e5 ? Number(x).toFixed(1) : fmt(x));  // a value in the attribute's units

// series: [{name, color, points: [[x, y], ...], band: [[x, lower, upper], ...], open: [x, y] | null}]: lines over
// their filled bands (a lone band point: an error bar); `open`, the provisional latest step, a hollow point after
function bandChart(fig, series, note, legendItems, opts) {
  series = series.filter(s => s.points.length || s.open);
  const pts = series.flatMap(s => s.open ? [...s.points, s.open] : s.points);
  const svg = reset(fig, pts.length, note);
  if (!pts.length) return;
  const ys = [...pts.map(p => p[1]), ...series.flatMap(s => (s.band || []).flatMap(b => [b[1], b[2]]))].filter(known);
  const xs = pts.map(p => p[0]);
  let ylo = Math.min(...ys), yhi = Math.max(...ys);
  const pad = (yhi - ylo) * 0.08 || Math.abs(yhi) * 0.05 || 1;
  const sc = frame(svg, Math.min(...xs), Math.max(...xs), ylo - pad, yhi + pad, Object.assign({xfmt: v => 't' + v}, opts));
  const bands = svgEl('g', {class: 'bands'}, svg);
  for (const s of series) {
    const band = (s.band || []).filter(b => known(b[1]) && known(b[2]));
    let run = [];
    const flush = () => {
      if (run.length === 1) {
        const [x, lo, hi] = run[0];
        svgEl('rect', {x: sc.x(x) - 3, width: 6, y: sc.y(hi), height: Math.max(sc.y(lo) - sc.y(hi), 0.5),
                       fill: s.bandColor || s.color, 'fill-opacity': 0.3}, bands);
      } else if (run.length > 1) {
        const up = run.map((b, i) => (i ? 'L' : 'M') + sc.x(b[0]).toFixed(1) + ',' + sc.y(b[2]).toFixed(1)).join('');
        const down = run.slice().reverse().map(b => 'L' + sc.x(b[0]).toFixed(1) + ',' + sc.y(b[1]).toFixed(1)).join('');
        svgEl('path', {d: up + down + 'Z', fill: s.bandColor || s.color, 'fill-opacity': 0.25, stroke: 'none'}, bands);
      }
      run = [];
    };
    // consecutive steps share a band; a step without an interval (or a gap in t) starts another
    band.forEach((b, i) => { if (run.length && b[0] !== run[run.length - 1][0] + 1) flush(); run.push(b); });
    flush();
  }
  for (const s of series) {
    if (s.points.length) {
      const d = s.points.map((p, i) => (i ? 'L' : 'M') + sc.x(p[0]).toFixed(1) + ',' + sc.y(p[1]).toFixed(1)).join('');
      svgEl('path', {d, fill: 'none', stroke: s.color, 'stroke-width': 1.8}, svg);
      if (s.points.length < 40) for (const p of s.points) svgEl('circle', {cx: sc.x(p[0]), cy: sc.y(p[1]), r: 2.2, fill: s.color}, svg);
    }
    if (s.open) {
      const last = s.points[s.points.length - 1];
      if (last) svgEl('path', {d: `M${sc.x(last[0])},${sc.y(last[1])}L${sc.x(s.open[0])},${sc.y(s.open[1])}`, fill: 'none',
                               stroke: s.color, 'stroke-width': 1.2, 'stroke-dasharray': '3 2'}, svg);
      svgEl('circle', {cx: sc.x(s.open[0]), cy: sc.y(s.open[1]), r: 3, fill: '#fff', stroke: s.color, 'stroke-width': 1.5}, svg);
    }
  }
  legend(fig, legendItems || series.map(s => [s.name, s.color]));
}

// the estimate of a step newer than the last final (`latest` when it is; null else)
function newer(latest, finals) {
  const last = finals[finals.length - 1];
  return latest && latest.status !== 'insufficient' && (!last || latest.t > last.t) ? latest : null;
}

// finals' means with their 95% intervals (mean_ci95), and the latest step: a point of its own while it is open
function meanChart(fig, attr, finals, latest) {
  const ok = finals.filter(d => known(d.mean));
  const next = newer(latest, ok), shown = next && next.final ? [...ok, next] : ok;
  const open = next && !next.final && known(next.mean) ? [next.t, next.mean] : null;
  const band = shown.filter(d => d.mean_ci95).map(d => [d.t, d.mean_ci95[0], d.mean_ci95[1]]);
  if (open && next.mean_ci95) band.push([next.t, next.mean_ci95[0], next.mean_ci95[1]]);
  const cur = latest && known(latest.mean) ? latest : null;
  fig.dataset.t = cur ? String(cur.t) : '';
  fig.dataset.final = cur ? String(cur.final) : '';
  fig.dataset.mean = cur ? String(cur.mean) : '';
  fig.dataset.halfwidth = cur && known(cur.mean_ci95_halfwidth) ? String(cur.mean_ci95_halfwidth) : '';
  const note = cur ? `t=${cur.t} ${cur.final ? 'final' : 'open'} · ${num(cur.mean)} ± ${num(cur.mean_ci95_halfwidth)}` +
                     ` · n=${fmt(cur.n)}` : '';
  const items = [['mean of the finals', PALETTE[0]], ['95% band (mean ± half-width)', '#f0a04b']];
  if (open) items.push([`open step ${next.t} (provisional)`, PALETTE[0]]);
  bandChart(fig, [{name: 'mean', color: PALETTE[0], bandColor: '#f0a04b', points: shown.map(d => [d.t, d.mean]), band, open}],
            note, items);
}

// Square Wave: the latest estimated distribution over its grid, the quantiles as lines over their 95% intervals
function distributionChart(fig, attr, latest) {
  const dist = latest && latest.distribution, qs = Object.entries((latest && latest.quantiles) || {});
  const grid = dist ? dist.grid : [], prob = dist ? dist.probabilities : [];
  const svg = reset(fig, grid.length, latest && dist ? `t=${latest.t} ${latest.final ? 'final' : 'open'} · n=${fmt(latest.n)}` : '');
  fig.dataset.t = latest && dist ? String(latest.t) : '';
  fig.dataset.final = latest && dist ? String(latest.final) : '';
  fig.dataset.quantiles = JSON.stringify(Object.fromEntries(qs.map(([q, v]) => [q, [v.value, v.lower, v.upper]])));
  if (!grid.length) return;
  const step = grid.length > 1 ? (grid[grid.length - 1] - grid[0]) / (grid.length - 1) : 1;
  const sc = frame(svg, grid[0] - step / 2, grid[grid.length - 1] + step / 2, 0, Math.max(...prob, 1e-9) * 1.15);
  const intervals = svgEl('g', {class: 'intervals'}, svg), bars = svgEl('g', {'shape-rendering': 'crispEdges'}, svg);
  const bw = Math.max(sc.x(grid[0] + step) - sc.x(grid[0]), 0.6);
  grid.forEach((x, j) => svgEl('rect', {x: sc.x(x) - bw / 2 + bw * 0.06, width: Math.max(bw * 0.88, 0.5), y: sc.y(Math.max(prob[j], 0)),
                                        height: Math.max(sc.y(0) - sc.y(Math.max(prob[j], 0)), 0), fill: '#2f6fdb', 'fill-opacity': 0.8}, bars));
  const items = [['probability per grid point', '#2f6fdb']];
  qs.forEach(([q, v], i) => {
    const color = qColor(q, i);
    if (known(v.lower) && known(v.upper)) {
      svgEl('rect', {x: sc.x(v.lower), width: Math.max(sc.x(v.upper) - sc.x(v.lower), 1), y: sc.o.top, height: sc.H,
                     fill: color, 'fill-opacity': 0.16}, intervals);
    }
    if (known(v.value)) {
      svgEl('line', {class: 'quantile', x1: sc.x(v.value), x2: sc.x(v.value), y1: sc.o.top, y2: sc.o.top + sc.H, stroke: color,
                     'stroke-width': 1.6}, svg);
      svgEl('text', {x: sc.x(v.value) + 2, y: sc.o.top + 9 + 11 * i, fill: color}, svg).textContent = q;
    }
    items.push([known(v.lower) && known(v.upper) ? `${q} ${num(v.value)} [${num(v.lower)}, ${num(v.upper)}]`
                                                 : `${q} ${num(v.value)} (interval at the final)`, color]);
  });
  legend(fig, items);
}

// Square Wave: p50, p90, p99 of the finals over time, each over its 95% bootstrap interval
function quantilesChart(fig, attr, finals, latest) {
  const ok = finals.filter(d => d.quantiles), next = newer(latest, ok);
  const names = Object.keys((ok[ok.length - 1] || next || {}).quantiles || {});
  const series = names.map((q, i) => {
    const get = d => d.quantiles && d.quantiles[q];
    const shown = [...ok, ...(next && next.final && get(next) ? [next] : [])].filter(d => known((get(d) || {}).value));
    return {name: q, color: qColor(q, i), points: shown.map(d => [d.t, get(d).value]),
            band: shown.filter(d => known(get(d).lower) && known(get(d).upper)).map(d => [d.t, get(d).lower, get(d).upper]),
            open: next && !next.final && get(next) && known(get(next).value) ? [next.t, get(next).value] : null};
  });
  const last = ok[ok.length - 1];
  bandChart(fig, series, last ? `finals to t=${last.t}` : '',
            [...series.map(s => [`${s.name} (95% interval)`, s.color]), ...(series.some(s => s.open) ? [['open step', '#9aa5b1']] : [])]);
}

// ------------------------------------------------------------------ open-domain attributes
const OPEN_TYPES = ['string', 'u64'];
const CANDIDATES_SHOWN = 12;
const pct = x => (known(x) ? (100 * x).toFixed(Math.abs(x) < 0.1 ? 2 : 1) + '%' : '–');
const itemName = e => (e.value !== null && e.value !== undefined ? e.value : e.item);
const itemColor = i => PALETTE[i % PALETTE.length];

// a table panel: the figure of panel() with its svg hidden and a <div class="table"> in its place
function tablePanel(parent, id, title, chart, attribute) {
  const fig = panel(parent, id, title, chart, attribute);
  if (!fig.querySelector('.table')) {
    fig.querySelector('svg').style.display = 'none';
    fig.insertBefore(htmlEl('div', {class: 'table'}), fig.querySelector('.legend'));
  }
  return fig;
}

// a row's 95% interval as a small bar on the table's common scale: the frequency from 0, its interval over it, the
// noise floor (the half-width of a value nobody holds) as a dashed line
function intervalBar(cell, f, ci, sc, floor) {
  const svg = svgEl('svg', {viewBox: '0 0 120 12', preserveAspectRatio: 'none', class: 'ibar'}, cell);
  const x = v => 2 + (v - sc.lo) / (sc.hi - sc.lo) * 116;
  svgEl('line', {x1: x(0), x2: x(0), y1: 0, y2: 12, stroke: '#9aa5b1'}, svg);
  if (known(f)) svgEl('rect', {x: Math.min(x(0), x(f)), width: Math.max(Math.abs(x(f) - x(0)), 0.8), y: 3, height: 6,
                                fill: '#2f6fdb', 'fill-opacity': 0.85}, svg);
  if (ci && known(ci[0]) && known(ci[1])) {
    svgEl('rect', {x: x(ci[0]), width: Math.max(x(ci[1]) - x(ci[0]), 0.8), y: 1, height: 10, fill: '#f0a04b',
                   'fill-opacity': 0.35}, svg);
  }
  if (known(floor) && floor > 0) {
    svgEl('line', {x1: x(floor), x2: x(floor), y1: 0, y2: 12, stroke: '#616e7c', 'stroke-dasharray': '2 1.5'}, svg);
  }
}

// the latest estimate's top-K (rank, the candidate naming the item or its id, frequency, 95% interval), then the
// campaign's candidates (in its order) with theirs
function topTable(fig, attr, latest) {
  const top = (latest && latest.top_k) || [], cands = (latest && latest.candidates) || [];
  const box = fig.querySelector('.table');
  fig.dataset.points = String(top.length);
  fig.dataset.t = latest && latest.top_k ? String(latest.t) : '';
  fig.dataset.final = latest && latest.top_k ? String(latest.final) : '';
  // a sketch ranks only its candidates: none given, an estimate without items (data all the same)
  fig.dataset.settled = String(!!(latest && Array.isArray(latest.top_k) && !top.length));
  fig.dataset.items = JSON.stringify(top.map(e => [e.item, e.value, e.frequency]));
  const floor = latest && latest.ci95_halfwidth;
  fig.querySelector('.note').textContent = latest && latest.top_k ?
    `t=${latest.t} ${latest.final ? 'final' : 'open'} · n=${fmt(latest.n)}` + (known(floor) ? ` · noise floor ±${pct(floor)}` : '') :
    latest ? `t=${latest.t} ${latest.status || ''}` : '';
  fig.querySelector('.legend').replaceChildren();
  box.replaceChildren();
  if (!latest || !latest.top_k) { htmlEl('div', {class: 'empty'}, box, 'waiting for data…'); return; }
  if (!top.length && !cands.length) {
    htmlEl('div', {class: 'empty'}, box, 'no item ranked: a sketch ranks its candidates (none given); GET …/query?value= estimates any value');
    return;
  }
  const shown = cands.slice(0, CANDIDATES_SHOWN);
  const ends = [0, ...[...top, ...shown].flatMap(e => [e.frequency, ...(e.ci95 || [])]), ...(known(floor) ? [floor] : [])].filter(known);
  const sc = {lo: Math.min(...ends), hi: Math.max(...ends)};
  if (!(sc.hi > sc.lo)) sc.hi = sc.lo + 1;
  const table = htmlEl('table', {}, box), head = htmlEl('tr', {}, htmlEl('thead', {}, table));
  for (const [h, cls] of [['#', 'num'], [attr.type === 'u64' ? 'value / item' : 'value / item id', ''],
                          ['frequency', 'num'], ['95% interval', '']]) htmlEl('th', {class: cls}, head, h);
  const row = (body, rank, e, color, named) => {
    const tr = htmlEl('tr', {}, body);
    if (e.item) tr.dataset.item = e.item;
    htmlEl('td', {class: 'num'}, tr, rank);
    const name = htmlEl('td', {class: 'name'}, tr);
    if (color) htmlEl('i', {style: `background:${color}`}, name);
    if (named) htmlEl('span', {title: e.item ? `item ${e.item}` : ''}, name, named);
    else htmlEl('code', {class: 'item', title: 'no candidate names this item'}, name, e.item);
    htmlEl('td', {class: 'num'}, tr, pct(e.frequency));
    const ci = htmlEl('td', {class: 'ci'}, tr);
    intervalBar(ci, e.frequency, e.ci95, sc, floor);
    htmlEl('span', {}, ci, e.ci95 ? `[${pct(e.ci95[0])}, ${pct(e.ci95[1])}]` : '');
  };
  const body = htmlEl('tbody', {class: 'top'}, table);
  top.forEach((e, i) => row(body, String(i + 1), e, itemColor(i), e.value));
  if (cands.length) {
    const cb = htmlEl('tbody', {class: 'candidates'}, table);
    htmlEl('th', {colspan: 4}, htmlEl('tr', {class: 'sub'}, cb), `candidates (${cands.length}, the campaign's order)`);
    const rankOf = new Map(top.map((e, i) => [e.value, i + 1]));
    shown.forEach(e => row(cb, rankOf.has(e.value) ? `(${rankOf.get(e.value)})` : '', e, null, e.value));
    if (cands.length > shown.length) htmlEl('td', {colspan: 4, class: 'more'}, htmlEl('tr', {}, cb), `… ${cands.length - shown.length} more`);
  }
  legend(fig, [['frequency', '#2f6fdb'], ['95% interval', '#f0a04b'], [`noise floor ±${pct(floor)}`, '#616e7c']]);
}

// the frequencies of the latest top-K's items over the finals: an item's frequency from a final's top-K, else from
// its candidates (a named item out of that step's top-K); nothing where a final knows neither
function topOverTime(fig, attr, finals, latest) {
  const ok = finals.filter(d => d.top_k);
  const cur = (latest && latest.top_k && latest.top_k.length ? latest : ok[ok.length - 1]) || null;
  const items = cur ? cur.top_k : [];
  const series = items.map((e, i) => ({
    name: `${i + 1}. ${itemName(e)}`, color: itemColor(i), dash: i >= PALETTE.length ? '4 2' : '',
    points: ok.map(d => {
      const hit = d.top_k.find(x => x.item === e.item) ||
                  (e.value !== null && (d.candidates || []).find(x => x.value === e.value));
      return hit && known(hit.frequency) ? [d.t, hit.frequency] : null;
    }).filter(p => p)}));
  lineChart(fig, series, ok.length ? `finals t${ok[0].t}–t${ok[ok.length - 1].t}` : '',
            {xfmt: v => 't' + v, yfmt: v => +(100 * v).toFixed(4) + '%'});
  const drawn = series.some(s => s.points.length);
  fig.dataset.points = String(drawn ? ok.length : 0);  // one point per final, as the heatmap
  fig.dataset.settled = String(!!(latest && Array.isArray(latest.top_k) && !items.length));  // nothing ranked (see topTable)
  fig.dataset.t = ok.length ? String(ok[ok.length - 1].t) : '';
  fig.dataset.items = String(series.length);
}

// ------------------------------------------------------------------ /metrics
function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = line.match(/^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const p of (m[2] || '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
    (out[m[1]] = out[m[1]] || []).push({labels, value: parseFloat(m[3])});
  }
  return out;
}
const total = (series) => (series || []).reduce((s, x) => s + x.value, 0);

async function sampleOps() {
  const r = await fetch('metrics', {cache: 'no-store'});
  if (!r.ok) return;
  const m = parseMetrics(await r.text()), rejected = {};
  for (const s of m.ldp_rejected_batches_total || []) rejected[s.labels.reason] = (rejected[s.labels.reason] || 0) + s.value;
  // reports/s: the increase of the counter since the previous poll (none at the first, or after a restart)
  const now = Date.now() / 1000, reports = total(m.ldp_reports_total), prev = ops[ops.length - 1];
  const rps = prev && now > prev.time && reports >= prev.reports ? (reports - prev.reports) / (now - prev.time) : 0;
  ops.push({time: now, rps, rejected, lag: total(m.ldp_consumer_lag_messages), reports});
  if (ops.length > OPS_KEEP) ops.shift();
}

function drawOps(histories) {
  const root = document.getElementById('ops');
  const tfmt = v => clock(v);
  const last = ops[ops.length - 1];
  lineChart(panel(root, 'ops-rps', 'Reports/s', 'reports_per_second'),
            [{name: 'reports/s (this worker, between polls)', color: PALETTE[0], points: ops.map(s => [s.time, s.rps])}],
            last ? `${fmt(last.reports)} counted` : '', {xfmt: tfmt, area: true});
  const reasons = [...new Set(ops.flatMap(s => Object.keys(s.rejected)))].sort();
  const shown = reasons.filter(r => last && last.rejected[r] > 0);
  const rejSeries = [{name: 'all reasons', color: '#616e7c', points: ops.map(s => [s.time, Object.values(s.rejected).reduce((a, b) => a + b, 0)])}];
  shown.forEach((r, i) => rejSeries.push({name: r, color: PALETTE[(i + 3) % PALETTE.length], points: ops.map(s => [s.time, s.rejected[r] || 0]), dash: '4 2'}));
  lineChart(panel(root, 'ops-rejected', 'Rejected batches (cumulative, by reason)', 'rejections'), rejSeries,
            last ? `${fmt(rejSeries[0].points[rejSeries[0].points.length - 1][1], 0)} total` : '', {xfmt: tfmt});
  lineChart(panel(root, 'ops-lag', 'Consumer lag (messages)', 'consumer_lag'),
            [{name: 'messages behind the high-water marks', color: PALETTE[1], points: ops.map(s => [s.time, s.lag])}],
            last ? `now ${fmt(last.lag, 0)}` : '', {xfmt: tfmt, area: true});
  const lat = Object.entries(histories).map(([name, finals], i) => ({
    name, color: PALETTE[i % PALETTE.length],
    points: finals.filter(d => d.latency_seconds !== null && d.latency_seconds !== undefined).map(d => [d.t, d.latency_seconds])}));
  lineChart(panel(root, 'ops-latency', 'Estimate latency (s, final estimates)', 'estimate_latency'), lat, '',
            {xfmt: v => 't' + v});
}

// ------------------------------------------------------------------ one poll
async function poll() {
  const status = document.getElementById('status');
  try {
    if (!campaigns) campaigns = ((await getJSON('campaigns')) || {campaigns: null}).campaigns;
    await sampleOps();
    const st = await getJSON('status');
    if (st) document.getElementById('worker').textContent =
      `worker ${st.worker_id} · partitions [${(st.assigned || []).join(', ')}]${st.estimator_leader ? ' · estimator' : ''}` +
      (st.healthy ? '' : ` · problems: ${(st.problems || []).map(p => p.problem || p).join(', ')}`);
    const histories = {}, root = document.getElementById('attributes');
    for (const c of campaigns || []) {
      for (const a of c.attributes) {
        const base = `estimates/${encodeURIComponent(c.id)}/${encodeURIComponent(a.name)}`;
        const [latest, hist] = await Promise.all([getJSON(base), getJSON(base + '/history')]);
        const finals = (hist && hist.estimates || []).filter(d => d.final).sort((p, q) => p.t - q.t);
        histories[campaigns.length > 1 ? `${c.id}/${a.name}` : a.name] = finals;
        const key = `${c.id}-${a.name}`.replace(/[^\w-]/g, '_');
        const open = OPEN_TYPES.includes(a.type);
        const numeric = a.type === 'numeric' || (!open && !!a.range);  // range: given for a numeric attribute only
        const dist = numeric && ((a.params && a.params.mechanism === 'SW') || !!(latest && latest.distribution));
        let section = document.getElementById('attr-' + key);
        if (!section) {
          section = htmlEl('section', {id: 'attr-' + key, 'data-attribute': a.name,
                                       'data-type': numeric ? 'numeric' : open ? a.type : 'categorical'}, root);
          const h = htmlEl('h2', {}, section, `${c.id} / ${a.name}`);
          const domain = open ? `open domain (${a.type}), top ${a.top}` + (a.candidates ? `, ${a.candidates.length} candidates` : '')
                       : !numeric ? `k=${a.k}` : a.range ? `numeric, range [${Number(a.range[0])}, ${Number(a.range[1])}]` : 'numeric';
          htmlEl('span', {class: 'sub'}, h,
                 `${a.protocol}, ${domain} · ε1=${fmt(a.eps_1, 2)} · ε∞=${fmt(a.eps_inf, 2)} · longitudinal bound ${fmt(a.eps_longitudinal_bound, 2)}`);
          htmlEl('div', {class: open ? 'row open' : numeric ? (dist ? 'row num dist' : 'row num') : 'row attr'}, section);
        }
        const row = section.querySelector('.row');
        if (dist) row.classList.add('dist');
        if (open) {
          topTable(tablePanel(row, 'top-' + key, 'Top-K, latest step', 'topk', a.name), a, latest);
          topOverTime(panel(row, 'toptime-' + key, 'Top-K over time (the latest top items, finals)', 'topk_time', a.name), a, finals, latest);
        } else if (numeric) {
          meanChart(panel(row, 'mean-' + key, 'Mean over time, 95% band', 'mean', a.name), a, finals, latest);
          if (dist) {
            distributionChart(panel(row, 'dist-' + key, 'Latest distribution, quantiles and their 95% intervals', 'distribution', a.name), a, latest);
            quantilesChart(panel(row, 'quant-' + key, 'Quantiles p50 / p90 / p99 over time', 'quantiles', a.name), a, finals, latest);
          }
        } else {
          const previous = latest ? finals.filter(d => d.t < latest.t).pop() : undefined;
          histogramChart(panel(row, 'hist-' + key, 'Latest histogram, 95% band, previous step', 'histogram', a.name), a, latest, previous);
          heatmapChart(panel(row, 'heat-' + key, 'Estimated frequencies over time', 'heatmap', a.name), a, finals);
        }
        privacyChart(panel(row, 'priv-' + key, 'Privacy loss over time', 'privacy', a.name), finals, latest);
      }
    }
    drawOps(histories);
    const charts = [...document.querySelectorAll('figure.chart')];
    const ready = !!campaigns && charts.length > 0 && charts.every(f => Number(f.dataset.points) > 0 || f.dataset.settled === 'true') &&
      ops.length >= 2;
    document.body.dataset.ready = String(ready);
    status.classList.remove('status-bad');
    status.textContent = `updated ${clock(Date.now() / 1000)} · frequencies after norm-sub · numeric: mean ± 95% · open domains: top-K · ${(campaigns || []).length} campaign(s)`;
  } catch (err) {
    status.classList.add('status-bad');
    status.textContent = 'error: ' + err;
  }
  setTimeout(poll, POLL_MS);
}
poll();
