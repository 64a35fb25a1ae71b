"""``attnlab serve``: load a model folder, start the engine thread, run uvicorn; SIGTERM drains.

Draining: on SIGTERM (or Ctrl-C) the server stops listening and answers any new request on an open
connection with 503; running requests go on to their end for up to ``drain_s`` seconds, after which
uvicorn cancels them (each stream's sequence is cancelled and its blocks freed); then the engine thread
stops and the process exits 0.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path

from attnlab.serve.app import create_app
from attnlab.serve.config import ServeConfig
from attnlab.serve.chat import load_template
from attnlab.serve.completion import Served

log = logging.getLogger("attnlab.serve")


def load_served(path: str, dtype: str = "fp32", name: str | None = None, max_batch: int = 1) -> Served:
    """The folder's model, its weights laid out for decode batches of 1 to max_batch rows (capped at 16)."""
    from attnlab.engine.quantize import set_precision
    from attnlab.resolve import load_model

    loaded = load_model(path)
    rows = min(max_batch, 16)
    model = set_precision(loaded.model, dtype, rows=rows, varying=rows > 1)
    return Served(model=model, tokenizer=loaded.tokenizer, stop_tokens=loaded.stop_tokens,
                  template=load_template(path), name=name or Path(path).resolve().name, path=str(path), dtype=dtype)


def serve(path: str, cfg: ServeConfig, dtype: str = "fp32", log_level: str = "warning") -> int:
    import uvicorn

    served = load_served(path, dtype, cfg.model_name, cfg.max_batch)
    app = create_app(served, cfg)
    worker = app.state.worker

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            worker.accepting = False  # new requests on kept-alive connections: 503 while the rest finish
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            """uvicorn's own version re-raises the signal after shutting down, so the process dies of SIGTERM
            (exit -15); a drained server has done what SIGTERM asks and exits 0. Ctrl-C still ends with 130."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)
            if signal.SIGINT in self._captured_signals:
                raise KeyboardInterrupt

    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=cfg.drain_s, lifespan="on")
    server = DrainingServer(config)
    st = worker.engine.stats()
    kv = (f"{st['kv_blocks_total']} KV blocks x {st['kv_block_size']} tokens "
          f"({st['kv_blocks_total'] * st['kv_bytes_per_block'] / 2**20:.0f} MiB)" if st["paged"]
          else "a contiguous state per sequence")
    auth = ", API key required" if cfg.api_key else ""
    print(f"attnlab serve: {served.name} ({served.model.cfg.family}, {dtype}) on http://{cfg.host}:{cfg.port} "
          f"- max batch {cfg.max_batch}, queue {cfg.max_queue}, {kv}, prefill chunk {cfg.prefill_chunk}{auth}",
          file=sys.stderr, flush=True)
    server.run()
    print("attnlab serve: drained and stopped", file=sys.stderr, flush=True)
    return 0
