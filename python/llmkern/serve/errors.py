"""OpenAI's error object ({"error": {"message", "type", "param", "code"}}) for every failure the
server reports; nothing else (no traceback) ever reaches a client."""
from __future__ import annotations

import re
from typing import Dict, Optional

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None, type: Optional[str] = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def request_error(message: str) -> APIError:
    """A request the engine failed on its own (it serves on): 500, code request_error."""
    return APIError(500, message, code="request_error", type="InternalServerError")


_PARAM = re.compile(r"^([A-Za-z_][\w.\[\]]*): ")


def from_value_error(e: Exception, status: int = 400) -> APIError:
    """A ValueError/TypeError from the engine or SamplingParams: their messages start with the
    argument's name ("top_p: expected ..."), which becomes the error's param."""
    msg = str(e)
    m = _PARAM.match(msg)
    return APIError(status, msg, param=m.group(1) if m else None)


def json_response(err: APIError):
    from fastapi.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def install_error_handlers(app, log, what: str) -> None:
    """Every error of a FastAPI app as an OpenAI-style error object: APIError as raised, routing
    errors (404, 405) naming the request, anything else a 500 logged with its traceback (never
    shown to the client). `what` names the server in the log."""
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return json_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc):
        msg = "not found" if exc.status_code == 404 else str(exc.detail)
        return json_response(APIError(exc.status_code, f"{request.method} {request.url.path}: {msg}"))

    @app.exception_handler(Exception)
    async def _internal(request, exc):
        log.exception("%s: internal error", what)
        return json_response(APIError(500, "internal server error", code="internal_error"))
