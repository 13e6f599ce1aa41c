"""`llmkern explore`: the Performance Explorer over a runs database.

    llmkern explore                                  page over the shipped database -> ./llmkern-explorer.html
    llmkern explore --db runs.sqlite --out page.html a database of your own sweeps
    llmkern explore --serve [--port 8050]            serve it on 127.0.0.1 (rebuilt on every reload)
    llmkern explore --screenshot page.png            a PNG of the page (headless Chromium)
    llmkern explore --view "workload=chat&stat=p95"  the view a fresh page opens with (its URL fragment)
    llmkern explore --only workload=chat             embed only some runs (model, machine, workload, a knob)
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

DEFAULT_OUT = "llmkern-explorer.html"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, help="runs database written by `llmkern optimize` "
                                              "(default: the one shipped with llmkern, real runs on a CPU machine)")
    p.add_argument("--out", default=None, help=f"HTML file to write (default: ./{DEFAULT_OUT}; with --serve or "
                                               "--screenshot only when given)")
    p.add_argument("--serve", action="store_true", help="serve the page on 127.0.0.1 until Ctrl-C")
    p.add_argument("--port", type=int, default=8050, help="port for --serve (0: any free port)")
    p.add_argument("--screenshot", default=None, metavar="PNG", help="write a screenshot of the page (needs Chromium)")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                   help="embed only the runs with this model, machine (id or label), workload or knob value "
                        "(repeatable; all must hold), e.g. --only workload=chat --only max_num_seqs=8")
    p.add_argument("--view", default=None, metavar="FRAGMENT",
                   help="initial filters as the page's URL fragment, e.g. 'workload=chat&knob.max_num_seqs=8&stat=p95'")


def _fail(msg: str) -> None:
    raise SystemExit(f"llmkern explore: {msg}")


def _db_path(a) -> str:
    if a.db is not None:
        return a.db
    from ..optimize.db import default_db_path

    return default_db_path()


def build_page(db_path: str, allow_empty: bool = False, only: Optional[dict] = None) -> str:
    """The page's HTML for the database at db_path (explore.data.ExploreError when it cannot be shown)."""
    from . import data, page

    return page.render(data.load(db_path, allow_empty=allow_empty, only=only))


def screenshot_db(db_path: str, png_path: str, view: str = "") -> int:
    """A screenshot of the page over db_path (for reports); returns how many runs it shows. Raises
    data.ExploreError, browser.BrowserError, or RuntimeError (plotly missing)."""
    from . import browser, data, page

    d = data.load(db_path)
    if not view:  # show the comparison too: each sweep's pick, else the two fastest runs
        picks = [r["id"] for r in d["runs"] if r.get("best")][:3] or [
            r["id"] for r in sorted(d["runs"], key=lambda r: -(r["metrics"].get("throughput") or 0))[:2]]
        view = "compare=" + ",".join(picks)
    browser.screenshot_html(page.render(d), png_path, view)
    return len(d["runs"])


def run(a) -> int:
    from . import browser
    from .data import ExploreError

    if not 0 <= a.port <= 65535:
        _fail(f"--port: expected 0..65535, got {a.port}")
    if a.screenshot:  # checked before any work
        png_dir = os.path.dirname(os.path.abspath(a.screenshot))
        if not os.path.isdir(png_dir):
            _fail(f"--screenshot: folder {png_dir} does not exist")
        if not browser.find_chromium():
            _fail("--screenshot: needs Chromium (Debian: apt-get install chromium; or set LLMKERN_CHROMIUM to its path)")
    from .data import parse_only

    try:
        only = parse_only(a.only)
    except ValueError as e:
        _fail(str(e))
    db = _db_path(a)
    try:  # --serve may watch a database a sweep is about to fill: empty is fine there
        html = build_page(db, allow_empty=a.serve and not (a.out or a.screenshot), only=only)
    except ExploreError as e:
        _fail(f"--db: {e}" if a.db is not None else f"the shipped database: {e} (pass --db FILE)")
    except RuntimeError as e:  # plotly missing
        _fail(str(e))
    out = a.out or (None if (a.serve or a.screenshot) else DEFAULT_OUT)
    if out:
        try:
            with open(out, "w", encoding="utf-8") as f:
                f.write(html)
        except OSError as e:
            _fail(f"--out: cannot write {out}: {e.strerror or e}")
        print(f"llmkern explore: wrote {out} ({len(html) / 1e6:.1f} MB, open it in a browser)")
    if a.screenshot:
        _screenshot(html, out, a.screenshot, a.view or "", browser)
    if a.serve:
        return _serve(db, a.port, a.view or "", only)
    return 0


def _screenshot(html: str, out, png: str, view: str, browser) -> None:
    try:
        if out:
            browser.screenshot(browser.file_url(out, view), png)
        else:
            browser.screenshot_html(html, png, view)
    except browser.BrowserError as e:
        _fail(f"--screenshot: {e}")
    print(f"llmkern explore: wrote {png}")


def _serve(db: str, port: int, view: str, only: dict) -> int:
    from .data import ExploreError
    from .serve import HOST, make_server

    def page() -> str:
        try:
            return build_page(db, allow_empty=True, only=only)
        except ExploreError as e:
            raise RuntimeError(str(e)) from None

    try:
        server = make_server(page, port)
    except OSError as e:
        _fail(f"--port: cannot listen on {HOST}:{port}: {e.strerror or e}")
    url = f"http://{HOST}:{server.server_address[1]}/" + (f"#{view.lstrip('#')}" if view else "")
    print(f"llmkern explore: serving {url} (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="llmkern explore", description="The Performance Explorer over a runs database.")
    add_args(ap)
    return run(ap.parse_args(sys.argv[1:] if argv is None else argv))
