"""The server's OpenAPI 3.1 document: every endpoint's request and its responses, served at /openapi.json.

The request bodies are read by hand (size limit, UTF-8, strict checks), so FastAPI cannot see them; the schemas
come from the same pydantic models that ``protocol.parse_body`` validates with, plus the ranges that
``check()`` enforces, so a generated client (or a fuzzer such as schemathesis) learns what the server accepts.
"""
from __future__ import annotations

MAX_PREDICT_TOKENS = 10_000_000  # /api/predict: far past any context, short of arithmetic that means nothing

from attnlab.serve.protocol import (MAX_CACHE_SALT, MAX_STOP, MAX_TOP_LOGPROBS, MIN_TOP_P, REPETITION_PENALTY_RANGE,
                                    ChatRequest, CompletionRequest)

REF = "#/components/schemas/{model}"
# What check() enforces beyond the types, per field: the schema says it too.
_COMMON = {"temperature": {"minimum": 0, "maximum": 2}, "top_p": {"minimum": MIN_TOP_P, "maximum": 1},
           "seed": {"minimum": 0, "maximum": 2 ** 63 - 1},
           "top_k": {"minimum": 0},
           "repetition_penalty": {"minimum": REPETITION_PENALTY_RANGE[0], "maximum": REPETITION_PENALTY_RANGE[1]},
           "n": {"enum": [1]}, "presence_penalty": {"enum": [0]}, "frequency_penalty": {"enum": [0]},
           "cache_salt": {"minLength": 1, "maxLength": MAX_CACHE_SALT}, "logit_bias": {"maxProperties": 0}}
_RANGES = {"CompletionRequest": {**_COMMON, "max_tokens": {"minimum": 1}, "logprobs": {"minimum": 0, "maximum": 5},
                                 "echo": {"enum": [False]}, "best_of": {"enum": [1]},
                                 "suffix": {"maxLength": 0}},
           "ChatRequest": {**_COMMON, "max_tokens": {"minimum": 1}, "max_completion_tokens": {"minimum": 1},
                           "top_logprobs": {"minimum": 0, "maximum": MAX_TOP_LOGPROBS}}}

ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}
USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
         "properties": {"prompt_tokens": {"type": "integer", "minimum": 0},
                        "completion_tokens": {"type": "integer", "minimum": 0},
                        "total_tokens": {"type": "integer", "minimum": 0},
                        "prompt_tokens_details": {"type": "object", "properties": {
                            "cached_tokens": {"type": "integer", "minimum": 0}}}}}
FINISH = {"enum": ["stop", "length", None]}
# each server-sent event: a JSON chunk or error in ``data`` (then ``data: [DONE]``)
SSE_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}


def _completion_response(kind: str) -> dict:
    choice = ({"type": "object", "required": ["index", "text", "finish_reason"],
               "properties": {"index": {"type": "integer"}, "text": {"type": "string"}, "finish_reason": FINISH}}
              if kind == "completion" else
              {"type": "object", "required": ["index", "message", "finish_reason"],
               "properties": {"index": {"type": "integer"}, "finish_reason": FINISH, "message": {
                   "type": "object", "required": ["role", "content"],
                   "properties": {"role": {"enum": ["assistant"]}, "content": {"type": "string"}}}}})
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
            "properties": {"id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
                           "model": {"type": "string"}, "choices": {"type": "array", "items": choice},
                           "usage": USAGE}}


def _errors(*codes: int) -> dict:
    return {str(c): {"description": "an error in OpenAI's shape", "content": {"application/json": {"schema": ERROR}}}
            for c in codes}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _typed(prop: dict) -> dict:
    """The non-null branch of an optional property's schema (the property itself when it is not optional)."""
    return next((s for s in prop.get("anyOf", []) if s.get("type") not in (None, "null")), prop)


def _body_schema(model, limits: dict) -> tuple[dict, dict]:
    """(the request body's schema as a reference, the component schemas it needs). ``limits``: the served model's
    vocab_size and context, and the server's max_tokens_cap."""
    schema = model.model_json_schema(ref_template=REF)
    components = schema.pop("$defs", {})
    ranges = {**_RANGES[model.__name__]}
    for name in ("max_tokens", "max_completion_tokens"):
        if name in ranges:
            ranges[name] = {**ranges[name], "maximum": limits["max_tokens_cap"]}
    for name, extra in ranges.items():
        _typed(schema["properties"][name]).update(extra)
    # fields that only count together with another (check() refuses them alone)
    schema["allOf"] = [{"if": {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]},
                        "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]}}]
    if model is CompletionRequest:  # a text, or token ids from the vocabulary: at least one either way
        room = (limits["context"] or 1 << 20) - limits["max_tokens_cap"]
        # a text's limit is in tokens (the context), which no string length states: only token ids get maxItems
        schema["properties"]["prompt"] = {"anyOf": [{"type": "string", "minLength": 1}, {
            "type": "array", "minItems": 1, "maxItems": room,
            "items": {"type": "integer", "minimum": 0, "maximum": limits["vocab_size"] - 1}}]}
    else:
        schema["properties"]["messages"]["minItems"] = 1
        schema["allOf"].append({"if": {"properties": {"max_tokens": {"type": "integer"},
                                                      "max_completion_tokens": {"type": "integer"}},
                                       "required": ["max_tokens", "max_completion_tokens"]}, "then": False})
        schema["allOf"].append({"if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
                                "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}})
    stop = schema["properties"]["stop"]
    for s in stop["anyOf"]:
        if s.get("type") == "array":
            s["maxItems"] = MAX_STOP
    components[model.__name__] = schema
    return {"$ref": REF.format(model=model.__name__)}, components


def openapi_document(title: str, version: str, *, vocab_size: int, context: int | None, max_tokens_cap: int) -> dict:
    """The document for a server of this model (its vocabulary and context) and cap on max_tokens."""
    limits = {"vocab_size": vocab_size, "context": context, "max_tokens_cap": max_tokens_cap}
    paths, components = {}, {"Error": ERROR}
    for path, model, kind in (("/v1/completions", CompletionRequest, "completion"),
                              ("/v1/chat/completions", ChatRequest, "chat")):
        ref, comps = _body_schema(model, limits)
        components.update(comps)
        paths[path] = {"post": {
            "summary": f"OpenAI-compatible {kind}", "operationId": kind,
            "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
            "responses": {"200": {"description": "the completion; with stream=true, server-sent events (chunks, "
                                                 "an error event if it fails, then data: [DONE])",
                                  "content": {"application/json": {"schema": _completion_response(kind)},
                                              "text/event-stream": {"schema": SSE_EVENT}}},
                          **_errors(400, 401, 403, 404, 408, 413, 415, 429, 500, 503)}}}
    paths["/v1/models"] = {"get": {"summary": "the served model", "operationId": "models", "responses": {
        "200": _json({"type": "object", "required": ["object", "data"], "properties": {
            "object": {"enum": ["list"]}, "data": {"type": "array", "items": {"type": "object", "required": ["id"]}}}},
            "the one model this server serves"), **_errors(401, 403)}}}
    health = {"type": "object", "required": ["status"], "properties": {"status": {"enum": ["ok", "draining",
                                                                                          "unhealthy"]}}}
    paths["/health"] = {"get": {"summary": "liveness", "operationId": "health", "responses": {
        "200": _json(health, "serving"), "503": _json(health, "draining, or the engine is failing"),
        **_errors(403)}}}
    paths["/metrics"] = {"get": {"summary": "Prometheus metrics", "operationId": "metrics", "responses": {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
        **_errors(403)}}}
    for path, op, what in (("/api/load", "load", "the engine's live load"), ("/api/info", "info", "the model")):
        paths[path] = {"get": {"summary": what, "operationId": op,
                               "responses": {"200": _json({"type": "object"}, what), **_errors(401, 403)}}}
    query = [{"name": name, "in": "query", "required": name == "prompt_tokens",
              "schema": {"type": "integer", "minimum": 0 if name == "cached_tokens" else 1,
                         "maximum": MAX_PREDICT_TOKENS}}
             for name in ("prompt_tokens", "output_tokens", "cached_tokens")]
    paths["/api/predict"] = {"get": {"summary": "the cost model's prediction of a request's time on this machine",
                                     "description": "cached_tokens may not exceed prompt_tokens (400 otherwise)",
                                     "operationId": "predict", "parameters": query, "responses": {
                                         "200": _json({"type": "object"}, "predicted seconds"),
                                         **_errors(400, 401, 403, 503)}}}
    return {"openapi": "3.1.0", "info": {"title": title, "version": version}, "paths": paths,
            "components": {"schemas": components}}
