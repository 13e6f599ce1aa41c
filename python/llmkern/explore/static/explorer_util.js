// Pure helpers of the Performance Explorer (explore/page.py inlines this script before explorer.js,
// the page itself): the fixed tables (statistics, latency families, estimates, filter dimensions,
// plot options, palette, the plots), value keys and metric lookups, the Pareto front, the empty
// plot layout, number formatting and element building. Nothing here reads or changes the page's
// state; they are the members of the one global object ExplorerUtil.
var ExplorerUtil = (function () {
  'use strict';

  var STATS = [['p50', 'median'], ['mean', 'mean'], ['p95', 'p95'], ['p99', 'p99']];
  var FAMILIES = [['ttft', 'TTFT'], ['itl', 'ITL'], ['e2e', 'E2E latency']];
  var ESTIMATES = [['throughput', 'Throughput (tok/s)'], ['itl_p50', 'ITL p50 (ms)'], ['ttft_p50', 'TTFT p50 (ms)'],
                   ['e2e_p50', 'E2E latency p50 (ms)']];
  var DIMS = [['model', 'Model'], ['machine', 'Machine'], ['workload', 'Workload'], ['slo', 'Sweep constraints (SLO)'],
              ['load', 'Other work during the run']];
  var PLOT_CONFIG = {displaylogo: false, responsive: true};

  // Each Pareto group (model / machine / workload) has its own colour; points take it too by default.
  var PALETTE = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#7f7f7f',
                 '#bcbd22', '#17becf'];

  var PLOTS = [];
  FAMILIES.forEach(function (f) { PLOTS.push({id: 'pareto-' + f[0], kind: 'pareto', family: f[0]}); });
  PLOTS.push({id: 'cdf', kind: 'cdf'});
  ESTIMATES.forEach(function (e) { PLOTS.push({id: 'estimate-' + e[0], kind: 'estimate', key: e[0], label: e[1]}); });

  // ---- values ---------------------------------------------------------------------------------
  function valueKey(v) {
    if (v === null || v === undefined || v === '') return 'none';
    return typeof v === 'object' ? JSON.stringify(v) : String(v);  // a list-valued knob shows as JSON
  }
  function finite(x) { return typeof x === 'number' && isFinite(x); }
  function metric(r, name) { var m = r.metrics || {}; return finite(m[name]) ? m[name] : null; }
  function estimate(r, name) { var e = r.estimate || {}; return finite(e[name]) ? e[name] : null; }
  function groupKey(r) { return [r.model, r.machine, r.workload].map(valueKey).join(' | '); }

  // ---- Pareto front: most throughput for least latency ------------------------------------
  // A point is on the front when no other point has at least its throughput and at most its
  // latency while being better in one of them. Identical points are all kept.
  function paretoFront(points) {
    var sorted = points.slice().sort(function (a, b) { return a.lat - b.lat || b.tput - a.tput; });
    var front = [], best = -Infinity, bestLat = null;
    sorted.forEach(function (p) {
      if (p.tput > best) { front.push(p); best = p.tput; bestLat = p.lat; }
      else if (p.tput === best && p.lat === bestLat) front.push(p);
    });
    return front;
  }

  // ---- elements, plots and tables -----------------------------------------------------------
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function emptyLayout(title, xt, yt, n, why) {
    var lay = {title: {text: title, font: {size: 14}, x: 0.01, xanchor: 'left'},
               xaxis: {title: {text: xt}}, yaxis: {title: {text: yt}}, modebar: {orientation: 'v'},
               margin: {l: 60, r: 30, t: 36, b: 40}, hovermode: 'closest', height: 460,
               legend: {font: {size: 10}, orientation: 'h', x: 0, y: -0.1, yanchor: 'top'}};
    if (!n) lay.annotations = [{text: why, showarrow: false, xref: 'paper',
                                yref: 'paper', x: 0.5, y: 0.5, font: {size: 14}}];
    return lay;
  }
  function familyLabel(family) {
    return FAMILIES.filter(function (f) { return f[0] === family; })[0][1];
  }
  function fmt(v) {
    if (v === null || v === undefined) return '-';
    if (typeof v === 'number') return Math.abs(v) >= 100 ? v.toFixed(0) : Number(v.toPrecision(3)).toString();
    return String(v);
  }
  function copyButton(text) {
    var b = el('button', {type: 'button', 'class': 'copy'}, 'copy');
    b.addEventListener('click', function () {
      var done = function () { b.textContent = 'copied'; };
      try {
        navigator.clipboard.writeText(text).then(done, function () { b.textContent = 'select and copy'; });
      } catch (e) { b.textContent = 'select and copy'; }
    });
    return b;
  }

  return {
    STATS: STATS, FAMILIES: FAMILIES, ESTIMATES: ESTIMATES, DIMS: DIMS, PLOT_CONFIG: PLOT_CONFIG,
    PALETTE: PALETTE, PLOTS: PLOTS, valueKey: valueKey, finite: finite, metric: metric, estimate: estimate,
    groupKey: groupKey, paretoFront: paretoFront, el: el, emptyLayout: emptyLayout, familyLabel: familyLabel,
    fmt: fmt, copyButton: copyButton
  };
})();
