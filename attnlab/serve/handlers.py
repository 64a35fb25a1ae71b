"""The two generating routes, ``POST /v1/completions`` and ``POST /v1/chat/completions``: a body checked strictly
before any compute, a run handed to the engine thread, and its answer streamed (server-sent events) or returned
whole; a client that goes away has its run cancelled at once."""
from __future__ import annotations

import asyncio
import secrets

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from attnlab.serve import completion as C
from attnlab.serve.config import ServeConfig
from attnlab.serve.guard import check_key, read_body, tenant_salt
from attnlab.serve.metrics import Metrics
from attnlab.serve.protocol import ApiError, ChatRequest, CompletionRequest, parse_body


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


def error(metrics: Metrics, err: ApiError, endpoint: str) -> JSONResponse:
    """``err`` in OpenAI's shape, counted in /metrics under its endpoint and status."""
    metrics.requests.labels(endpoint, str(err.status)).inc()
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class Completions:
    """Serves both generating routes for one model: ``await handler(request, "completion" | "chat")``."""

    def __init__(self, served: C.Served, cfg: ServeConfig, metrics: Metrics):
        self.served, self.cfg, self.metrics = served, cfg, metrics
        model_cfg = served.model.cfg
        self.vocab_size = model_cfg.vocab_size
        self.context = None if model_cfg.is_recurrent else model_cfg.max_seq_len

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.served.name:
            raise ApiError(404, f"model {name!r} does not exist; this server serves {self.served.name!r} "
                           "(GET /v1/models)", "model", "model_not_found")

    def limit_tokens(self, prompt_len: int, asked: int | None) -> int:
        """Check the prompt and max_tokens against the context and the cap; -> max_tokens (the engine checks the
        rest, the KV pool's room included, when the run is made)."""
        context, cap = self.context, self.cfg.max_tokens_cap
        if prompt_len == 0:
            raise ApiError(400, "the prompt is empty; give at least one token of text", "prompt", "empty_prompt")
        if context is not None and prompt_len >= context:
            raise ApiError(400, f"the prompt has {prompt_len} tokens; the model's context is {context} tokens, which "
                           "must also hold at least one output token; shorten the prompt", "prompt", "context_length")
        room = cap if context is None else min(cap, context - prompt_len)
        if asked is None:
            return room
        if asked < 1:
            raise ApiError(400, f"max_tokens={asked} must be >= 1", "max_tokens", "invalid_value")
        if asked > cap:
            raise ApiError(400, f"max_tokens={asked} is above this server's cap of {cap}", "max_tokens",
                           "invalid_value")
        if context is not None and prompt_len + asked > context:
            raise ApiError(400, f"the prompt's {prompt_len} tokens + max_tokens {asked} = {prompt_len + asked} exceed "
                           f"the model's context of {context} tokens; ask for at most {context - prompt_len}",
                           "max_tokens", "context_length")
        return min(asked, room)

    def encode_prompt(self, prompt) -> list[int]:
        if isinstance(prompt, list):
            bad = [t for t in prompt if not 0 <= t < self.vocab_size]
            if bad:
                raise ApiError(400, f"prompt token ids {bad[:3]} are outside the vocabulary 0..{self.vocab_size - 1}",
                               "prompt", "invalid_value")
            return list(prompt)
        if self.served.tokenizer is None:
            raise ApiError(400, "this model folder has no tokenizer.json: send the prompt as a list of token ids",
                           "prompt", "no_tokenizer")
        if prompt == "":
            return []
        return self.served.tokenizer.encode(prompt)

    def finished(self, endpoint: str):
        """The callback that records a run's outcome in /metrics once, however it ended (and frees an abandoned
        one)."""
        metrics = self.metrics

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

    @staticmethod
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

    def _make_run(self, request: Request, req, kind: str) -> C.Run:
        """The run a checked body asks for; ApiError on anything the model or this server cannot take."""
        served = self.served
        self.check_model(req.model)
        stops = req.stops
        if kind == "completion":
            ids = self.encode_prompt(req.prompt)
            max_tokens = self.limit_tokens(len(ids), req.max_tokens)
            top = req.top_logprobs
        else:
            if served.tokenizer is None:
                raise ApiError(400, "chat needs a tokenizer; this model folder has no tokenizer.json", "messages",
                               "no_tokenizer")
            text = served.template.render([(m.role, m.text) for m in req.messages])
            ids = served.tokenizer.encode(text, special=False) if text else []
            max_tokens = self.limit_tokens(len(ids), req.limit)
            stops = stops + [s for s in served.template.stop_strings if s not in stops]
            top = (req.top_logprobs or 0) if req.logprobs else None
        return C.Run(request.app.state, ids, max_tokens, req, stops, top, tenant_salt(self.cfg, request, req),
                     self.cfg.request_timeout_s)

    async def __call__(self, request: Request, kind: str):
        endpoint = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
        try:
            check_key(self.cfg, request)
            req = parse_body(await read_body(self.cfg, request),
                             CompletionRequest if kind == "completion" else ChatRequest)
            run = self._make_run(request, req, kind)
        except ApiError as err:
            return error(self.metrics, err, endpoint)
        rid = ("cmpl-" if kind == "completion" else "chatcmpl-") + secrets.token_hex(12)
        record = self.finished(endpoint)
        if req.stream:
            body = (C.stream_completion if kind == "completion" else C.stream_chat)(run, rid, req.include_usage, record)
            return _DisconnectAware(body, lambda: record(run), media_type="text/event-stream",
                                    headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        result = await self.run_to_end(request, run)
        record(run, gone=result is None)
        if result is None:  # the client is gone; nobody reads this
            return Response(status_code=499)
        text, events = result
        if run.failure() is not None:
            err = run.failure()
            return JSONResponse(err.body(), status_code=err.status, headers=err.headers)
        return JSONResponse(self._answer(kind, rid, run, text, events))

    def _answer(self, kind: str, rid: str, run: C.Run, text: str, events) -> dict:
        """A whole (non-streamed) answer in OpenAI's shape."""
        served = self.served
        if kind == "completion":
            choice = {"index": 0, "text": text, "finish_reason": run.finish_reason,
                      "logprobs": C.completion_logprobs(served.tokenizer, events, 0) if run.want_logprobs else None}
            return {"id": rid, "object": "text_completion", "created": run.created, "model": served.name,
                    "choices": [choice], "usage": run.usage()}
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": run.finish_reason,
                  "logprobs": C.chat_logprobs(served.tokenizer, events) if run.want_logprobs else None}
        return {"id": rid, "object": "chat.completion", "created": run.created, "model": served.name,
                "choices": [choice], "usage": run.usage()}
