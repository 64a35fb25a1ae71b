"""The HTTP API: OpenAI-compatible completions and chat, models, health, metrics, and the live page.

Every request body is read by hand (size limit, UTF-8, JSON) and checked strictly before any compute; a bad
one gets 400 (413 when too large) in OpenAI's error shape and touches nothing shared; anything unexpected is a
500 in the same shape, with a request id that the log repeats. With an API key every /v1 and /api route needs
``Authorization: Bearer KEY``, compared in constant time.

Browser-safe defaults (as Ollama's origin allowlist and Jupyter's checks): any web page can make a browser
send a ``text/plain`` POST to 127.0.0.1 without a CORS preflight, so a POST body must be ``application/json``
(415 otherwise) and a request whose ``Origin`` is neither this server's own nor on ``--allow-origin`` is
refused (403). The prefix cache is salted per API key and per request ``cache_salt``, so one tenant cannot
probe another's prompts through ``cached_tokens``.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import threading
import time
from pathlib import Path

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from attnlab.engine.engine import Engine
from attnlab.serve import completion as C
from attnlab.serve.config import ServeConfig
from attnlab.serve.metrics import Metrics
from attnlab.serve.openapi import MAX_PREDICT_TOKENS, openapi_document
from attnlab.serve.protocol import ApiError, ChatRequest, CompletionRequest, parse_body
from attnlab.serve.worker import Worker

STATIC = Path(__file__).parent / "static"
POST_ROUTES = ("/v1/completions", "/v1/chat/completions")  # the bodies a browser could be made to send
log = logging.getLogger("attnlab.serve")


class _DisconnectAware(StreamingResponse):
    """Stops streaming as soon as the client goes away, even while no token is being sent (a queued request):
    the newer ASGI path only notices a disconnect on the next send. ``on_close`` runs however the response
    ends, also when the body was never started (the client left before the first byte)."""

    def __init__(self, body, on_close, **kwargs):
        super().__init__(body, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            self.on_close()


def create_app(served: C.Served, cfg: ServeConfig, worker: Worker | None = None) -> FastAPI:
    if worker is None:
        engine = Engine(served.model, cfg.engine_config(getattr(served.model, "cache_dtype", None)), served.tokenizer)
        worker = Worker(engine, max_queue=cfg.max_queue)
    metrics = Metrics(worker)
    app = FastAPI(title="attnlab", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served, app.state.worker, app.state.cfg, app.state.metrics = served, worker, cfg, metrics
    model_cfg = served.model.cfg
    context = None if model_cfg.is_recurrent else model_cfg.max_seq_len

    calibration_cancel = threading.Event()  # set at shutdown: stops a machine calibration still running

    own_origins = lambda request: {f"{request.url.scheme}://{request.headers.get('host', '')}"}

    @app.middleware("http")
    async def browser_guard(request: Request, call_next):
        """Refuse what a foreign web page could make a visitor's browser send (403, 415)."""
        origin = request.headers.get("origin")
        if origin is not None and origin not in own_origins(request) and origin not in cfg.allow_origins:
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

    def tenant_salt(request: Request, req) -> str:
        """What keys this request's prefix cache: its API key's identity (a digest, never the key) and its salt."""
        key = request.headers.get("authorization", "") if cfg.api_key is not None else ""
        who = hashlib.blake2b(key.encode(), digest_size=8).hexdigest() if key else ""
        return f"{who}|{req.cache_salt or ''}" if (who or req.cache_salt) else ""

    @app.on_event("startup")
    async def _start() -> None:
        if not worker.thread.is_alive():
            worker.start()
        if cfg.calibrate:  # the page's cost model needs this machine's figures: measure them now (cached on disk),
            app.state.calibration = threading.Thread(target=_calibrate, name="attnlab-calibrate", daemon=True)
            app.state.calibration.start()  # not inside the first request that asks

    def _calibrate() -> None:
        from attnlab.cost.calibrate import Cancelled
        from attnlab.serve.predict import hardware

        try:
            hardware(calibration_cancel)
        except Cancelled:
            pass  # the server is stopping: the next start measures again

    @app.on_event("shutdown")
    async def _stop() -> None:
        # A first start on a new machine calibrates for a minute or two: a stop must not wait for that (SIGTERM
        # was then answered only after the calibration's end, past a supervisor's patience), so it is cancelled.
        calibration_cancel.set()
        await asyncio.to_thread(worker.stop)
        calibration = getattr(app.state, "calibration", None)
        if calibration is not None:  # a thread still in a torch op when the interpreter exits aborts it (-6)
            await asyncio.to_thread(calibration.join, 120)

    def error(err: ApiError, endpoint: str) -> JSONResponse:
        metrics.requests.labels(endpoint, str(err.status)).inc()
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    def auth(request: Request) -> None:
        if cfg.api_key is None:
            return
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not hmac.compare_digest(token.encode(), cfg.api_key.encode()):
            raise ApiError(401, "missing or wrong API key; send 'Authorization: Bearer KEY'", None,
                           "invalid_api_key", "authentication_error")

    def refused(request: Request, endpoint: str) -> JSONResponse | None:
        """The 401 answer for a request without the API key, else None."""
        try:
            auth(request)
        except ApiError as err:
            return error(err, endpoint)
        return None

    async def read_body(request: Request) -> bytes:
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

    def check_model(name: str | None) -> None:
        if name is not None and name != served.name:
            raise ApiError(404, f"model {name!r} does not exist; this server serves {served.name!r} "
                           "(GET /v1/models)", "model", "model_not_found")

    def limit_tokens(prompt_len: int, asked: int | None, default: int | None) -> int:
        """Check the prompt and max_tokens against the context and the cap; -> max_tokens (the engine checks the
        rest, the KV pool's room included, when the run is made)."""
        if prompt_len == 0:
            raise ApiError(400, "the prompt is empty; give at least one token of text", "prompt", "empty_prompt")
        if context is not None and prompt_len >= context:
            raise ApiError(400, f"the prompt has {prompt_len} tokens; the model's context is {context} tokens, which "
                           "must also hold at least one output token; shorten the prompt", "prompt", "context_length")
        room = cfg.max_tokens_cap if context is None else min(cfg.max_tokens_cap, context - prompt_len)
        n = asked if asked is not None else (default if default is not None else room)
        if asked is not None:
            if n < 1:
                raise ApiError(400, f"max_tokens={n} must be >= 1", "max_tokens", "invalid_value")
            if n > cfg.max_tokens_cap:
                raise ApiError(400, f"max_tokens={n} is above this server's cap of {cfg.max_tokens_cap}",
                               "max_tokens", "invalid_value")
            if context is not None and prompt_len + n > context:
                raise ApiError(400, f"the prompt's {prompt_len} tokens + max_tokens {n} = {prompt_len + n} exceed "
                               f"the model's context of {context} tokens; ask for at most {context - prompt_len}",
                               "max_tokens", "context_length")
        return min(n, room)

    def encode_prompt(prompt) -> list[int]:
        if isinstance(prompt, list):
            vocab = model_cfg.vocab_size
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise ApiError(400, f"prompt token ids {bad[:3]} are outside the vocabulary 0..{vocab - 1}", "prompt",
                               "invalid_value")
            return list(prompt)
        if served.tokenizer is None:
            raise ApiError(400, "this model folder has no tokenizer.json: send the prompt as a list of token ids",
                           "prompt", "no_tokenizer")
        if prompt == "":
            return []
        return served.tokenizer.encode(prompt)

    def finished(endpoint: str):
        def record(run: C.Run, gone: bool = False) -> None:
            run.cancel()  # a no-op for a finished run; frees an abandoned one
            if run.recorded:
                return
            run.recorded = True
            failure = run.failure()
            status = "200" if failure is None else ("499" if gone or run.client_gone else str(failure.status))
            metrics.requests.labels(endpoint, status).inc()
            metrics.prompt_tokens.inc(run.prompt_tokens)
            metrics.generation_tokens.inc(run.completion_tokens)
            if run.first_s is not None:
                metrics.ttft.observe(run.first_s)
            if run.completion_tokens > 1 and run.last_s is not None:
                metrics.tpot.observe((run.last_s - run.first_s) / (run.completion_tokens - 1))
            if failure is not None:
                metrics.cancelled.inc()
        return record

    async def run_to_end(request: Request, run: C.Run):
        """Non-streaming: wait for the completion, or cancel it the moment the client disconnects."""
        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(disconnected())
        work = asyncio.ensure_future(C.collect(run))
        try:
            done, _ = await asyncio.wait({watcher, work}, return_when=asyncio.FIRST_COMPLETED)
            if work in done:
                return work.result()
            return None
        finally:
            watcher.cancel()
            work.cancel()
            run.cancel()

    async def handle(request: Request, kind: str):
        endpoint = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
        try:
            auth(request)
            req = parse_body(await read_body(request), CompletionRequest if kind == "completion" else ChatRequest)
            check_model(req.model)
            stops = req.stops
            if kind == "completion":
                ids = encode_prompt(req.prompt)
                max_tokens = limit_tokens(len(ids), req.max_tokens, None)
                top = req.top_logprobs
            else:
                if served.tokenizer is None:
                    raise ApiError(400, "chat needs a tokenizer; this model folder has no tokenizer.json", "messages",
                                   "no_tokenizer")
                text = served.template.render([(m.role, m.text) for m in req.messages])
                ids = served.tokenizer.encode(text, special=False) if text else []
                max_tokens = limit_tokens(len(ids), req.limit, None)
                stops = stops + [s for s in served.template.stop_strings if s not in stops]
                top = (req.top_logprobs or 0) if req.logprobs else None
            run = C.Run(request.app.state, ids, max_tokens, req, stops, top, tenant_salt(request, req),
                        cfg.request_timeout_s)
        except ApiError as err:
            return error(err, endpoint)
        rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + secrets.token_hex(12)
        if req.stream:
            body = (C.stream_completion if kind == "completion" else C.stream_chat)(run, rid, req.include_usage,
                                                                                    finished(endpoint))
            return _DisconnectAware(body, lambda: finished(endpoint)(run), media_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        result = await run_to_end(request, run)
        finished(endpoint)(run, gone=result is None)
        if result is None:  # the client is gone; nobody reads this
            return Response(status_code=499)
        text, events = result
        if run.failure() is not None:
            err = run.failure()
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
        if kind == "completion":
            choice = {"index": 0, "text": text, "finish_reason": run.finish_reason,
                      "logprobs": C.completion_logprobs(served.tokenizer, events, 0) if run.want_logprobs else None}
            body = {"id": rid, "object": "text_completion", "created": run.created, "model": served.name,
                    "choices": [choice], "usage": run.usage()}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": run.finish_reason,
                      "logprobs": C.chat_logprobs(served.tokenizer, events) if run.want_logprobs else None}
            body = {"id": rid, "object": "chat.completion", "created": run.created, "model": served.name,
                    "choices": [choice], "usage": run.usage()}
        return JSONResponse(body)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, "chat")

    @app.get("/v1/models")
    async def models(request: Request):
        if (denied := refused(request, "/v1/models")) is not None:
            return denied
        metrics.requests.labels("/v1/models", "200").inc()
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "attnlab", "max_model_len": context}]}

    @app.get("/health")
    async def health():
        if not worker.healthy:
            return JSONResponse({"status": "unhealthy", "reason": "the engine thread is dead" if not
                                 worker.thread.is_alive() else "the engine's recent steps all failed"}, status_code=503)
        status = 200 if worker.accepting else 503
        return JSONResponse({"status": "ok" if status == 200 else "draining"}, status_code=status)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/api/load")
    async def load(request: Request):
        if (denied := refused(request, "/api/load")) is not None:
            return denied
        return worker.snapshot()

    @app.get("/api/info")
    async def info(request: Request):
        if (denied := refused(request, "/api/info")) is not None:
            return denied
        from attnlab.runtime import cpu_name

        st = worker.engine.stats()
        block = st.get("kv_block_size")
        per_token = st["kv_bytes_per_block"] // block if block else served.model.new_state(1, 1).bytes_per_token
        return {"model": served.name, "path": served.path, "family": model_cfg.family, "context": context,
                "vocab_size": model_cfg.vocab_size,
                "dtype": served.dtype, "params": sum(p.numel() for p in served.model.parameters()),
                "kv_bytes_per_token": per_token, "kv_block_size": block, "max_batch": cfg.max_batch,
                "prefill_chunk": cfg.prefill_chunk, "prefill_budget": cfg.prefill_budget, "max_tokens_cap": cfg.max_tokens_cap,
                "chat_template": served.template.origin, "cpu": cpu_name(), "auth": cfg.api_key is not None}

    @app.get("/api/predict")
    async def predict_route(request: Request, prompt_tokens: int, output_tokens: int = 1, cached_tokens: int = 0):
        try:
            auth(request)
            if not (1 <= prompt_tokens <= MAX_PREDICT_TOKENS and 1 <= output_tokens <= MAX_PREDICT_TOKENS
                    and 0 <= cached_tokens <= prompt_tokens):
                raise ApiError(400, f"prompt_tokens and output_tokens must be in 1..{MAX_PREDICT_TOKENS}, and "
                               "cached_tokens in 0..prompt_tokens", None, "invalid_value")
        except ApiError as err:
            return error(err, "/api/predict")
        from attnlab.cost.calibrate import Cancelled
        from attnlab.serve.predict import predict

        dtype = served.dtype if served.dtype in ("fp32", "bf16") else "bf16"
        try:
            return await asyncio.to_thread(predict, model_cfg, prompt_tokens, output_tokens, cached_tokens, dtype,
                                           calibration_cancel)
        except Cancelled:
            return error(ApiError(503, "the server is shutting down; the machine's calibration was stopped", None,
                                  "shutting_down", "server_error"), "/api/predict")

    document = openapi_document("attnlab", "0.1.0", vocab_size=model_cfg.vocab_size, context=context,
                                max_tokens_cap=cfg.max_tokens_cap)

    @app.get("/openapi.json")
    async def openapi():
        return document

    @app.get("/")
    async def page():
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/static/{name}")
    async def static(name: str):
        path = (STATIC / name).resolve()
        if path.parent != STATIC.resolve() or not path.is_file():
            return JSONResponse(ApiError(404, f"no static file {name!r}", None, "not_found").body(), status_code=404)
        return FileResponse(path, headers={"Cache-Control": "no-cache"})

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):  # unknown routes and methods, in OpenAI's shape
        err = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", None,
                       "not_found" if exc.status_code == 404 else "method_not_allowed")
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))  # 405: Allow

    @app.exception_handler(RequestValidationError)
    async def query_error(request: Request, exc: RequestValidationError):  # bad query parameters
        first = exc.errors()[0]
        param = ".".join(str(x) for x in first["loc"][1:]) or None
        err = ApiError(400, f"{param}: {first['msg'].lower()}", param, "invalid_value")
        return JSONResponse(err.body(), status_code=400)

    app.state.started = time.time()
    return app
