"""`llmkern explore --serve`: the page on loopback (stdlib http.server, no extra dependency).

The page is rebuilt from the database on every load of /, so a sweep that is still writing to it
shows its new runs on reload.
"""
from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

HOST = "127.0.0.1"  # loopback only: the page shows machine descriptions and commands


def make_server(build_page: Callable[[], str], port: int = 8050) -> ThreadingHTTPServer:
    """A server (not yet serving) whose / answers build_page(); port 0 picks a free port
    (server.server_address[1] says which)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            path = self.path.split("?", 1)[0].split("#", 1)[0]
            if path not in ("/", "/index.html"):
                self._send(404, "text/plain; charset=utf-8", b"not found: the explorer is at /\n")
                return
            try:
                body = build_page().encode("utf-8")
            except Exception as e:  # e.g. the database became unreadable: say so in the browser
                self._send(500, "text/plain; charset=utf-8", f"llmkern explore: {e}\n".encode("utf-8"))
                return
            self._send(200, "text/html; charset=utf-8", body)

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):  # quiet: one line per request is noise here
            pass

    server = ThreadingHTTPServer((HOST, port), Handler)
    server.daemon_threads = True
    return server
