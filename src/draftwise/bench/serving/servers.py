"""The servers under test, each a subprocess on 127.0.0.1 at a free port.

    draftwise:ARGS   `draftwise serve --target MODEL --backend B --threads T --host --port ARGS`
    llamacpp:ARGS    `python -m llama_cpp.server --model GGUF --n_threads T --n_threads_batch T
                      --host --port ARGS` (llama-cpp-python's own OpenAI server)

A server is ready when `GET /v1/models` answers 200 with a model listed (both servers have
it; its id is the `model` every request names).  It is always stopped: SIGTERM to its process
group, SIGKILL after a grace period; its stdout and stderr go to a log file whose tail is shown
when it fails to start."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

from draftwise.errors import InputError

HOST = "127.0.0.1"
DRAFTWISE, LLAMACPP = "draftwise", "llamacpp"
STOP_GRACE_S = 20.0  # a draining server finishes in-flight requests first; none are in flight here


class ServerError(RuntimeError):
    """A server that did not start, exited early or never became ready."""


@dataclass(frozen=True)
class ServerSpec:
    name: str
    kind: str  # DRAFTWISE or LLAMACPP
    args: tuple[str, ...]  # appended to the kind's command line


BUILTIN = {
    "draftwise-auto": ServerSpec("draftwise-auto", DRAFTWISE, ("--proposer", "auto")),
    "draftwise-none": ServerSpec("draftwise-none", DRAFTWISE, ("--proposer", "none")),
    # llama_cpp.server by default cuts the streaming request short when another arrives
    # (--interrupt_requests True): under concurrency its streams would end after a token or two
    "llamacpp-server": ServerSpec("llamacpp-server", LLAMACPP, ("--interrupt_requests", "False")),
}
# Request fields per kind, so that every server samples the target's own distribution under the
# OpenAI fields alone: llama_cpp.server otherwise applies its defaults repeat_penalty 1.1, top_k 40
# and min_p 0.05 (the penalty changes even greedy answers); 1.0 and 0 switch them off.
NEUTRAL_FIELDS: dict[str, tuple[tuple[str, float], ...]] = {
    DRAFTWISE: (),
    LLAMACPP: (("repeat_penalty", 1.0), ("top_k", 0), ("min_p", 0.0)),
}
SERVER_FORMS = f"a built-in name ({', '.join(BUILTIN)}) or NAME=KIND[:ARGS] with KIND {DRAFTWISE} or {LLAMACPP}"


def parse_server(text: str) -> ServerSpec:
    """`NAME` (built in) or `NAME=KIND[:ARGS]`, ARGS split like a shell line
    (e.g. `lookup=draftwise:--proposer prompt-lookup --gate auto`)."""
    name, eq, rest = text.partition("=")
    name = name.strip()
    if not eq:
        if name in BUILTIN:
            return BUILTIN[name]
        raise InputError(f"server {text!r}: expected {SERVER_FORMS}")
    kind, _, args = rest.partition(":")
    if not name or kind not in (DRAFTWISE, LLAMACPP):
        raise InputError(f"server {text!r}: expected {SERVER_FORMS}")
    try:
        return ServerSpec(name, kind, tuple(shlex.split(args)))
    except ValueError as exc:
        raise InputError(f"server {text!r}: its arguments do not split ({exc})") from None


@dataclass(frozen=True)
class LaunchConfig:
    model: str  # a model name draftwise resolves (draftwise servers)
    gguf_path: str  # the same model's GGUF file (llama_cpp.server needs the file)
    backend: str  # draftwise servers' --backend
    threads: int
    startup_timeout_s: float
    log_dir: Path


@dataclass(frozen=True)
class RunningServer:
    name: str
    base_url: str
    model_id: str
    pid: int


def command(spec: ServerSpec, config: LaunchConfig, port: int) -> list[str]:
    where = ["--host", HOST, "--port", str(port)]
    threads = str(config.threads)
    if spec.kind == LLAMACPP:
        return [sys.executable, "-m", "llama_cpp.server", "--model", config.gguf_path, "--n_threads", threads,
                "--n_threads_batch", threads, *where, *spec.args]
    # the CLI through this interpreter (no reliance on a `draftwise` script on PATH)
    return [sys.executable, "-c", "from draftwise.cli import app; app()", "serve", "--target", config.model,
            "--backend", config.backend, "--threads", threads, *where, *spec.args]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


@contextmanager
def running(spec: ServerSpec, config: LaunchConfig) -> Iterator[RunningServer]:
    port = free_port()
    config.log_dir.mkdir(parents=True, exist_ok=True)
    log_path = config.log_dir / f"{spec.name}.log"
    with open(log_path, "ab") as log:
        log.write(f"\n$ {shlex.join(command(spec, config, port))}\n".encode())
        log.flush()
        process = subprocess.Popen(command(spec, config, port), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        base_url = f"http://{HOST}:{port}"
        model_id = wait_ready(process, base_url, config.startup_timeout_s, log_path)
        yield RunningServer(spec.name, base_url, model_id, process.pid)
    finally:
        stop(process)


def wait_ready(process: subprocess.Popen[bytes], base_url: str, timeout_s: float, log_path: Path) -> str:
    """The id of the model the server lists, once it answers; ServerError if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerError(f"server exited with status {process.returncode} before it was ready:\n{_tail(log_path)}")
        try:
            response = httpx.get(base_url + "/v1/models", timeout=2.0)
            if response.status_code == 200 and response.json().get("data"):
                return str(response.json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError):
            pass  # not listening yet
        time.sleep(0.25)
    raise ServerError(f"server not ready after {timeout_s:.0f} s:\n{_tail(log_path)}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's own process group (it was started in a new session), SIGKILL
    after STOP_GRACE_S; returns once it has exited."""
    if process.poll() is not None:
        return
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass  # exited in between


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
