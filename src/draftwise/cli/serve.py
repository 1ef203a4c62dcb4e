"""`draftwise serve`: the OpenAI-compatible server on the multi-request engine (`draftwise.serve`)."""

from __future__ import annotations

import typer

from draftwise.api import open_decoder
from draftwise.cli.common import DecoderOptions, decoder_command, dim, err, fail, quiet_llama_cpp
from draftwise.runtime.round import GenerationConfig
from draftwise.errors import DraftwiseError, InputError
from draftwise.logs import progress_to
from draftwise.serve.config import ServeConfig

LIMITS = ServeConfig(model="-")  # the options' defaults, read from the config's own


@decoder_command
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    model_name: str = typer.Option("", help="The model id clients send (default: --target as given)."),
    max_batch: int = typer.Option(LIMITS.max_batch, help="Requests decoded in one round (the rest wait); gate=auto is planned for it."),
    max_queue: int = typer.Option(LIMITS.max_queue, help="Requests waiting for a slot; beyond them, 429 with Retry-After."),
    request_timeout: float = typer.Option(LIMITS.request_timeout, help="Seconds from arrival; then the request ends with "
                                          "finish_reason \"timeout\"."),
    max_tokens_limit: int = typer.Option(LIMITS.max_tokens_limit, help="The largest max_tokens a request may ask for."),
    max_body_bytes: int = typer.Option(LIMITS.max_body_bytes, help="Larger request bodies are refused (413)."),
    grace_seconds: float = typer.Option(LIMITS.grace_seconds, help="On SIGTERM: seconds in-flight requests may take to finish "
                                        "before they are cancelled (finish_reason \"shutdown\")."),
    log_level: str = typer.Option("info", help="uvicorn's log level: critical | error | warning | info | debug."),
    *,
    options: DecoderOptions,  # --target, --proposer, ...: added by `decoder_command`
) -> None:
    """Serve the decoder over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions)."""
    try:
        config = ServeConfig(model=model_name or options.target, max_batch=max_batch, max_queue=max_queue,
                             request_timeout=request_timeout, max_tokens_limit=max_tokens_limit,
                             max_body_bytes=max_body_bytes, grace_seconds=grace_seconds)
        if not 1 <= port <= 65535:
            raise InputError(f"--port {port}: choose 1..65535")
        # the spec's own generation settings are every request's defaults; each request brings its own
        spec = options.spec(GenerationConfig(), max_batch)
        quiet_llama_cpp()
        with progress_to(dim):
            decoder = open_decoder(spec, calibration=options.calibration_workload)
        if not decoder.engine.verifier.capabilities.exact:
            err.print("[bold yellow]warning:[/] a heuristic verifier makes these answers: NOT distributed as the "
                      "target model alone")
        from draftwise.serve.server import build_state, run

        state = build_state(decoder, config)  # the batch engine: a proposer it cannot batch is refused here
    except DraftwiseError as exc:
        fail(str(exc))
        return
    except ImportError as exc:
        fail(f"draftwise serve needs the serve extra ({exc.name} is missing): pip install 'draftwise[serve]'")
        return
    dim(f"serving {config.model} ({decoder.spec.describe()}) on http://{host}:{port}")
    run(state, host, port, log_level)
