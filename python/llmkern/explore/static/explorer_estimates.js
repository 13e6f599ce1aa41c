// The Performance Explorer's estimates (explore/page.py inlines this script after explorer_util.js):
// the estimate-vs-measured plots, and the estimates made for other hardware (optimize
// --estimate-profile), which are drawn only when ticked and always say they were not measured.
// Nothing here reads or changes the page's state; explorer.js passes what each function needs.
var ExplorerEstimates = (function () {
  'use strict';

  var U = ExplorerUtil;
  var metric = U.metric, estimate = U.estimate, finite = U.finite, el = U.el;
  var SYMBOLS = ['diamond-open', 'square-open', 'triangle-up-open'], COLORS = ['#555', '#999', '#333'];

  // One plot of an estimated quantity against its measurement, with the diagonal and the median error.
  function estimateTraces(runs, key, label, hoverText) {
    var axes = null;
    var pts = runs.filter(function (r) { return metric(r, key) !== null && estimate(r, key) !== null; });
    var traces = [{type: 'scatter', mode: 'markers', meta: 'runs', name: 'runs',
                   x: pts.map(function (r) { return metric(r, key); }),
                   y: pts.map(function (r) { return estimate(r, key); }),
                   customdata: pts.map(function (r) { return r.id; }), text: pts.map(hoverText),
                   hovertemplate: '%{text}<br>measured %{x:.4g}<br>estimated %{y:.4g}<extra></extra>',
                   marker: {size: 9, opacity: 0.8}}];
    var title = label + ': estimate vs measured (dashed: equal)';
    if (pts.length) {
      var all = [];
      pts.forEach(function (r) { all.push(metric(r, key), estimate(r, key)); });
      var lo = Math.min.apply(null, all), hi = Math.max.apply(null, all);
      // Estimates off by an order of magnitude would squash the rest: both axes go logarithmic then,
      // over one shared range, so the diagonal stays the diagonal.
      if (lo > 0 && hi / lo > 20) {
        var pad = 0.1 * (Math.log10(hi) - Math.log10(lo));
        axes = {type: 'log', range: [Math.log10(lo) - pad, Math.log10(hi) + pad]};
      }
      traces.push({type: 'scatter', mode: 'lines', meta: 'reference', name: 'estimate = measured',
                   x: [lo, hi], y: [lo, hi], line: {dash: 'dash', color: '#888'}, hoverinfo: 'skip'});
      var errs = pts.map(function (r) { return Math.abs(estimate(r, key) / metric(r, key) - 1); });
      errs.sort(function (a, b) { return a - b; });
      title += ' (median |error| ' + (100 * errs[Math.floor((errs.length - 1) / 2)]).toFixed(0) + '%)';
    }
    return {traces: traces, n: pts.length, title: title, axes: axes,
            why: runs.length ? 'No run shown has both an estimate and a measurement' : 'No runs match the filters'};
  }

  // The sidebar's checkboxes, one per profile with estimates (labels: profile -> text).
  function layerBoxes(box, labels, chosen, onChange) {
    box.textContent = '';
    var names = Object.keys(labels).sort();
    if (!names.length) return;
    var fs = el('fieldset', {'class': 'layers'});
    fs.appendChild(el('legend', {}, 'Layer estimates for other hardware'));
    names.forEach(function (name) {
      var lab = el('label', {title: labels[name]});
      var cb = el('input', {type: 'checkbox', value: name, 'class': 'layer'});
      cb.checked = chosen.indexOf(name) >= 0;
      cb.addEventListener('change', onChange);
      lab.appendChild(cb);
      lab.appendChild(document.createTextNode(' ' + labels[name]));
      fs.appendChild(lab);
    });
    box.appendChild(fs);
  }

  // A Pareto plot's extra traces for the chosen profiles: open grey markers, their own legend entry
  // that says "not measured"; they never join a Pareto front or a pick.
  function layerTraces(runs, name, chosen, labels, hoverText) {
    var out = [];
    chosen.forEach(function (prof, i) {
      var pts = runs.filter(function (r) {
        var e = (r.profile_estimates || {})[prof] || {};
        return finite(e[name]) && finite(e.throughput);
      });
      if (!pts.length) return;
      out.push({type: 'scatter', mode: 'markers', meta: 'estimate-layer', name: labels[prof],
                x: pts.map(function (r) { return r.profile_estimates[prof][name]; }),
                y: pts.map(function (r) { return r.profile_estimates[prof].throughput; }),
                customdata: pts.map(function (r) { return r.id; }),
                text: pts.map(function (r) { return 'ESTIMATE on ' + prof + ', not measured<br>' + hoverText(r); }),
                hovertemplate: '%{text}<br>' + name + ' %{x:.3g} ms<br>%{y:.4g} tok/s<extra></extra>',
                marker: {size: 10, symbol: SYMBOLS[i % 3], color: COLORS[i % 3], line: {width: 1.5}}});
    });
    return out;
  }

  return {estimateTraces: estimateTraces, layerBoxes: layerBoxes, layerTraces: layerTraces};
})();
