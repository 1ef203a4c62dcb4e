"""vLLM's CPU build through draftwise.vllm: the re-saved checkpoint decodes (not id 0 everywhere)
and draftwise's prompt lookup inside vLLM (custom_class) gives vLLM's own plain greedy output.

Needs .venv-vllm (`scripts/setup_vllm.sh`, ~3.5 GB): skipped without it; CI does not build it.
Slow (two vLLM engines, eager, about a minute each on 2 cores)."""

from __future__ import annotations

import pytest

from draftwise.vllm.methods import parse_method
from draftwise.vllm.protocol import WorkerRequest
from draftwise.vllm.runner import VllmEnvironment, by_method, run_worker

ENVIRONMENT = VllmEnvironment()
pytestmark = [pytest.mark.model,
              pytest.mark.skipif(ENVIRONMENT.missing() is not None, reason=str(ENVIRONMENT.missing()))]


def test_custom_proposer_inside_vllm_keeps_plain_greedy_output(smol_target, tmp_path):
    from draftwise.vllm.checkpoint import vllm_checkpoint

    text = "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return a + b + c\n\nRepeat the code above."
    prompt = tuple(smol_target.chat_prompt([{"role": "user", "content": text}]))
    methods = (parse_method("vllm-plain"), parse_method("vllm-custom=prompt-lookup:k=4"))
    request = WorkerRequest(model=str(vllm_checkpoint("smollm2-135m")), dtype="float32", prompts=(prompt,),
                            max_tokens=24, batch_sizes=(1,), methods=methods, enforce_eager=True)
    results = by_method(run_worker(request, ENVIRONMENT, log_path=tmp_path / "vllm.log"))
    plain, custom = results[("vllm-plain", 1)], results[("vllm-custom=prompt-lookup:k=4", 1)]
    assert len(set(plain.tokens[0])) > 1, "vLLM emits one token id only: the checkpoint's embedding was not loaded"
    assert custom.tokens == plain.tokens
    assert custom.spec_counters.get("draft_tokens", 0) > 0, "the custom proposer drafted nothing on a copying prompt"
