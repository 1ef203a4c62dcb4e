"""Running the server: the engine worker and the app on a decoder, under uvicorn, with SIGTERM
as a drain.

Uvicorn's own shutdown (stop listening, wait for open responses, then the lifespan's end) is
kept; its signal handler is extended (a subclass, not a patch) so that the app stops admitting
and the worker starts the grace period at the signal itself, not after the responses it would
wait for.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any, Callable

import uvicorn

from draftwise.build import Decoder
from draftwise.serve.app import ServerState, create_app
from draftwise.serve.config import ServeConfig
from draftwise.serve.engine_worker import EngineWorker
from draftwise.serve.metrics import ServeMetrics

# after the grace, uvicorn itself stops waiting for responses (a last resort: the worker has
# cancelled every request by then, and each response ends with its finish reason)
UVICORN_MARGIN_S = 15


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def build_state(decoder: Decoder, config: ServeConfig) -> ServerState:
    """The worker (a batch engine of `config.max_batch` slots on the decoder's target) and its
    metrics.  Call it on the main thread: it runs one forward there first (`warm_up`)."""
    warm_up(decoder)
    metrics = ServeMetrics(config.max_batch)
    info = decoder.target.info
    identity: dict[str, Any] = {"proposer": decoder.spec.proposer, "backend": info.name, "dtype": info.dtype}
    if decoder.choices:
        identity["auto_choices"] = {c.what: c.chosen for c in decoder.choices}
    worker = EngineWorker(decoder.batch(config.max_batch), decoder.target, config, metrics, identity)
    metrics.watch(lambda: worker.active, lambda: worker.queued)
    return ServerState(config, worker, metrics)


def warm_up(decoder: Decoder) -> None:
    """One short generation on the calling (main) thread before the worker thread runs any.
    With transformers on torch's OpenMP pool, while the main thread has never run a parallel
    region, every forward of the worker thread runs many times slower than it should; one
    forward on the main thread first, and the worker's forwards run at full speed.  It costs one forward at startup."""
    decoder.sized(1).generate(decoder.target.tokenize("Hello"))


def run(state: ServerState, host: str, port: int, log_level: str = "info") -> None:
    """Serve until SIGTERM or SIGINT; returns once drained (the process then exits 0)."""
    config = state.config
    server = _DrainingServer(uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level,
                                            timeout_graceful_shutdown=int(config.grace_seconds) + UVICORN_MARGIN_S),
                             state.on_signal)
    # uvicorn re-raises the signal it stopped on once it has put back the handler it found; the
    # server has drained by then, so that handler only lets the process end normally (status 0)
    previous = signal.signal(signal.SIGTERM, _drained)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not server.started:
        raise OSError(f"the server could not start on {host}:{port} (is the port taken?)")


def _drained(sig: int, frame: FrameType | None) -> None:
    """SIGTERM once the server has shut down: nothing is left to do."""
