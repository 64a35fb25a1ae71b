"""The HTTP API: OpenAI-compatible completions and chat, models, health, metrics, and the live page, assembled
from their parts: the guard every request meets first (guard.py), the generating routes (handlers.py), the others
(routes.py), and the start-up and shutdown of the engine thread and the machine's calibration for the page.

Every request body is read by hand (size limit, UTF-8, JSON) and checked strictly before any compute; a bad
one gets 400 (413 when too large) in OpenAI's error shape and touches nothing shared; anything unexpected is a
500 in the same shape, with a request id that the log repeats. The prefix cache is salted per API key and per
request ``cache_salt``, so one tenant cannot probe another's prompts through ``cached_tokens``.
"""
from __future__ import annotations

import asyncio
import threading
import time

from fastapi import FastAPI, Request

from attnlab.engine.engine import Engine
from attnlab.serve import completion as C
from attnlab.serve.config import ServeConfig
from attnlab.serve.guard import install_browser_guard
from attnlab.serve.handlers import Completions
from attnlab.serve.metrics import Metrics
from attnlab.serve.routes import add_error_handlers, add_routes
from attnlab.serve.worker import Worker


def add_explain_tab(app: FastAPI, served: C.Served, cfg: ServeConfig) -> None:
    """``attnlab explain``'s views under /explain, on a copy of the model loaded from the same folder on first use
    (recording a pass swaps a model's kernels: never on the model the engine is serving; the copy costs its memory
    once more), behind the same API key."""
    import threading as _threading

    from attnlab.explain.app import router
    from attnlab.serve import predict as P
    from attnlab.serve.guard import check_key
    from attnlab.serve.protocol import ApiError

    held, lock = {}, _threading.Lock()

    def explained():
        with lock:
            if "ex" not in held:
                from attnlab.explain.views import Explained
                from attnlab.resolve import load_model

                loaded = load_model(served.path)
                held["ex"] = Explained(loaded.model.eval(), loaded.tokenizer, served.name)
            return held["ex"]

    def authorize(request: Request) -> str | None:
        try:
            check_key(cfg, request)
        except ApiError as e:
            return e.message + " (the server's page keeps the key for this tab: enter it there)"
        return None

    def predict(model_cfg, n: int):
        return P.predict(model_cfg, n, 1)["ttft_uncached_s"] if P.ready() else None

    app.include_router(router(explained, predict, authorize, served=True), prefix="/explain")


def create_app(served: C.Served, cfg: ServeConfig, worker: Worker | None = None) -> FastAPI:
    if worker is None:
        engine = Engine(served.model, cfg.engine_config(served.model.cache_dtype), served.tokenizer)
        worker = Worker(engine, max_queue=cfg.max_queue)
    metrics = Metrics(worker)
    app = FastAPI(title="attnlab", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served, app.state.worker, app.state.cfg, app.state.metrics = served, worker, cfg, metrics
    calibration_cancel = threading.Event()  # set at shutdown: stops a machine calibration still running

    install_browser_guard(app, cfg, metrics)
    completions = Completions(served, cfg, metrics)

    @app.post("/v1/completions")
    async def completion_route(request: Request):
        return await completions(request, "completion")

    @app.post("/v1/chat/completions")
    async def chat_route(request: Request):
        return await completions(request, "chat")

    add_routes(app, served, cfg, worker, metrics, calibration_cancel)
    add_explain_tab(app, served, cfg)
    add_error_handlers(app)

    def calibrate() -> None:
        from attnlab.measure.micro import Cancelled
        from attnlab.serve.predict import hardware

        try:
            hardware(calibration_cancel)
        except Cancelled:
            pass  # the server is stopping: the next start measures again

    @app.on_event("startup")
    async def start() -> None:
        if not worker.thread.is_alive():
            worker.start()
        if cfg.calibrate:  # the page's cost model needs this machine's figures: measure them now (cached on disk),
            app.state.calibration = threading.Thread(target=calibrate, name="attnlab-calibrate", daemon=True)
            app.state.calibration.start()  # not inside the first request that asks

    @app.on_event("shutdown")
    async def stop() -> None:
        # A first start on a new machine calibrates for a minute or two: a stop must not wait for that (SIGTERM
        # was then answered only after the calibration's end, past a supervisor's patience), so it is cancelled.
        calibration_cancel.set()
        await asyncio.to_thread(worker.stop)
        calibration = getattr(app.state, "calibration", None)
        if calibration is not None:  # a thread still in a torch op when the interpreter exits aborts it (-6)
            await asyncio.to_thread(calibration.join, 120)

    app.state.started = time.time()
    return app
