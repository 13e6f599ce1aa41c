"""Headless Chromium: a page's DOM after its scripts ran, and screenshots.

Chromium runs with a fresh profile in a temporary folder, in its own process group, and is killed
with that whole group when it outlives its time limit, so no browser process is left behind.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from typing import List, Optional, Tuple

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# --no-sandbox: Chromium's sandbox refuses to start as root (CI runs as root). No host name resolves:
# the page is self-contained, so a request to the network would be a bug and shows up as a console error.
BASE_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
              "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
              "--host-resolver-rules=MAP * ~NOTFOUND"]


class BrowserError(RuntimeError):
    pass


def find_chromium() -> Optional[str]:
    """The Chromium binary: $LLMKERN_CHROMIUM, else the first of CANDIDATES on PATH; None if absent."""
    env = os.environ.get("LLMKERN_CHROMIUM")
    if env:
        return env if os.access(env, os.X_OK) else None
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def run_headless(args: List[str], timeout_s: float = 60.0, binary: Optional[str] = None) -> Tuple[int, str, str]:
    """Runs Chromium with BASE_FLAGS + args; (exit code, stdout, stderr). Raises BrowserError when
    Chromium is absent or outlives timeout_s (after killing its process group)."""
    binary = binary or find_chromium()
    if not binary:
        raise BrowserError("Chromium was not found (install Debian's `chromium` package, or set LLMKERN_CHROMIUM "
                           "to the browser's path)")
    profile = tempfile.mkdtemp(prefix="llmkern-chromium-")
    try:
        cmd = [binary] + BASE_FLAGS + [f"--user-data-dir={profile}"] + list(args)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                start_new_session=True, text=True, errors="replace")
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            raise BrowserError(f"Chromium did not finish within {timeout_s:.0f} s and was stopped") from None
        except BaseException:  # Ctrl-C: take the browser down too
            _kill_group(proc)
            proc.communicate()
            raise
        finally:
            _kill_group(proc)  # helpers Chromium may leave in its group after the main process exits
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return proc.returncode, out, err


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def file_url(path: str, fragment: str = "") -> str:
    url = "file://" + os.path.abspath(path)
    return url + ("#" + fragment.lstrip("#") if fragment else "")


def dump_dom(url: str, budget_ms: int = 15000, timeout_s: float = 90.0) -> Tuple[str, str]:
    """The serialised DOM of url once its scripts ran for up to budget_ms of virtual time, and
    Chromium's stderr (which holds the page's console messages)."""
    rc, out, err = run_headless(["--enable-logging=stderr", "--v=0", f"--virtual-time-budget={budget_ms}",
                                 "--dump-dom", url], timeout_s)
    if rc != 0 or not out.strip():
        raise BrowserError(f"Chromium exited with code {rc} without a DOM: {err.strip()[-500:]}")
    return out, err


def screenshot(url: str, png_path: str, width: int = 1400, height: int = 2000, budget_ms: int = 15000,
               timeout_s: float = 90.0) -> str:
    """A PNG of url (width x height pixels) after its scripts ran; returns png_path."""
    png_path = os.path.abspath(png_path)
    if os.path.exists(png_path):
        os.remove(png_path)  # so a stale file cannot pass for this run's screenshot
    rc, _, err = run_headless([f"--window-size={width},{height}", f"--virtual-time-budget={budget_ms}",
                               f"--screenshot={png_path}", url], timeout_s)
    if rc != 0 or not os.path.exists(png_path):
        raise BrowserError(f"Chromium exited with code {rc} without writing {png_path}: {err.strip()[-500:]}")
    return png_path


def screenshot_html(html: str, png_path: str, fragment: str = "", **kw) -> str:
    """screenshot() of a page given as HTML text (written to a temporary file, removed after)."""
    fd, tmp = tempfile.mkstemp(suffix=".html", prefix="llmkern-page-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(html)
        return screenshot(file_url(tmp, fragment), png_path, **kw)
    finally:
        os.remove(tmp)
