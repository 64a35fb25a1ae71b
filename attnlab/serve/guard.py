"""What every request meets before its route: the browser guard (foreign web origins, content types), the API key,
the body's size limit, and the tenant salt that keys the prefix cache.

Browser-safe defaults (as Ollama's origin allowlist and Jupyter's checks): any web page can make a browser send a
``text/plain`` POST to 127.0.0.1 without a CORS preflight, so a POST body must be ``application/json`` (415
otherwise) and a request whose ``Origin`` is neither this server's own nor on ``--allow-origin`` is refused (403).
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import secrets

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from attnlab.serve.config import ServeConfig
from attnlab.serve.metrics import Metrics
from attnlab.serve.protocol import ApiError

POST_ROUTES = ("/v1/completions", "/v1/chat/completions")  # the bodies a browser could be made to send
log = logging.getLogger("attnlab.serve")


def _own_origins(request: Request) -> set[str]:
    return {f"{request.url.scheme}://{request.headers.get('host', '')}"}


def install_browser_guard(app: FastAPI, cfg: ServeConfig, metrics: Metrics) -> None:
    """The middleware: refuse what a foreign web page could make a visitor's browser send (403, 415), and answer
    anything unexpected in OpenAI's shape (500, with a request id the log repeats)."""

    @app.middleware("http")
    async def browser_guard(request: Request, call_next):
        origin = request.headers.get("origin")
        if origin is not None and origin not in _own_origins(request) and origin not in cfg.allow_origins:
            err = ApiError(403, f"requests from the web origin {origin!r} are not allowed; start the server with "
                           f"--allow-origin {origin} to allow it", None, "origin_not_allowed", "permission_error")
            return JSONResponse(err.body(), status_code=403)
        if request.method == "POST" and request.url.path in POST_ROUTES:
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                err = ApiError(415, f"a POST body must be sent as 'Content-Type: application/json', not "
                               f"{kind or 'none'!r}", None, "unsupported_media_type")
                return JSONResponse(err.body(), status_code=415)
        try:
            return await call_next(request)
        except Exception:  # noqa: BLE001 - the catch-all: a bug answers in OpenAI's shape, never plain text
            rid = "req-" + secrets.token_hex(8)
            log.exception("unexpected error in %s %s (%s)", request.method, request.url.path, rid)
            err = ApiError(500, f"internal error while handling the request (request id {rid}); the server log "
                           "has the details", None, "internal_error", "server_error")
            metrics.requests.labels(request.url.path, "500").inc()
            return JSONResponse(err.body(), status_code=500, headers={"X-Request-Id": rid})


def check_key(cfg: ServeConfig, request: Request) -> None:
    """With an API key, every /v1 and /api route needs ``Authorization: Bearer KEY``, compared in constant time."""
    if cfg.api_key is None:
        return
    given = request.headers.get("authorization", "")
    token = given[7:] if given.lower().startswith("bearer ") else ""
    if not hmac.compare_digest(token.encode(), cfg.api_key.encode()):
        raise ApiError(401, "missing or wrong API key; send 'Authorization: Bearer KEY'", None,
                       "invalid_api_key", "authentication_error")


def tenant_salt(cfg: ServeConfig, request: Request, req) -> str:
    """What keys this request's prefix cache: its API key's identity (a digest, never the key) and its
    ``cache_salt``, so one tenant cannot probe another's prompts through ``cached_tokens``."""
    key = request.headers.get("authorization", "") if cfg.api_key is not None else ""
    who = hashlib.blake2b(key.encode(), digest_size=8).hexdigest() if key else ""
    return f"{who}|{req.cache_salt or ''}" if (who or req.cache_salt) else ""


async def read_body(cfg: ServeConfig, request: Request) -> bytes:
    """The body, read by hand so that one past ``cfg.max_body_bytes`` is refused (413) before it is all in memory."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cfg.max_body_bytes:
        raise ApiError(413, f"the request body of {declared} bytes exceeds the limit of {cfg.max_body_bytes}",
                       None, "body_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cfg.max_body_bytes:
            raise ApiError(413, f"the request body exceeds the limit of {cfg.max_body_bytes} bytes", None,
                           "body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)
