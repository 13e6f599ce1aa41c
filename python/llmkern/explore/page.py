"""The Explorer's HTML: one self-contained file (plotly's JS, the page's JS and CSS, the runs as JSON).

The embedded data (`explore.data.load` builds it) is a dict:

    {"title", "source", "generated", "knobs": [knob names, in display order],
     "machines": {id: {"label": str, "details": dict}},
     "sweeps": [{"id", "model", "machine", "workload", "runs": successful runs, "constraints": str,
                 "pick": id of the run with the most throughput under the constraints, or null,
                 "sweep": the sweep grammar it ran, "notes": free text stored with it}],
     "runs": [{"id": str, "model", "machine" (an id of machines), "workload",
               "knobs": {name: value}, "metrics": {"throughput": output tok/s, "goodput",
               "request_throughput" (req/s), "ttft_p50"|"ttft_mean"|"ttft_p95"|"ttft_p99", same for
               "itl_" and "e2e_" (ms)}, "estimate": {"throughput", "itl_p50", "ttft_p50", "e2e_p50"},
               "command": "llmkern serve ...", "constraints": str, "slo": "meets"|"misses"|"no SLO",
               "best": bool (the sweep's pick under its constraints),
               "requests": {"ttft", "e2e", "itl"}: completed requests' latencies, sorted (ms),
               "load": "quiet"|"busy (other work)"|"not recorded", "foreign_cpu": share of the machine
               other processes used during the run, "load_1m": load average before it,
               "profile_estimates": {profile: the same requests estimated on that hardware, named as
               "metrics"}}],
     "estimate_profiles": {profile: label saying it is an estimate}}

A missing metric is absent or null; the page leaves such a run out of the plots that need it.
"""
from __future__ import annotations

import html
import json
import os
import re
from functools import lru_cache

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")

# Hooks installed before any other script: a console error, an uncaught exception or an unhandled
# promise rejection is written into #explore-errors, where a headless browser reads it back.
_ERROR_HOOKS = """
window.__exploreErrors = [];
(function () {
  function record(msg) {
    window.__exploreErrors.push(String(msg));
    var el = document.getElementById('explore-errors');
    if (el) el.textContent = JSON.stringify(window.__exploreErrors);
  }
  var original = console.error;
  console.error = function () {
    record(Array.prototype.map.call(arguments, String).join(' '));
    return original.apply(console, arguments);
  };
  window.addEventListener('error', function (e) {  // capturing: also sees resources that failed to load
    var t = e.target;
    if (t && t !== window && (t.src || t.href)) record('failed to load ' + (t.src || t.href));
    else record('uncaught: ' + e.message + ' at ' + e.filename + ':' + e.lineno);
  }, true);
  window.addEventListener('unhandledrejection', function (e) {
    record('unhandled rejection: ' + (e.reason && e.reason.stack || e.reason));
  });
  document.addEventListener('DOMContentLoaded', function () {  // errors raised before <body> existed
    document.getElementById('explore-errors').textContent = JSON.stringify(window.__exploreErrors);
  });
})();
"""


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js from the plotly Python package (offline: nothing is fetched from a CDN)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as e:
        raise RuntimeError("the explorer needs plotly: pip install \"llmkern[explore]\" (or pip install plotly)") from e
    return get_plotlyjs()


def _static(name: str) -> str:
    with open(os.path.join(STATIC, name), encoding="utf-8") as f:
        return f.read()


def _json_safe(text: str) -> str:
    """JSON that cannot close the <script> element it sits in ("<\\/" is "</" in a JSON string)."""
    return text.replace("</", "<\\/")


def _js_safe(text: str) -> str:
    """Script text that cannot close its <script> element (only strings and regexes can hold these)."""
    return re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE).replace("<!--", "<\\!--")


def render(data: dict) -> str:
    """The page for `data` (shape in the module docstring), as one HTML string."""
    payload = _json_safe(json.dumps(data, allow_nan=False, separators=(",", ":"), default=str))
    title = html.escape(data.get("title") or "llmkern Performance Explorer")
    sub = html.escape(f"{data.get('source', '')} - {len(data.get('runs', []))} runs - generated {data.get('generated', '')}")
    empty = "" if data.get("runs") else (
        '<p class="empty">This database holds no runs yet. Fill it with <code>llmkern optimize</code>.</p>')
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<script>{_ERROR_HOOKS}</script>
<style>{_static("explorer.css")}</style>
<script>{_js_safe(plotly_js())}</script>
</head>
<body>
<pre id="explore-errors">[]</pre>
<pre id="explore-status" data-ready="0">{{}}</pre>
<header><h1>{title}</h1><div class="sub">{sub}</div></header>
{empty}
<div id="layout">
<aside id="sidebar">
<div id="shown"></div>
<label for="stat">latency statistic</label><select id="stat"></select>
<label for="color-by">colour points by</label><select id="color-by"></select>
<button type="button" id="reset">show everything</button>
<div id="layers"></div>
<div id="filters"></div>
</aside>
<main id="main">
<h2>Pareto fronts: throughput vs latency</h2>
<div class="grid">
<div class="plot" id="pareto-ttft"></div><div class="plot" id="pareto-itl"></div><div class="plot" id="pareto-e2e"></div>
<div class="plot" id="picks"></div>
</div>
<h2>Compared configurations</h2>
<div id="compare"></div>
<label for="cdf-metric">latency distribution of the compared configurations:</label>
<select id="cdf-metric"><option value="ttft">TTFT</option><option value="itl">mean ITL per request</option>
<option value="e2e">E2E latency</option></select>
<div class="grid"><div class="plot" id="cdf"></div></div>
<h3>Serve command of the last chosen configuration</h3>
<div id="command"><code class="command">(choose a configuration)</code></div>
<h2>Estimate vs measured</h2>
<div class="grid">
<div class="plot" id="estimate-throughput"></div><div class="plot" id="estimate-itl_p50"></div>
<div class="plot" id="estimate-ttft_p50"></div><div class="plot" id="estimate-e2e_p50"></div>
</div>
<h2>Runs</h2>
<div id="runs"></div>
<h2>Machines</h2>
<div id="machines"></div>
</main>
</div>
<script type="application/json" id="explore-data">{payload}</script>
<script>{_js_safe(_static("explorer_util.js"))}</script>
<script>{_js_safe(_static("explorer_estimates.js"))}</script>
<script>{_js_safe(_static("explorer.js"))}</script>
</body>
</html>
"""
