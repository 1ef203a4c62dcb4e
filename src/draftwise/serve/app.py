"""The HTTP side: FastAPI routes, admission (429 when full, 503 while draining), and
Server-Sent Events.  Nothing here runs a forward or touches the tokenizer: requests go to the
engine worker's thread, and its updates come back to each request's own asyncio queue through
`call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException

from draftwise.serve.config import ServeConfig
from draftwise.serve.engine_worker import Delta, Done, EngineWorker, Refused, Update
from draftwise.serve.errors import ApiError
from draftwise.serve.metrics import CONTENT_TYPE, ServeMetrics
from draftwise.serve.responses import Shape, sse
from draftwise.serve.schema import CompletionRequest, parse_body

log = logging.getLogger("draftwise.serve")


@dataclass
class ServerState:
    config: ServeConfig
    worker: EngineWorker
    metrics: ServeMetrics
    draining: bool = False
    in_flight: int = 0  # admitted and not yet ended (event-loop thread only)
    loop: asyncio.AbstractEventLoop | None = None

    def begin_drain(self) -> None:
        """Stop admitting (503), let what is in flight finish within the grace period."""
        if not self.draining:
            self.draining = True
            log.info("draining: %d request(s) in flight, %.0f s of grace", self.in_flight, self.config.grace_seconds)
            self.worker.drain(self.config.grace_seconds)

    def on_signal(self) -> None:
        """From uvicorn's signal handler (SIGTERM, SIGINT): drain, on the event loop's own thread."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.begin_drain)


class Ticket:
    """One admitted request: its key with the worker and the queue its updates arrive on."""

    def __init__(self, state: ServerState, request: CompletionRequest) -> None:
        self._state = state
        self.updates: asyncio.Queue[Update] = asyncio.Queue()
        self.ended = False
        self._gone: asyncio.Future[Any] | None = None  # the client's disconnect, while no response is sent
        loop = asyncio.get_running_loop()

        def sink(update: Update) -> None:  # on the worker thread
            try:
                loop.call_soon_threadsafe(self._deliver, update)
            except RuntimeError:  # the loop is closed: nobody waits for this request any more
                pass

        state.in_flight += 1
        self.key = state.worker.submit(request, sink)

    def _deliver(self, update: Update) -> None:
        if isinstance(update, (Done, Refused)) and not self.ended:
            self.ended = True
            self._state.in_flight -= 1  # its slot (or place in the queue) is free again
        self.updates.put_nowait(update)

    def cancel(self, reason: str) -> None:
        if not self.ended:
            self._state.worker.cancel(self.key, reason)

    async def next(self, http: Request) -> Update | None:
        """The next update; None (and the request cancelled) when the client has gone first.
        The body has been read, so the next ASGI message is the client's disconnect."""
        if self._gone is None:
            self._gone = asyncio.ensure_future(http.receive())
        update = asyncio.ensure_future(self.updates.get())
        await asyncio.wait({update, self._gone}, return_when=asyncio.FIRST_COMPLETED)
        if update.done():
            return update.result()
        update.cancel()
        self.cancel("disconnected")
        return None

    def stop_watching(self) -> None:
        """Before a response is sent: Starlette listens for the disconnect itself from then on."""
        if self._gone is not None:
            self._gone.cancel()


def create_app(state: ServerState) -> FastAPI:
    config = state.config

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.loop = asyncio.get_running_loop()
        state.worker.start()
        yield
        state.begin_drain()
        # uvicorn waited for every open response before this; whatever is left is cancelled
        await asyncio.to_thread(state.worker.close, config.grace_seconds + 10)

    app = FastAPI(title="draftwise", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        codes = {404: "not_found", 405: "method_not_allowed"}
        error = ApiError(exc.status_code, str(exc.detail), codes.get(exc.status_code, "http_error"))
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(ApiError(500, f"internal error: {exc!r}", "internal_error").body(), status_code=500)

    @app.get("/health")
    async def health() -> JSONResponse:
        status = "draining" if state.draining else "ok" if state.worker.alive else "engine stopped"
        body = {"status": status, "model": config.model, "active": state.worker.active, "queued": state.worker.queued,
                "in_flight": state.in_flight, "max_batch": config.max_batch, "max_queue": config.max_queue}
        return JSONResponse(body, status_code=200 if status == "ok" else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": config.model, "object": "model", "created": 0, "owned_by": "draftwise"}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(http: Request) -> Response:
        return await _complete(state, http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request) -> Response:
        return await _complete(state, http, chat=True)

    return app


async def _complete(state: ServerState, http: Request, chat: bool) -> Response:
    config = state.config
    try:
        if state.draining:
            raise ApiError(503, "the server is shutting down and admits no new requests", "shutting_down")
        request = parse_body(await _read_body(http, config.max_body_bytes), chat, config)
        if state.in_flight >= config.capacity:
            raise ApiError(429, f"the server is full: {config.max_batch} requests decoding and {config.max_queue} "
                           "waiting (--max-batch, --max-queue); retry later", "queue_full",
                           headers={"Retry-After": str(config.retry_after_seconds)})
    except ApiError as exc:
        state.metrics.refused("chat" if chat else "completions", exc.status, exc.code)
        raise
    ticket = Ticket(state, request)
    try:
        return await _respond(ticket, request, Shape(config.model, chat), http)
    finally:
        ticket.stop_watching()


async def _respond(ticket: Ticket, request: CompletionRequest, shape: Shape, http: Request) -> Response:
    first = await ticket.next(http)  # a stream starts once there is text (or an end): a refusal keeps its status
    if first is None:
        return Response(status_code=499)  # the client has gone; nobody reads this
    if isinstance(first, Refused):
        raise first.error
    if request.stream:
        # the background task runs however the response ends: a client gone before the stream's
        # first write never enters the generator, whose `finally` would cancel the request
        return StreamingResponse(_events(ticket, shape, first, request.include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                 background=BackgroundTask(ticket.cancel, "disconnected"))
    update: Update | None = first
    while isinstance(update, Delta):
        update = await ticket.next(http)
    if update is None:
        return Response(status_code=499)
    if isinstance(update, Refused):
        raise update.error
    if update.error is not None:
        raise ApiError(500, f"the request failed after {update.completion_tokens} tokens: {update.error}", "engine_error")
    return JSONResponse(shape.whole(update))


async def _events(ticket: Ticket, shape: Shape, first: Update, include_usage: bool) -> AsyncIterator[bytes]:
    """The SSE stream: a chunk per text delta, the last one with the finish reason, then [DONE].
    A client that goes away cancels this generator (Starlette listens for the disconnect), and
    with it the request."""
    try:
        update, opened = first, False
        while True:
            if isinstance(update, Refused):  # failed mid-stream: the error as the last event
                yield sse(update.error.body())
                break
            if isinstance(update, Delta) or update.text or (shape.chat and not opened):
                yield sse(shape.chunk(update.text, first=not opened))
                opened = True
            if isinstance(update, Done):
                if update.error is not None:
                    yield sse(ApiError(500, update.error, "engine_error").body())
                yield sse(shape.chunk(None, update.finish_reason, done=update))
                if include_usage:
                    yield sse(shape.usage_chunk(update))
                break
            update = await ticket.updates.get()
        yield sse("[DONE]")
    finally:
        ticket.cancel("disconnected")  # a no-op once it ended


async def _read_body(http: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to be over `limit` bytes."""
    declared = http.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the request body is {declared} bytes; this server takes at most {limit} "
                       "(--max-body-bytes)", "body_too_large")
    size, chunks = 0, []
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"the request body is over {limit} bytes (--max-body-bytes)", "body_too_large")
        chunks.append(chunk)
    return b"".join(chunks)
