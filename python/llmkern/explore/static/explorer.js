// The Performance Explorer: filters, Pareto plots, estimate vs measured, comparison of chosen
// configurations. Reads the runs embedded as JSON in #explore-data (see explore/page.py for the shape).
// After every render it writes what the plots hold (read back from plotly's graph divs and the
// SVG they drew) into #explore-status, so a headless browser can check the page from its DOM.
(function () {
  'use strict';

  var D = JSON.parse(document.getElementById('explore-data').textContent);
  var RUNS = D.runs || [];
  var KNOBS = D.knobs || [];
  var MACHINES = D.machines || {};
  var SWEEPS = D.sweeps || [];
  var LAYERS = D.estimate_profiles || {};   // profile -> label: estimates for other hardware, never measured
  var U = ExplorerUtil;  // explorer_util.js: the pure helpers and fixed tables
  var E = ExplorerEstimates;  // explorer_estimates.js: estimate vs measured, layered estimates
  var STATS = U.STATS, FAMILIES = U.FAMILIES, ESTIMATES = U.ESTIMATES, DIMS = U.DIMS,
      PLOT_CONFIG = U.PLOT_CONFIG, PALETTE = U.PALETTE, PLOTS = U.PLOTS, valueKey = U.valueKey, finite = U.finite,
      metric = U.metric, estimate = U.estimate, groupKey = U.groupKey, paretoFront = U.paretoFront, el = U.el,
      emptyLayout = U.emptyLayout, familyLabel = U.familyLabel, fmt = U.fmt, copyButton = U.copyButton;
  var GROUP = 'group';
  var state = {sel: {}, stat: 'p50', color: GROUP, compare: [], cdf: 'ttft', layers: []};
  var byId = {};
  RUNS.forEach(function (r) { byId[r.id] = r; });
  var GROUP_COLOR = {};
  RUNS.forEach(function (r) {
    var g = groupKey(r);
    if (!(g in GROUP_COLOR)) GROUP_COLOR[g] = PALETTE[Object.keys(GROUP_COLOR).length % PALETTE.length];
  });

  // ---- values and filters -------------------------------------------------------------------
  function fieldOf(r, key) {
    if (key === GROUP) return groupLabel(r);
    return key.indexOf('knob.') === 0 ? (r.knobs || {})[key.slice(5)] : r[key];
  }
  function labelOf(key, vk) {
    if (key === 'machine' && MACHINES[vk]) return MACHINES[vk].label || vk;
    return vk;
  }
  function filterKeys() {
    return DIMS.map(function (d) { return d[0]; }).concat(KNOBS.map(function (k) { return 'knob.' + k; }));
  }
  function filterTitle(key) {
    if (key === GROUP) return 'Model / machine / workload';
    for (var i = 0; i < DIMS.length; i++) if (DIMS[i][0] === key) return DIMS[i][1];
    return key.slice(5);
  }
  function sortedValues(key) {
    var seen = {};
    RUNS.forEach(function (r) { seen[valueKey(fieldOf(r, key))] = true; });
    var vals = Object.keys(seen);
    var numeric = vals.every(function (v) { return v === 'none' || isFinite(Number(v)); });
    vals.sort(function (a, b) {
      if (a === 'none' || b === 'none') return a === 'none' ? -1 : (b === 'none' ? 1 : 0);
      return numeric ? Number(a) - Number(b) : (a < b ? -1 : a > b ? 1 : 0);
    });
    return vals;
  }
  function passes(r) {
    var keys = filterKeys();
    for (var i = 0; i < keys.length; i++) {
      var allowed = state.sel[keys[i]];
      if (allowed && !allowed[valueKey(fieldOf(r, keys[i]))]) return false;
    }
    return true;
  }
  function groupLabel(r) {
    return [r.workload, r.model, labelOf('machine', valueKey(r.machine))].map(valueKey).join(' / ');
  }

  // ---- sidebar ------------------------------------------------------------------------------
  function buildFilters() {
    var box = document.getElementById('filters');
    box.textContent = '';
    filterKeys().forEach(function (key) {
      var vals = sortedValues(key);
      var fs = el('fieldset', {'class': 'filter', 'data-key': key});
      fs.appendChild(el('legend', {}, filterTitle(key)));
      vals.forEach(function (v) {
        var lab = el('label', {title: labelOf(key, v)});
        var cb = el('input', {type: 'checkbox', value: v});
        cb.checked = !state.sel[key] || !!state.sel[key][v];
        cb.addEventListener('change', function () { readFilters(); render(); });
        lab.appendChild(cb);
        lab.appendChild(document.createTextNode(' ' + labelOf(key, v)));
        fs.appendChild(lab);
      });
      box.appendChild(fs);
    });
    E.layerBoxes(document.getElementById('layers'), LAYERS, state.layers, function () { readFilters(); render(); });
    var color = document.getElementById('color-by');
    color.textContent = '';
    [GROUP].concat(filterKeys()).forEach(function (key) {
      var o = el('option', {value: key}, filterTitle(key));
      if (key === state.color) o.selected = true;
      color.appendChild(o);
    });
    var stat = document.getElementById('stat');
    stat.textContent = '';
    STATS.forEach(function (s) {
      var o = el('option', {value: s[0]}, s[1]);
      if (s[0] === state.stat) o.selected = true;
      stat.appendChild(o);
    });
  }
  function readFilters() {
    state.sel = {};
    state.layers = [];
    document.querySelectorAll('#layers input.layer').forEach(function (cb) { if (cb.checked) state.layers.push(cb.value); });
    document.querySelectorAll('#filters fieldset').forEach(function (fs) {
      var key = fs.getAttribute('data-key');
      var boxes = fs.querySelectorAll('input[type=checkbox]');
      var on = {}, all = true;
      boxes.forEach(function (cb) { if (cb.checked) on[cb.value] = true; else all = false; });
      if (!all) state.sel[key] = on;
    });
    state.color = document.getElementById('color-by').value || GROUP;
    state.stat = document.getElementById('stat').value || 'p50';
  }

  // ---- URL fragment: the view is shareable (#workload=chat&knob.max_num_seqs=8&stat=p95) -----
  function readHash() {
    var h = window.location.hash.replace(/^#/, '');
    if (!h) return;
    var q = new URLSearchParams(h);
    filterKeys().forEach(function (key) {
      var vals = q.getAll(key);
      if (vals.length) {
        state.sel[key] = {};
        vals.forEach(function (v) { state.sel[key][v] = true; });
      }
    });
    if (q.get('stat') && STATS.some(function (s) { return s[0] === q.get('stat'); })) state.stat = q.get('stat');
    if (q.get('color') && [GROUP].concat(filterKeys()).indexOf(q.get('color')) >= 0) state.color = q.get('color');
    if (['ttft', 'itl', 'e2e'].indexOf(q.get('cdf')) >= 0) state.cdf = q.get('cdf');
    if (q.get('layers')) {
      state.layers = q.get('layers').split(',').filter(function (n) { return LAYERS[n]; });
    }
    if (q.get('compare')) {
      state.compare = q.get('compare').split(',').filter(function (id) { return byId[id]; });
    }
  }
  function writeHash() {
    var q = new URLSearchParams();
    Object.keys(state.sel).forEach(function (key) {
      Object.keys(state.sel[key]).forEach(function (v) { q.append(key, v); });
    });
    if (state.stat !== 'p50') q.set('stat', state.stat);
    if (state.color !== GROUP) q.set('color', state.color);
    if (state.compare.length) q.set('compare', state.compare.join(','));
    if (state.cdf !== 'ttft') q.set('cdf', state.cdf);
    if (state.layers.length) q.set('layers', state.layers.join(','));
    var s = q.toString();
    try { history.replaceState(null, '', s ? '#' + s : window.location.pathname + window.location.search); }
    catch (e) { /* some file:// contexts refuse replaceState; the view still works */ }
  }

  // ---- plots --------------------------------------------------------------------------------
  function hoverText(r) {
    var lines = [groupLabel(r)];
    KNOBS.forEach(function (k) { lines.push(k + ' = ' + valueKey((r.knobs || {})[k])); });
    return lines.join('<br>');
  }
  function paretoTraces(runs, family) {
    var name = family + '_' + state.stat;
    var byColor = {}, colorOrder = [], groups = {}, groupOrder = [];
    runs.forEach(function (r) {
      var lat = metric(r, name), tput = metric(r, 'throughput');
      if (lat === null || tput === null) return;
      var p = {lat: lat, tput: tput, run: r};
      var ck = valueKey(fieldOf(r, state.color));
      if (!byColor[ck]) { byColor[ck] = []; colorOrder.push(ck); }
      byColor[ck].push(p);
      var gk = groupKey(r);
      if (!groups[gk]) { groups[gk] = []; groupOrder.push(gk); }
      groups[gk].push(p);
    });
    var traces = [], n = 0;
    colorOrder.forEach(function (ck) {
      var pts = byColor[ck];
      n += pts.length;
      var marker = {size: 9, opacity: 0.8, line: {width: 1.5},
                    symbol: pts.map(function (p) { return p.run.slo === 'misses' ? 'circle-open' : 'circle'; })};
      if (state.color === GROUP) marker.color = GROUP_COLOR[groupKey(pts[0].run)];
      traces.push({type: 'scatter', mode: 'markers', meta: 'runs',
                   name: state.color === GROUP ? ck : filterTitle(state.color) + ' ' + labelOf(state.color, ck),
                   x: pts.map(function (p) { return p.lat; }), y: pts.map(function (p) { return p.tput; }),
                   customdata: pts.map(function (p) { return p.run.id; }),
                   text: pts.map(function (p) { return hoverText(p.run); }),
                   hovertemplate: '%{text}<br>' + name + ' %{x:.3g} ms<br>%{y:.4g} tok/s<extra></extra>',
                   marker: marker});
    });
    groupOrder.forEach(function (gk) {
      var front = paretoFront(groups[gk]);
      traces.push({type: 'scatter', mode: 'lines+markers', meta: 'pareto',
                   name: 'Pareto front' + (groupOrder.length > 1 ? ': ' + groupLabel(groups[gk][0].run) : ''),
                   x: front.map(function (p) { return p.lat; }), y: front.map(function (p) { return p.tput; }),
                   customdata: front.map(function (p) { return p.run.id; }),
                   line: {dash: 'dot', width: 1.5, shape: 'hv', color: GROUP_COLOR[gk]},
                   marker: {symbol: 'star', size: 12, color: GROUP_COLOR[gk], line: {width: 1, color: '#222'}},
                   hoverinfo: 'skip'});
    });
    traces = traces.concat(E.layerTraces(runs, name, state.layers, LAYERS, hoverText));
    function plotted(r) { return metric(r, name) !== null && metric(r, 'throughput') !== null; }
    var picks = runs.filter(function (r) { return r.best && plotted(r); });
    if (picks.length) {
      traces.push({type: 'scatter', mode: 'markers', meta: 'best', name: 'best under its sweep\'s SLO',
                   x: picks.map(function (r) { return metric(r, name); }),
                   y: picks.map(function (r) { return metric(r, 'throughput'); }),
                   customdata: picks.map(function (r) { return r.id; }), hoverinfo: 'skip',
                   marker: {size: 20, symbol: 'diamond-open', color: '#e6a700', line: {width: 3}}});
    }
    var chosen = runs.filter(function (r) { return state.compare.indexOf(r.id) >= 0 && plotted(r); });
    if (chosen.length) {
      traces.push({type: 'scatter', mode: 'markers', meta: 'chosen', name: 'compared',
                   x: chosen.map(function (r) { return metric(r, name); }),
                   y: chosen.map(function (r) { return metric(r, 'throughput'); }),
                   customdata: chosen.map(function (r) { return r.id; }), hoverinfo: 'skip',
                   marker: {size: 18, symbol: 'circle-open', color: '#d62728', line: {width: 2.5}}});
    }
    return {traces: traces, n: n, why: runs.length ? 'No run shown has this latency' : 'No runs match the filters',
            title: familyLabel(family) + ' ' + state.stat + ' (ms, x) vs throughput'};
  }
  // The compared configurations' per-request latencies as distributions (empirical CDFs).
  function cdfTraces(family) {
    var chosen = state.compare.map(function (id) { return byId[id]; }).filter(Boolean);
    var traces = [], n = 0;
    chosen.forEach(function (r, i) {
      var xs = ((r.requests || {})[family] || []).filter(finite);
      n += xs.length;
      traces.push({type: 'scatter', mode: 'lines+markers', meta: 'runs', name: '#' + (i + 1) + ' ' + hoverText(r)
                     .split('<br>').slice(1).join(', '),
                   x: xs, y: xs.map(function (_, j) { return (j + 1) / xs.length; }), line: {shape: 'hv'},
                   marker: {size: 5}, hovertemplate: '%{x:.4g} ms: %{y:.0%} of requests<extra></extra>'});
    });
    var what = family === 'itl' ? 'mean ITL per request' : familyLabel(family) + ' per request';
    return {traces: traces, n: n, title: 'Compared configurations: ' + what + ' (ms, x), fraction of requests',
            why: chosen.length ? 'No per-request latencies recorded for these runs'
                               : 'Choose configurations to compare their latency distributions'};
  }

  function drawPlot(p, runs) {
    var gd = document.getElementById(p.id);
    var t, xt, yt;
    if (p.kind === 'pareto') {
      t = paretoTraces(runs, p.family);
      xt = '';  // in the title: a horizontal legend below the plot would cover an axis title
      yt = 'throughput (output tok/s)';
    } else if (p.kind === 'cdf') {
      t = cdfTraces(state.cdf);
      xt = '';
      yt = 'fraction of requests';
    } else {
      t = E.estimateTraces(runs, p.key, p.label, hoverText);
      xt = 'measured';
      yt = 'estimated';
    }
    var layout = emptyLayout(t.title, xt, yt, t.n, t.why);
    if (p.kind === 'estimate') layout.showlegend = false;  // the title names the dashed diagonal
    if (t.axes) {
      Object.assign(layout.xaxis, t.axes, {title: {text: xt + ' (log)'}});
      Object.assign(layout.yaxis, t.axes, {title: {text: yt + ' (log)'}});
    }
    return Plotly.react(gd, t.traces, layout, PLOT_CONFIG).then(function () {
      if (!gd.__exploreClick) {
        gd.__exploreClick = true;
        gd.on('plotly_click', function (ev) {
          var pt = ev && ev.points && ev.points[0];
          if (pt && pt.customdata && byId[pt.customdata]) toggleCompare(pt.customdata);
        });
      }
    });
  }

  // ---- tables -------------------------------------------------------------------------------
  function toggleCompare(id) {
    var i = state.compare.indexOf(id);
    if (i >= 0) state.compare.splice(i, 1); else state.compare.push(id);
    render();
  }
  function onFronts(runs) {
    var name = 'ttft_' + state.stat, groups = {}, on = {};
    runs.forEach(function (r) {
      var lat = metric(r, name), tput = metric(r, 'throughput');
      if (lat === null || tput === null) return;
      (groups[groupKey(r)] = groups[groupKey(r)] || []).push({lat: lat, tput: tput, run: r});
    });
    Object.keys(groups).forEach(function (g) {
      paretoFront(groups[g]).forEach(function (p) { on[p.run.id] = true; });
    });
    return on;
  }
  function runsTable(runs) {
    var box = document.getElementById('runs');
    box.textContent = '';
    var table = el('table', {'class': 'runs'});
    var head = el('tr');
    ['compare', 'workload', 'model'].concat(KNOBS)
      .concat(['tok/s', 'TTFT ' + state.stat, 'ITL ' + state.stat, 'E2E ' + state.stat, 'TTFT front', 'SLO', 'sweep pick'])
      .forEach(function (h) { head.appendChild(el('th', {}, h)); });
    table.appendChild(head);
    var front = onFronts(runs);
    runs.slice().sort(function (a, b) { return (metric(b, 'throughput') || 0) - (metric(a, 'throughput') || 0); })
      .forEach(function (r) {
        var tr = el('tr', {'data-run': r.id});
        var td = el('td');
        var cb = el('input', {type: 'checkbox', 'class': 'compare'});
        cb.checked = state.compare.indexOf(r.id) >= 0;
        cb.addEventListener('change', function () { toggleCompare(r.id); });
        td.appendChild(cb);
        tr.appendChild(td);
        [r.workload, r.model].concat(KNOBS.map(function (k) { return valueKey((r.knobs || {})[k]); }))
          .concat([metric(r, 'throughput'), metric(r, 'ttft_' + state.stat), metric(r, 'itl_' + state.stat),
                   metric(r, 'e2e_' + state.stat), front[r.id] ? '\u2605' : '',
                   r.slo === 'meets' ? '\u2713' : (r.slo === 'misses' ? '\u2717' : '-'), r.best ? '\u25c6' : ''])
          .forEach(function (v) { tr.appendChild(el('td', {}, fmt(v))); });
        table.appendChild(tr);
      });
    box.appendChild(table);
  }
  function compareTable() {
    var box = document.getElementById('compare');
    box.textContent = '';
    var chosen = state.compare.map(function (id) { return byId[id]; }).filter(Boolean);
    if (!chosen.length) {
      box.appendChild(el('p', {'class': 'hint'},
                         'Click a point in a plot or tick "compare" in the table to put configurations side by side.'));
      return;
    }
    var table = el('table', {'class': 'compare'});
    var rows = [['workload', function (r) { return r.workload; }], ['model', function (r) { return r.model; }],
                ['machine', function (r) { return labelOf('machine', valueKey(r.machine)); }]];
    KNOBS.forEach(function (k) { rows.push([k, function (r) { return valueKey((r.knobs || {})[k]); }]); });
    rows.push(['throughput (tok/s)', function (r) { return metric(r, 'throughput'); }]);
    rows.push(['throughput (req/s)', function (r) { return metric(r, 'request_throughput'); }]);
    rows.push(['throughput: goodput (req/s meeting the SLO)', function (r) { return metric(r, 'goodput'); }]);
    FAMILIES.forEach(function (f) {
      STATS.forEach(function (s) {
        rows.push([f[1] + ' ' + s[1] + ' (ms)', function (r) { return metric(r, f[0] + '_' + s[0]); }]);
      });
    });
    ESTIMATES.forEach(function (e) { rows.push(['estimated ' + e[1], function (r) { return estimate(r, e[0]); }]); });
    Object.keys(LAYERS).sort().forEach(function (prof) {
      ESTIMATES.forEach(function (e) {
        rows.push(['estimated on ' + prof + ' (not measured) ' + e[1],
                   function (r) { var x = ((r.profile_estimates || {})[prof] || {})[e[0]]; return finite(x) ? x : null; }]);
      });
    });
    rows.push(['other work during the run', function (r) {
      return r.load + (finite(r.foreign_cpu) ? ' (' + (100 * r.foreign_cpu).toFixed(0) + '% of the machine)' : '');
    }]);
    rows.push(['sweep constraints', function (r) { return (r.constraints || 'none') + ' (' + r.slo + ')'; }]);
    rows.push(['sweep pick', function (r) { return r.best ? 'yes: most throughput under the constraints' : 'no'; }]);
    var head = el('tr');
    head.appendChild(el('th', {}, ''));
    chosen.forEach(function (r, i) {
      var th = el('th', {}, '#' + (i + 1) + ' ');
      var x = el('button', {type: 'button', 'class': 'remove', title: 'remove'}, '\u00d7');
      x.addEventListener('click', function () { toggleCompare(r.id); });
      th.appendChild(x);
      head.appendChild(th);
    });
    table.appendChild(head);
    rows.forEach(function (row) {
      var tr = el('tr');
      tr.appendChild(el('th', {}, row[0]));
      var vals = chosen.map(row[1]);
      var nums = vals.filter(finite);
      chosen.forEach(function (r, i) {
        var td = el('td', {}, fmt(vals[i]));
        if (nums.length > 1 && finite(vals[i])) {
          var better = row[0].indexOf('throughput') === 0 ? Math.max.apply(null, nums) : Math.min.apply(null, nums);
          if (vals[i] === better && !row[0].startsWith('estimated')) td.className = 'best';
        }
        tr.appendChild(td);
      });
      table.appendChild(tr);
    });
    var tr = el('tr');
    tr.appendChild(el('th', {}, 'serve command'));
    chosen.forEach(function (r) {
      var td = el('td');
      td.appendChild(el('code', {'class': 'command'}, r.command || '-'));
      if (r.command) td.appendChild(copyButton(r.command));
      tr.appendChild(td);
    });
    table.appendChild(tr);
    box.appendChild(table);
    var last = chosen[chosen.length - 1];
    var cmd = document.getElementById('command');
    cmd.textContent = '';
    cmd.appendChild(el('code', {'class': 'command'}, last.command || '(no command recorded)'));
  }
  // Each sweep's pick (most throughput under its constraints) with its serve command: the optimiser's
  // answer, for the sweeps with a run among those shown.
  function picksBox(runs) {
    var box = document.getElementById('picks');
    box.textContent = '';
    box.appendChild(el('h3', {}, 'Sweep picks: most throughput under the sweep\'s SLO'));
    var shown = {};
    runs.forEach(function (r) { shown[r.sweep] = true; });
    var list = el('ul', {'class': 'picks'});
    SWEEPS.filter(function (sw) { return shown[sw.id]; }).forEach(function (sw) {
      var li = el('li', {'data-pick': sw.pick || ''});
      var head = [sw.workload, sw.model, labelOf('machine', sw.machine)].join(' / ') + ' (' + sw.runs + ' runs, ' +
                 (sw.constraints || 'no constraints') + '): ';
      li.appendChild(el('b', {}, head));
      var r = sw.pick && byId[sw.pick];
      if (!sw.constraints) li.appendChild(document.createTextNode('no SLO given'));
      else if (!r) li.appendChild(document.createTextNode('no configuration meets the SLO'));
      else {
        li.appendChild(document.createTextNode(fmt(metric(r, 'throughput')) + ' tok/s, TTFT p95 ' + fmt(metric(r, 'ttft_p95')) +
                                               ' ms, ITL p95 ' + fmt(metric(r, 'itl_p95')) + ' ms '));
        var b = el('button', {type: 'button'}, state.compare.indexOf(r.id) >= 0 ? 'uncompare' : 'compare');
        b.addEventListener('click', function () { toggleCompare(r.id); });
        li.appendChild(b);
        li.appendChild(el('br'));
        li.appendChild(el('code', {'class': 'command'}, r.command || '-'));
      }
      if (sw.sweep) li.appendChild(el('div', {'class': 'note'}, 'swept: ' + sw.sweep));
      if (sw.notes) li.appendChild(el('div', {'class': 'note'}, 'notes: ' + sw.notes));
      list.appendChild(li);
    });
    box.appendChild(list);
  }
  function machinesBox() {
    var box = document.getElementById('machines');
    box.textContent = '';
    Object.keys(MACHINES).forEach(function (id) {
      var m = MACHINES[id];
      var d = el('details');
      d.appendChild(el('summary', {}, m.label || id));
      d.appendChild(el('pre', {}, JSON.stringify(m.details || {}, null, 1)));
      box.appendChild(d);
    });
  }

  // ---- render and report ----------------------------------------------------------------------
  function report(runs) {
    var out = {runs_total: RUNS.length, runs_shown: runs.length, compared: state.compare.length, stat: state.stat,
               plots: {},
               picks: document.querySelectorAll('#picks li[data-pick]:not([data-pick=""])').length,
               sweeps_listed: document.querySelectorAll('#picks li').length};
    PLOTS.forEach(function (p) {
      var gd = document.getElementById(p.id);
      var c = {points: 0, pareto: 0, best: 0, drawn_points: 0, estimated: 0, traces: (gd.data || []).length};
      var layers = gd.querySelectorAll('.scatterlayer .trace');
      (gd.data || []).forEach(function (t, i) {
        var n = (t.x || []).length;
        var drawn = layers[i] ? layers[i].querySelectorAll('.points path').length : 0;
        if (t.meta === 'runs') { c.points += n; c.drawn_points += drawn; }
        if (t.meta === 'pareto') c.pareto += n;
        if (t.meta === 'best') c.best += n;
        if (t.meta === 'estimate-layer') c.estimated += n;
      });
      out.plots[p.id] = c;
    });
    var st = document.getElementById('explore-status');
    st.textContent = JSON.stringify(out);
    st.setAttribute('data-ready', '1');
  }
  function render() {
    var runs = RUNS.filter(passes);
    document.getElementById('shown').textContent = runs.length + ' of ' + RUNS.length + ' runs';
    writeHash();
    runsTable(runs);
    compareTable();
    picksBox(runs);
    return Promise.all(PLOTS.map(function (p) { return drawPlot(p, runs); })).then(function () { report(runs); });
  }

  function start() {
    document.getElementById('reset').addEventListener('click', function () {
      state.sel = {}; state.compare = []; state.stat = 'p50'; state.color = GROUP; state.layers = [];
      buildFilters(); render();
    });
    document.getElementById('color-by').addEventListener('change', function () { readFilters(); render(); });
    document.getElementById('stat').addEventListener('change', function () { readFilters(); render(); });
    document.getElementById('cdf-metric').addEventListener('change', function (e) { state.cdf = e.target.value; render(); });
    readHash();
    buildFilters();
    document.getElementById('cdf-metric').value = state.cdf;
    machinesBox();
    render().catch(function (e) { console.error('explorer render failed: ' + (e && e.stack || e)); });
  }
  start();
})();
