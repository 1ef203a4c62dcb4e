"""`draftwise serve` as a subprocess on 127.0.0.1 and a free port, for the server's tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

# the embedded model on transformers fp32 (the exactness reference), one thread: on a shared
# two-core machine an oversubscribed intra-op pool makes every round many times slower
MODEL_ARGS = ("--target", "smollm2-135m", "--backend", "transformers", "--dtype", "float32", "--threads", "1")
MODEL = "smollm2-135m"
START_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    process: subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=10).text

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit status (killed, and the test failed, if it does not end in `timeout`)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the server did not exit within {timeout} s of SIGTERM:\n{self.output()[-3000:]}") \
                from None


def start(log: Path, *extra: str, proposer: str = "prompt-lookup") -> Server:
    port = free_port()
    command = [sys.executable, "-m", "draftwise.cli.main", "serve", *MODEL_ARGS, "--proposer", proposer,
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *extra]
    handle = log.open("w")
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = Server(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{server.output()[-3000:]}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.process.kill()
    raise AssertionError(f"the server did not answer /health within {START_TIMEOUT_S} s:\n{server.output()[-3000:]}")


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the Prometheus samples `name` in /metrics text whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, rest = head.partition("{")
        if sample != name:
            continue
        have = dict(part.split("=", 1) for part in rest.rstrip("}").split(",") if part) if rest else {}
        if all(have.get(k) == f'"{v}"' for k, v in labels.items()):
            total += float(value)
    return total
