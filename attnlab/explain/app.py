"""The explainer's HTTP side: the page (static/, plain HTML/JS/CSS, nothing from a CDN) and one JSON route per view.

``router(get)`` holds the routes; ``get()`` returns the Explained model (``attnlab explain`` loads it at start,
``attnlab serve``'s tab loads its own copy on first use, so that recording a pass never touches the model the
engine is serving). One view is computed at a time (a lock: recording swaps the model's kernels), in a worker
thread. Bad input is a 400 naming the problem; a body must be JSON (415), at most 64 KiB (413).
"""
from __future__ import annotations

import asyncio
import json
import queue
import threading
from pathlib import Path
from typing import Callable

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

from attnlab.errors import AttnlabError
from attnlab.explain import views

STATIC = Path(__file__).parent / "static"
MAX_BODY = 64 * 1024
_FILES = {"explain.js": "text/javascript", "explain.css": "text/css", "charts.js": "text/javascript"}


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


async def _body(request: Request) -> dict:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise BadRequest(415, f"send the body as 'Content-Type: application/json', not {kind or 'none'!r}")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise BadRequest(413, f"the request body exceeds {MAX_BODY} bytes")
    try:
        body = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(400, f"the body is not valid JSON ({e})") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object, e.g. {\"prompt\": \"...\"}")
    return body


def _int(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadRequest(400, f"'{name}' must be a whole number from {lo} to {hi}, got {v!r}")
    return v


def _prompt(body: dict) -> str:
    p = body.get("prompt")
    if not isinstance(p, str) or not p:
        raise BadRequest(400, "'prompt' must be a non-empty string: type a prompt")
    return p


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


def router(get: Callable[[], views.Explained], predict: Callable[[object, int], float | None] | None = None,
           authorize: Callable[[Request], str | None] | None = None, served: bool = False) -> APIRouter:
    """The page and the views' routes. ``predict(cfg, n)``: the cost model's prefill seconds for n tokens, or None
    while this machine's calibration is not ready. ``authorize(request)``: why an /api request is refused (401), or
    None (``attnlab serve``'s API key). ``served``: mounted beside ``attnlab serve``'s page (the page links back)."""
    r = APIRouter()
    lock = threading.Lock()

    def refused(request: Request) -> JSONResponse | None:
        why = authorize(request) if authorize else None
        return _error(401, why) if why else None

    async def compute(fn, *args):
        def locked():
            with lock:
                return fn(get(), *args)
        try:
            return await asyncio.to_thread(locked)
        except AttnlabError as e:
            raise BadRequest(400, str(e)) from None

    async def answer(request: Request, fn):
        if (denied := refused(request)) is not None:
            return denied
        try:
            body = await _body(request)
            return JSONResponse(await fn(body))
        except BadRequest as e:
            return _error(e.status, e.message)

    @r.get("/")
    async def page():
        return FileResponse(STATIC / "explain.html", media_type="text/html")

    @r.get("/static/{name}")
    async def static(name: str):
        if name not in _FILES:
            return _error(404, f"no static file {name!r}")
        return FileResponse(STATIC / name, media_type=_FILES[name])

    @r.get("/api/info")
    async def info(request: Request):
        if (denied := refused(request)) is not None:
            return denied
        try:
            return JSONResponse(await compute(lambda ex: {**ex.facts(), "served": served}))
        except BadRequest as e:
            return _error(e.status, e.message)

    @r.post("/api/attention")
    async def attention(request: Request):
        return await answer(request, lambda b: compute(views.attention, _prompt(b), _int(b, "layer", 0, 0, 1024),
                                                       _int(b, "head", 0, 0, 1024)))

    @r.post("/api/budget")
    async def budget(request: Request):
        def fn(b):
            filler = b.get("filler", " and so on")
            if not isinstance(filler, str) or not filler or len(filler) > 200:
                raise BadRequest(400, "'filler' must be a string of 1 to 200 characters")
            return compute(views.budget, _prompt(b), filler)
        return await answer(request, fn)

    @r.post("/api/grid")
    async def grid(request: Request):
        def fn(b):
            top = _int(b, "max_tokens", 512, 16, 4096)
            lengths = tuple(n for n in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if n <= top)
            pred = (lambda ex: (lambda n: predict(ex.cfg, n))) if predict else (lambda ex: None)
            return compute(lambda ex: views.grid(ex, lengths, predict=pred(ex)))
        return await answer(request, fn)

    @r.post("/api/order")
    async def order(request: Request):
        return await answer(request, lambda b: compute(views.order, _prompt(b), _int(b, "seed", 0, 0, 2 ** 31),
                                                       0, _int(b, "head", 0, 0, 1024)))

    @r.post("/api/recurrence")
    async def recurrence(request: Request):
        return await answer(request, lambda b: compute(views.recurrence, _prompt(b)))

    @r.post("/api/decode")
    async def decode(request: Request):
        """NDJSON: the prefill event, then one event per generated token, each as soon as it exists. The whole run
        holds the lock (its recording stays in place from the prefill to the last token)."""
        if (denied := refused(request)) is not None:
            return denied
        try:
            body = await _body(request)
            prompt, n = _prompt(body), _int(body, "new_tokens", 16, 1, 64)
        except BadRequest as e:
            return _error(e.status, e.message)
        events: queue.Queue = queue.Queue()

        def run():
            with lock:
                try:
                    for event in views.decode_steps(get(), prompt, n):
                        events.put(event)
                except AttnlabError as e:
                    events.put(BadRequest(400, str(e)))
                except Exception as e:  # noqa: BLE001 - ends the stream with the error instead of hanging it
                    events.put(e)
                events.put(None)
        threading.Thread(target=run, name="attnlab-explain-decode", daemon=True).start()
        first = await asyncio.to_thread(events.get)
        if isinstance(first, BadRequest):
            return _error(first.status, first.message)
        if isinstance(first, Exception):
            raise first

        async def stream():
            event = first
            while event is not None:
                if isinstance(event, Exception):
                    yield json.dumps({"phase": "error", "message": str(event)}) + "\n"
                    return
                yield json.dumps(event) + "\n"
                event = await asyncio.to_thread(events.get)
        return StreamingResponse(stream(), media_type="application/x-ndjson")

    return r


def create_app(ex: views.Explained, calibrate: bool = True) -> FastAPI:
    """``attnlab explain``'s app: the router at the root, with the browser guard of ``attnlab serve`` (a foreign web
    origin is refused) and, unless ``calibrate`` is off, this machine's calibration started in the background for
    the grid view's predictions."""
    app = FastAPI(title="attnlab explain", docs_url=None, redoc_url=None, openapi_url=None)
    ready = threading.Event()

    def predict(cfg, n: int) -> float | None:
        if not ready.is_set():
            return None
        from attnlab.serve.predict import predict as serve_predict

        return serve_predict(cfg, n, 1)["ttft_uncached_s"]

    @app.middleware("http")
    async def guard(request: Request, call_next):
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.headers.get('host', '')}":
            return _error(403, f"requests from the web origin {origin!r} are not allowed")
        return await call_next(request)

    app.include_router(router(lambda: ex, predict if calibrate else None))

    @app.on_event("startup")
    async def start() -> None:
        if calibrate:
            def run():
                from attnlab.serve.predict import hardware

                hardware()
                ready.set()
            threading.Thread(target=run, name="attnlab-calibrate", daemon=True).start()

    return app
