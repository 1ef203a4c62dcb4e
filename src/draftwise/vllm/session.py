"""One vLLM engine kept loaded in .venv-vllm, asked for generations one call at a time: what a
per-turn caller (a bench executor) needs, since loading an engine takes a minute or more.

    with VllmSession(SessionRequest(model=dir, dtype="bfloat16", method=parse_method("vllm-ngram"))) as vllm:
        reply = vllm.generate([prompt_ids], max_tokens=64)

The worker answers on stdout, each reply one line starting with `protocol.SESSION_MARK` (vLLM's own log
lines, also on stdout, are passed over); its stderr goes to `log_path`.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Mapping, Sequence

from draftwise.errors import BackendError
from draftwise.vllm.protocol import SESSION_MARK, SessionRequest
from draftwise.vllm.runner import VllmEnvironment


@dataclass(frozen=True)
class SessionReply:
    tokens: tuple[tuple[int, ...], ...]  # new token ids per prompt
    wall_s: float  # the engine's generate call, measured inside the worker
    spec_counters: Mapping[str, float] = field(default_factory=dict)


class VllmSession:
    def __init__(self, request: SessionRequest, environment: VllmEnvironment = VllmEnvironment(),
                 log_path: Path | None = None) -> None:
        self.request = request
        self.environment = environment
        self.log_path = log_path
        self._process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def __enter__(self) -> "VllmSession":
        reason = self.environment.missing()
        if reason:
            raise BackendError(reason)
        request_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"draftwise-vllm-session-{os.getpid()}-{id(self)}.json"
        request_path.write_text(json.dumps(self.request.to_json()))
        self._log = open(self.log_path or os.devnull, "w")
        command = [str(self.environment.python), "-m", "draftwise.vllm.worker", str(request_path), "-"]
        self._process = subprocess.Popen(command, env=self.environment.variables(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        try:
            self._reply()  # {"ready": true} once the engine is loaded
        finally:
            request_path.unlink(missing_ok=True)
        return self

    def _reply(self) -> dict[str, Any]:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(SESSION_MARK):
                return dict(json.loads(line[len(SESSION_MARK):]))
        code = self._process.wait()
        where = f"; its log: {self.log_path}" if self.log_path else ""
        raise BackendError(f"the vLLM session worker ended (status {code}){where}")

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> SessionReply:
        """`prompts` as one concurrent batch, greedy."""
        if self._process is None or self._process.stdin is None:
            raise BackendError("the vLLM session is not open (use it as a context manager)")
        self._process.stdin.write(json.dumps({"prompts": [list(p) for p in prompts], "max_tokens": max_tokens}) + "\n")
        self._process.stdin.flush()
        body = self._reply()
        return SessionReply(tuple(tuple(int(t) for t in p) for p in body["tokens"]), float(body["wall_s"]),
                            dict(body["spec_counters"]))

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()  # the worker's loop ends; vLLM shuts its engine down
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
