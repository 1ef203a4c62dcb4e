"""vLLM's CPU build through draftwise.vllm: the re-saved checkpoint decodes (not id 0 everywhere),
and draftwise's prompt lookup inside vLLM (custom_class), in a kept-loaded session, gives vLLM's
own plain greedy output.

Needs .venv-vllm (`scripts/setup_vllm.sh`, ~3.5 GB): skipped without it; CI does not build it.
Slow: two vLLM engines (float32, eager), about a minute each on 2 cores."""

from __future__ import annotations

import pytest

from draftwise.vllm.methods import parse_method
from draftwise.vllm.protocol import SessionRequest, WorkerRequest
from draftwise.vllm.runner import VllmEnvironment, run_worker

ENVIRONMENT = VllmEnvironment()
pytestmark = [pytest.mark.model,
              pytest.mark.skipif(ENVIRONMENT.missing() is not None, reason=str(ENVIRONMENT.missing()))]
TEXT = "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return a + b + c\n\nRepeat the code above."
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def checkpoint() -> str:
    from draftwise.vllm.checkpoint import vllm_checkpoint

    return str(vllm_checkpoint("smollm2-135m"))


@pytest.fixture(scope="module")
def prompt(smol_target) -> tuple[int, ...]:
    return tuple(smol_target.chat_prompt([{"role": "user", "content": TEXT}]))


@pytest.fixture(scope="module")
def plain(checkpoint, prompt, tmp_path_factory) -> tuple[int, ...]:
    request = WorkerRequest(model=checkpoint, dtype="float32", prompts=(prompt,), max_tokens=MAX_TOKENS,
                            batch_sizes=(1,), methods=(parse_method("vllm-plain"),), enforce_eager=True)
    log = tmp_path_factory.mktemp("vllm") / "plain.log"
    outcome = run_worker(request, ENVIRONMENT, log_path=log)
    assert not outcome.errors, outcome.errors
    tokens = outcome.by_method()[("vllm-plain", 1)].tokens[0]
    assert len(set(tokens)) > 1, "vLLM emits one token id only: the checkpoint's embedding was not loaded"
    return tokens


def test_custom_proposer_in_a_session_keeps_plain_greedy_output(checkpoint, prompt, plain, tmp_path):
    from draftwise.vllm.session import VllmSession

    request = SessionRequest(model=checkpoint, dtype="float32", method=parse_method("vllm-custom=prompt-lookup:k=4"),
                             enforce_eager=True)
    with VllmSession(request, ENVIRONMENT, log_path=tmp_path / "custom.log") as vllm:
        first = vllm.generate([prompt], MAX_TOKENS)
        second = vllm.generate([prompt, prompt], MAX_TOKENS)  # the same engine, a batch of two
    assert first.tokens == (plain,) and second.tokens == (plain, plain)
    assert first.spec_counters.get("draft_tokens", 0) > 0, "the custom proposer drafted nothing on a copying prompt"
