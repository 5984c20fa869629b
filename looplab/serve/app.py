"""The OpenAI-compatible HTTP API of ``looplab serve``: ``GET /v1/models``, ``POST /v1/completions``
(JSON, or server-sent events with ``stream``; its ``usage`` counts the loops its tokens ran), ``GET /health``,
``GET /metrics`` (Prometheus' text format: :mod:`looplab.serve.metrics`), and vLLM's tokenizer routes
(``GET /tokenizer_info``, ``POST /tokenize``, ``POST /detokenize``), through which a client that does not
hold the model's tokenizer (lm-eval's ``local-completions`` with ``tokenizer_backend=remote``) sends
token ids.

The app owns a :class:`~looplab.serve.engine.Engine` (started and drained by its lifespan): a request is
checked (:mod:`looplab.serve.request`; HTTP 400 with one line naming the field), turned into engine
jobs (:mod:`looplab.serve.choice`), queued (HTTP 503 when the queue is full or the server is shutting
down), and answered as its tokens arrive. A client that disconnects cancels its jobs: their rows leave
the decode batch at the next step. Every response carries the replica that answered in the
``x-looplab-replica`` header.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from uuid import uuid4

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from looplab.generation.cache import POLICIES
from looplab.generation.decoders import DECODERS
from looplab.generation.text_lm import TextLM, open_text_lm
from looplab.serve.batch import Token
from looplab.serve.choice import Choice
from looplab.serve.engine import Busy, Closed, Engine, NeverFits
from looplab.serve.metrics import loops_usage, registry_for
from looplab.serve.request import BadRequest, parse_completion, parse_detokenize, parse_tokenize
from looplab.token_exits import EXITS

__all__ = ["create_app", "model_id", "MAX_BODY_BYTES", "MAX_TOKEN_LOOPS"]

#: the largest request body read (a prompt list of token ids within any model's context fits many times over)
MAX_BODY_BYTES = 4 * 2**20
#: the default bound on one request's work: (prompt + new tokens) × loops, summed over its prompts
MAX_TOKEN_LOOPS = 2**20
#: the routes, for the error a request to any other names
ROUTES = (
    "GET /v1/models, POST /v1/completions, GET /health, GET /metrics, GET /tokenizer_info, POST /tokenize, "
    "POST /detokenize"
)


def model_id(lm: TextLM) -> str:
    """The name clients pass as ``model``: the directory's name."""
    return Path(lm.path).name


def create_app(
    path: str | Path | None = None,
    *,
    lm: TextLM | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    max_running: int = 32,
    max_queue: int = 64,
    batching: str = "continuous",
    on_step: Callable[[Engine], None] | None = None,
    max_token_loops: int = MAX_TOKEN_LOOPS,
    kv_memory: int | None = None,
    prefix_memory: int | None = None,
    tokenizer: str | None = None,
    paged: bool = True,
) -> FastAPI:
    """The app serving the model at ``path`` (opened by its lifespan, so a Ray replica opens its own; a model
    dir's tokenizer from ``tokenizer`` where it holds none), or an already opened ``lm``; the engine's options
    as :class:`~looplab.serve.engine.Engine` takes them; ``max_token_loops`` bounds one request's work,
    (prompt + new tokens) × loops over its prompts."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        text_lm = lm
        if text_lm is None:
            text_lm = await asyncio.to_thread(open_text_lm, path, dtype, device, tokenizer=tokenizer)
        engine = Engine(
            text_lm.model, max_running, max_queue, batching, on_step, kv_memory, prefix_memory, paged
        ).start()
        app.state.lm, app.state.engine, app.state.model_id = text_lm, engine, model_id(text_lm)
        app.state.replica, app.state.created = f"{socket.gethostname()}:{os.getpid()}", int(time.time())
        app.state.max_token_loops = max_token_loops
        app.state.registry = registry_for(engine)
        try:
            yield
        finally:
            await asyncio.to_thread(engine.close)

    app = FastAPI(title="looplab serve", lifespan=lifespan)
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/tokenizer_info", tokenizer_info, methods=["GET"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
    app.add_api_route("/detokenize", detokenize, methods=["POST"])
    app.add_exception_handler(HTTPException, _unknown_route)
    return app


async def _unknown_route(request: Request, exc: HTTPException) -> JSONResponse:
    """OpenAI's error object for a route or method this server does not answer (chat completions among them)."""
    route = f"{request.method} {request.url.path}"
    hint = " (chat completions are not served: send the prompt to POST /v1/completions)" if "chat" in route else ""
    return _error(exc.status_code, None, f"{route} is not served{hint}; the routes: {ROUTES}", "invalid_request_error")


async def models(request: Request) -> JSONResponse:
    state = request.app.state
    lm: TextLM = state.lm
    card = {
        "id": state.model_id, "object": "model", "created": state.created, "owned_by": "looplab",
        "looplab": {
            "kind": lm.kind, "name": lm.name, "default_loops": lm.default_loops, "loop_cap": lm.loop_cap,
            "max_context": lm.max_context, "exits": list(EXITS), "caches": list(POLICIES),
            "decoders": list(DECODERS),
            "halting_head": lm.halts is not None,
        },
    }  # fmt: skip
    return JSONResponse({"object": "list", "data": [card]}, headers=_replica(request))


async def health(request: Request) -> JSONResponse:
    engine: Engine = request.app.state.engine
    body = {"status": "ok", "running": engine.running, "waiting": engine.waiting, "stats": dict(engine.stats)}
    return JSONResponse(body, headers=_replica(request))


async def metrics(request: Request) -> Response:
    """The engine's counts in Prometheus' text format (:mod:`looplab.serve.metrics` lists them)."""
    body = generate_latest(request.app.state.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST, headers=_replica(request))


async def tokenizer_info(request: Request) -> JSONResponse:
    """The tokenizer's special tokens as text (None where it has none, or none with a text of its own); a
    ``POST /tokenize`` of that text, without special tokens, gives the token (how lm-eval finds its id)."""
    lm: TextLM = request.app.state.lm
    info = {"eos_token": lm.eos_text, "bos_token": lm.bos_text, "pad_token": None, "model_max_length": lm.max_context}
    return JSONResponse(info, headers=_replica(request))


async def tokenize(request: Request) -> JSONResponse:
    """``{"prompt": TEXT, "add_special_tokens": false}`` → its token ids, as a completion request's prompt
    text is tokenized with ``add_special_tokens`` true."""
    lm: TextLM = request.app.state.lm
    try:
        text, special = parse_tokenize(await _json_body(request))
    except BadRequest as err:
        return _error(400, err.field, str(err))
    tokens = lm.encode(text, prompt=special)
    body = {"tokens": tokens, "count": len(tokens), "max_model_len": lm.max_context}
    return JSONResponse(body, headers=_replica(request))


async def detokenize(request: Request) -> JSONResponse:
    """``{"tokens": [ids]}`` → their text."""
    lm: TextLM = request.app.state.lm
    try:
        tokens = parse_detokenize(await _json_body(request), lm.vocab_size)
    except BadRequest as err:
        return _error(400, err.field, str(err))
    return JSONResponse({"prompt": lm.decode(tokens)}, headers=_replica(request))


async def _json_body(request: Request):
    """The decoded JSON body (bounded as a completion's is); :class:`BadRequest` for what is not JSON."""
    try:
        raw = await _read_body(request)
    except ClientDisconnect:
        raise BadRequest("body", "the client disconnected before sending it whole") from None
    return await asyncio.to_thread(_decoded_json, raw, "a tokenizer request")


async def completions(request: Request):
    state = request.app.state
    try:
        raw = await _read_body(request)
    except ClientDisconnect:  # the client went away mid-body: nobody to answer
        return _error(400, "body", "body: the client disconnected before sending it whole")
    except BadRequest as err:
        return _error(400, err.field, str(err))
    try:  # parsed and checked off the event loop: a large body holds no other client
        completion = await asyncio.to_thread(_parse, raw, state)
    except BadRequest as err:
        return _error(400, err.field, str(err))
    loop = asyncio.get_running_loop()
    choices = [Choice(index, completion, state.lm, loop) for index in range(len(completion.prompts))]
    try:
        state.engine.submit([job for choice in choices for job in choice.jobs])
    except NeverFits as err:
        return _error(400, "prompt", str(err))
    except (Busy, Closed) as err:
        return _error(503, None, str(err), "server_overloaded")
    meta = {"id": f"cmpl-{uuid4().hex}", "object": "text_completion", "created": int(time.time())}
    meta["model"] = state.model_id
    meta["looplab"] = {"seed": completion.picking.sampling.seed}  # drawn for the request unless it gave one
    if completion.stream:
        return StreamingResponse(
            _stream(request, choices, meta), media_type="text/event-stream", headers=_replica(request)
        )
    watcher = asyncio.create_task(_watch_disconnect(request, choices))
    try:
        for choice in choices:
            while await choice.next_event() is not None:
                pass
    finally:
        watcher.cancel()
        for choice in choices:
            choice.cancel()
    failed = next((choice.error for choice in choices if choice.error), None)
    if failed:
        return _error(500, None, failed, "server_error")
    prompt_tokens = sum(len(p) for p in completion.prompts)
    new_tokens = sum(len(choice.generated) for choice in choices)
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": new_tokens,
        "total_tokens": prompt_tokens + new_tokens,
        "loops": loops_usage([token for choice in choices for token in choice.generated]),
    }
    body = {**meta, "choices": [choice.whole() for choice in choices], "usage": usage}
    return JSONResponse(body, headers=_replica(request))


async def _read_body(request: Request) -> bytes:
    """The request's body, refused past :data:`MAX_BODY_BYTES` before more of it is read."""
    declared = request.headers.get("content-length")
    too_big = BadRequest("body", f"larger than the {MAX_BODY_BYTES // 2**20} MiB a request may send")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_big
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise too_big
        parts.append(part)
    return b"".join(parts)


def _decoded_json(raw: bytes, what: str):
    """The JSON value of a raw body (an empty one is null); :class:`BadRequest` when it is not JSON or is nested
    too deeply to be ``what``."""
    try:
        return json.loads(raw or b"null")
    except ValueError as err:
        raise BadRequest("body", f"not valid JSON ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise BadRequest("body", f"nested too deeply to be {what}") from None


def _parse(raw: bytes, state):
    """The checked completion of a raw body (on a worker thread): JSON, the fields, what the server can hold."""
    body = _decoded_json(raw, "a completion request")
    completion = parse_completion(body, state.lm, state.model_id, state.engine.model)
    engine: Engine = state.engine
    holds = engine.max_running + engine.max_queue
    if len(completion.prompts) > holds:
        raise BadRequest(
            "prompt",
            f"{len(completion.prompts)} prompts in one request, more than this server ever holds at once "
            f"({engine.max_running} running + {engine.max_queue} waiting): send at most {holds} per request",
        )
    work = sum(len(p) + completion.max_tokens for p in completion.prompts) * completion.options.exit_rule.loops
    if work > state.max_token_loops:
        raise BadRequest(
            "loops",
            f"(prompt + max_tokens) × loops = {work:,} token-loops, more than the {state.max_token_loops:,} one "
            "request may cost on this server (looplab serve --max-token-loops): ask for fewer loops or tokens",
        )
    return completion


async def _stream(request: Request, choices: list[Choice], meta: dict) -> AsyncIterator[str]:
    """Server-sent events: per choice its echoed prompt (when asked), a chunk per new token, a last chunk
    with its ``finish_reason``; then ``[DONE]``."""
    watcher = asyncio.create_task(_watch_disconnect(request, choices))

    def chunk(choice: Choice, text: str, logprobs, tokens: list[Token], finish=None) -> str:
        part = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        part["looplab"] = {"loops": [t.depth for t in tokens], "token_ids": [t.token for t in tokens]}
        return f"data: {json.dumps({**meta, 'choices': [part]})}\n\n"

    try:
        for choice in choices:
            echo_due, sent, offset = choice.request.echo, 0, 0
            scoring = any(job.forced is not None for job in choice.jobs)
            while True:
                event = await choice.next_event()
                if choice.error:
                    yield f"data: {json.dumps({'error': {'message': choice.error, 'type': 'server_error'}})}\n\n"
                    return
                if echo_due and (
                    not scoring or event is None or (event[0] == "score" and not isinstance(event[1], Token))
                ):
                    echoed = choice.logprobs([], choice.echoed())
                    yield chunk(choice, choice.prompt_text, echoed, [])
                    echo_due, offset = False, len(choice.prompt_text)
                if not echo_due and len(choice.generated) > sent:
                    new = choice.generated[sent:]
                    sent = len(choice.generated)
                    yield chunk(choice, choice.delta(False), choice.logprobs(new, start=offset), new)
                    offset += sum(len(choice.lm.decode([t.token])) for t in new)
                if event is None:
                    break
            yield chunk(choice, choice.delta(True), None, [], choice.finish)
        yield "data: [DONE]\n\n"
    finally:
        watcher.cancel()
        for choice in choices:
            choice.cancel()


async def _watch_disconnect(request: Request, choices: list[Choice]) -> None:
    """Cancel the choices' jobs when the client goes away (the body is read: the next message is that)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for choice in choices:
                choice.cancel()
            return


def _replica(request: Request) -> dict[str, str]:
    return {"x-looplab-replica": request.app.state.replica}


def _error(status: int, field: str | None, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": field, "code": status}}, status)
