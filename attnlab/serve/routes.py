"""The routes beside generation: models, health, metrics, the live page's data (load, info, the cost model's
prediction), the OpenAPI document, the page itself, and errors in OpenAI's shape for unknown routes and bad query
parameters."""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.exceptions import HTTPException

from attnlab.serve import completion as C
from attnlab.serve.config import ServeConfig
from attnlab.serve.guard import check_key
from attnlab.serve.handlers import error
from attnlab.serve.metrics import Metrics
from attnlab.serve.openapi import MAX_PREDICT_TOKENS, openapi_document
from attnlab.serve.protocol import ApiError
from attnlab.serve.worker import Worker

STATIC = Path(__file__).parent / "static"


def add_routes(app: FastAPI, served: C.Served, cfg: ServeConfig, worker: Worker, metrics: Metrics,
               calibration_cancel: threading.Event) -> None:
    model_cfg = served.model.cfg
    context = None if model_cfg.is_recurrent else model_cfg.max_seq_len

    def refused(request: Request, endpoint: str) -> JSONResponse | None:
        """The 401 answer for a request without the API key, else None."""
        try:
            check_key(cfg, request)
        except ApiError as err:
            return error(metrics, err, endpoint)
        return None

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
                "prefill_chunk": cfg.prefill_chunk, "prefill_budget": cfg.prefill_budget,
                "max_tokens_cap": cfg.max_tokens_cap, "chat_template": served.template.origin, "cpu": cpu_name(),
                "auth": cfg.api_key is not None}

    @app.get("/api/predict")
    async def predict_route(request: Request, prompt_tokens: int, output_tokens: int = 1, cached_tokens: int = 0):
        try:
            check_key(cfg, request)
            if not (1 <= prompt_tokens <= MAX_PREDICT_TOKENS and 1 <= output_tokens <= MAX_PREDICT_TOKENS
                    and 0 <= cached_tokens <= prompt_tokens):
                raise ApiError(400, f"prompt_tokens and output_tokens must be in 1..{MAX_PREDICT_TOKENS}, and "
                               "cached_tokens in 0..prompt_tokens", None, "invalid_value")
        except ApiError as err:
            return error(metrics, err, "/api/predict")
        from attnlab.measure.micro import Cancelled
        from attnlab.serve.predict import predict

        dtype = served.dtype if served.dtype in ("fp32", "bf16") else "bf16"
        try:
            return await asyncio.to_thread(predict, model_cfg, prompt_tokens, output_tokens, cached_tokens, dtype,
                                           calibration_cancel)
        except Cancelled:
            return error(metrics, ApiError(503, "the server is shutting down; the machine's calibration was stopped",
                                           None, "shutting_down", "server_error"), "/api/predict")

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


def add_error_handlers(app: FastAPI) -> None:
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
