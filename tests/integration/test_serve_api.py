"""`draftwise serve` as a subprocess, through the official openai client (sync and async,
streamed and not) and raw HTTP: answers equal `Decoder.generate` alone at temperature 0 (under
concurrent load too), seeded sampling is reproducible, stop strings are left out, every bad
request gets its own OpenAI-style error and leaves the server healthy, and a client that goes
away mid-stream frees its slot."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.integration.serve_process import MODEL, MODEL_ARGS, metric, start, wait_for

pytestmark = pytest.mark.model

MAX_NEW = 12
MAX_TOKENS_LIMIT = 512
MAX_BODY = 64 * 1024
COMPLETION_PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n\ndef mean(xs):",
                      "for i in range(10):\n    print(i)\nfor i in range(10):", "SELECT name FROM users WHERE"]
CHAT_PROMPTS = ["Say hello.", "What is 2 + 2?", "Write a haiku about rain.", "Give me one word for happy.",
                "What is Python?"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start(tmp_path_factory.mktemp("serve") / "server.log", "--max-batch", "8", "--max-queue", "256",
              "--max-tokens-limit", str(MAX_TOKENS_LIMIT), "--max-body-bytes", str(MAX_BODY))
    yield s
    assert s.terminate() == 0, s.output()[-3000:]


@pytest.fixture(scope="module")
def reference():
    """(prompt, chat) -> (greedy tokens of MAX_NEW, detokenize, eos): `Decoder.generate` alone, plain decoding."""
    from draftwise.api import open_decoder
    from draftwise.runtime.round import GenerationConfig
    from draftwise.spec import DecoderSpec

    spec = DecoderSpec(target=MODEL, backend="transformers", dtype="float32", threads=1,
                       generation=GenerationConfig(max_new_tokens=MAX_NEW))
    decoder = open_decoder(spec, proposer="none")
    table = {(p, False): decoder.generate(p).tokens for p in COMPLETION_PROMPTS}
    table.update({(p, True): decoder.generate(p, chat=True).tokens for p in CHAT_PROMPTS})
    return table, decoder.target.detokenize, decoder.target.info.eos_token_ids


def expected(reference, prompt: str, chat: bool, max_tokens: int) -> tuple[str, str]:
    """(text, finish_reason) that the answer alone gives with `max_tokens`."""
    table, detokenize, eos = reference
    tokens = list(table[(prompt, chat)][:max_tokens])
    ended = next((i for i, t in enumerate(tokens) if t in eos), None)
    if ended is not None:
        return detokenize(tokens[:ended]), "stop"
    assert len(tokens) == max_tokens, "the reference is long enough"
    return detokenize(tokens), "length"


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def async_client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)


def test_models_health_and_metrics(server):
    assert [m.id for m in client(server).models.list().data] == [MODEL]
    body = server.health()
    assert body["status"] == "ok" and body["max_batch"] == 8
    text = server.metrics()
    assert "draftwise_active_requests" in text and "draftwise_requests_total" in text


def test_completion_equals_generate_alone(server, reference):
    for prompt in COMPLETION_PROMPTS[:3]:
        out = client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_NEW, temperature=0)
        text, finish = expected(reference, prompt, False, MAX_NEW)
        assert (out.choices[0].text, out.choices[0].finish_reason) == (text, finish)
        assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == MODEL
        assert out.usage.completion_tokens == len(reference[0][(prompt, False)][:MAX_NEW])
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
        stats = out.model_extra["draftwise"]
        assert stats["proposer"] == "prompt-lookup" and stats["verifier"] == "greedy" and stats["exact"] is True
        assert stats["rounds"] >= 1 and stats["mean_accepted"] >= 0 and "fallbacks" in stats


def test_chat_streamed_equals_whole_and_generate_alone(server, reference):
    prompt = CHAT_PROMPTS[0]
    messages = [{"role": "user", "content": prompt}]
    whole = client(server).chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    chunks = list(client(server).chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                         stream=True, stream_options={"include_usage": True}))
    text, finish = expected(reference, prompt, True, 12)
    assert whole.choices[0].message.content == text and whole.choices[0].finish_reason == finish
    assert whole.choices[0].message.role == "assistant" and whole.object == "chat.completion"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == finish and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1 and chunks[-2].model_extra["draftwise"]["rounds"] >= 1


def test_the_stream_ends_with_done(server):
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_async_clients_stream_and_not(server, reference):
    async def one(prompt: str, stream: bool) -> tuple[str, str | None]:
        api = async_client(server)
        if not stream:
            out = await api.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
            return out.choices[0].text, out.choices[0].finish_reason
        text, finish = "", None
        async for chunk in await api.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                                                       stream=True):
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish

    async def both():
        return await asyncio.gather(*(one(p, i % 2 == 0) for i, p in enumerate(COMPLETION_PROMPTS)))

    answers = asyncio.run(both())
    assert answers == [expected(reference, p, False, 8) for p in COMPLETION_PROMPTS]


def test_seeded_sampling_is_reproducible(server):
    def sample(seed: int) -> str:
        out = client(server).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12,
                                                temperature=1.0, top_p=0.95, seed=seed)
        assert out.model_extra["draftwise"]["seed"] == seed
        return out.choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert len({first, sample(8), sample(9)}) > 1  # the seed is really used


def test_stop_strings_are_left_out(server, reference):
    prompt = COMPLETION_PROMPTS[0]
    full, _ = expected(reference, prompt, False, MAX_NEW)
    words = [w for w in full.split() if len(w) >= 2]
    assert len(words) >= 2, full
    stop = words[len(words) // 2]  # a word from the answer's middle: the answer must end right before it
    want = full[: full.find(stop)]
    whole = client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                              stop=[stop, "\u0000never"])
    streamed = list(client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_NEW, temperature=0,
                                                      stop=stop, stream=True))
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == (want, "stop")
    assert "".join(c.choices[0].text for c in streamed) == want and streamed[-1].choices[0].finish_reason == "stop"
    assert whole.model_extra["draftwise"]["stop_reason"] == "stop_string"


GOOD = {"model": MODEL, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}


def _with(base: dict, **changes) -> bytes:
    body = {**base, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


# (kind, path, body bytes, status, code, param, words in the message)
BAD = [
    ("malformed-json", "completions", b'{"model": "smollm2-135m", "prompt": ', 400, "invalid_json", None, "not valid JSON"),
    ("body-not-object", "completions", b"[1, 2]", 400, "invalid_type", None, "JSON object"),
    ("body-not-utf8", "completions", b'{"model": "smollm2-135m", "prompt": "caf\xff"}', 400, "invalid_encoding", None,
     "byte 0xff"),
    ("prompt-lone-surrogate", "completions", b'{"model": "smollm2-135m", "prompt": "caf\\ud800"}', 400,
     "invalid_encoding", "prompt", "not valid UTF-8"),
    ("nan-temperature", "completions", b'{"model": "smollm2-135m", "prompt": "hi", "temperature": NaN}', 400,
     "invalid_json", None, "NaN"),
    ("missing-model", "completions", _with(GOOD, model=...), 400, "missing_field", "model", "'model'"),
    ("missing-prompt", "completions", _with(GOOD, prompt=...), 400, "missing_field", "prompt", "'prompt'"),
    ("missing-messages", "chat/completions", _with(CHAT, messages=...), 400, "missing_field", "messages", "'messages'"),
    ("max-tokens-string", "completions", _with(GOOD, max_tokens="16"), 400, "invalid_type", "max_tokens", "integer"),
    ("max-tokens-bool", "completions", _with(GOOD, max_tokens=True), 400, "invalid_type", "max_tokens", "boolean"),
    ("temperature-string", "completions", _with(GOOD, temperature="hot"), 400, "invalid_type", "temperature", "number"),
    ("stream-string", "completions", _with(GOOD, stream="yes"), 400, "invalid_type", "stream", "boolean"),
    ("messages-string", "chat/completions", _with(CHAT, messages="hi"), 400, "invalid_type", "messages", "array"),
    ("message-bad-role", "chat/completions", _with(CHAT, messages=[{"role": "wizard", "content": "hi"}]), 400,
     "invalid_value", "messages[0].role", "wizard"),
    ("unknown-model", "completions", _with(GOOD, model="gpt-4"), 404, "model_not_found", "model", "'gpt-4'"),
    ("empty-prompt", "completions", _with(GOOD, prompt=""), 400, "empty_prompt", "prompt", "empty"),
    ("empty-messages", "chat/completions", _with(CHAT, messages=[]), 400, "empty_prompt", "messages", "empty"),
    ("prompt-over-context", "completions", _with(GOOD, prompt="hello " * 9000), 400, "context_length_exceeded",
     "prompt", "context of 8192"),
    ("prompt-token-out-of-vocab", "completions", _with(GOOD, prompt=[1, 10**9]), 400, "invalid_value", "prompt",
     "outside the vocabulary"),
    ("several-prompts", "completions", _with(GOOD, prompt=["a", "b"]), 400, "unsupported_value", "prompt", "2 prompts"),
    ("max-tokens-zero", "completions", _with(GOOD, max_tokens=0), 400, "invalid_value", "max_tokens", ">= 1"),
    ("max-tokens-over-limit", "completions", _with(GOOD, max_tokens=MAX_TOKENS_LIMIT + 1), 400, "invalid_value",
     "max_tokens", "limit of 512"),
    ("temperature-out-of-range", "completions", _with(GOOD, temperature=2.5), 400, "invalid_value", "temperature",
     "[0, 2]"),
    ("top-p-zero", "completions", _with(GOOD, top_p=0), 400, "invalid_value", "top_p", "(0, 1]"),
    ("top-p-over-one", "chat/completions", _with(CHAT, top_p=1.5), 400, "invalid_value", "top_p", "[0, 1]"),
    ("seed-negative", "completions", _with(GOOD, seed=-1), 400, "invalid_value", "seed", "seed"),
    ("too-many-stops", "completions", _with(GOOD, stop=["a", "b", "c", "d", "e"]), 400, "invalid_value", "stop",
     "at most 4"),
    ("empty-stop", "completions", _with(GOOD, stop=[""]), 400, "invalid_value", "stop", "empty"),
    ("n-two", "chat/completions", _with(CHAT, n=2), 400, "unsupported_value", "n", "n=2"),
    ("logprobs", "chat/completions", _with(CHAT, logprobs=True), 400, "unsupported_value", "logprobs", "logprobs"),
    ("presence-penalty", "completions", _with(GOOD, presence_penalty=0.5), 400, "unsupported_value", "presence_penalty",
     "not supported"),
    ("stream-options-without-stream", "completions", _with(GOOD, stream_options={"include_usage": True}), 400,
     "invalid_value", "stream_options", "only allowed when stream"),
    ("oversize-body", "completions", _with(GOOD, prompt="x" * (MAX_BODY + 10)), 413, "body_too_large", None,
     "at most 65536"),
]


@pytest.mark.parametrize("kind,path,body,status,code,param,words", BAD, ids=[row[0] for row in BAD])
def test_a_bad_request_gets_its_own_error_and_the_server_stays_healthy(server, kind, path, body, status, code, param,
                                                                       words):
    response = httpx.post(f"{server.url}/v1/{path}", content=body, headers={"content-type": "application/json"},
                          timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    assert words in error["message"] and error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    good = httpx.post(f"{server.url}/v1/completions", json=GOOD, timeout=60)
    assert good.status_code == 200 and good.json()["choices"][0]["finish_reason"] in ("length", "stop"), good.text


def test_unknown_routes_and_methods_get_openai_errors(server):
    missing = httpx.get(f"{server.url}/v1/engines", timeout=10)
    wrong = httpx.get(f"{server.url}/v1/completions", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"
    with pytest.raises(openai.NotFoundError):
        client(server).completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    assert server.health()["in_flight"] == 0  # no refusal kept a slot


def test_a_client_gone_mid_answer_frees_its_slot(server):
    before = metric(server.metrics(), "draftwise_requests_total", finish_reason="disconnected")
    body = {"model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(line for line in lines if line).startswith("data: ")
    with pytest.raises(httpx.ReadTimeout):  # a client that stops waiting for a whole (non-streamed) answer
        httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, timeout=1.5)
    wait_for(lambda: (server.health()["in_flight"], server.health()["active"]) == (0, 0), 60, "both slots freed")
    after = metric(server.metrics(), "draftwise_requests_total", finish_reason="disconnected")
    assert after == before + 2
    assert httpx.post(f"{server.url}/v1/completions", json=GOOD, timeout=60).status_code == 200


LOAD_REQUESTS = 48
LOAD_CONCURRENCY = 24
LOAD_LIMIT_S = 300


def test_load_every_answer_complete_and_identical_to_its_own_decode(server, reference):
    """LOAD_REQUESTS requests (completions and chat, streamed and not, 3..10 tokens), 24 at once: each answer
    is its prompt's answer alone; /metrics counted every one."""
    scrape = server.metrics()
    before = {name: metric(scrape, name) for name in ("draftwise_requests_total", "draftwise_completion_tokens_total",
                                                      "draftwise_prompt_tokens_total")}
    gate = asyncio.Semaphore(LOAD_CONCURRENCY)
    api = async_client(server)

    async def one(i: int):
        chat = i % 2 == 1
        prompts = CHAT_PROMPTS if chat else COMPLETION_PROMPTS
        prompt = prompts[(i // 2) % len(prompts)]
        max_tokens, stream = 3 + (i * 5) % 8, i % 4 >= 2
        args = dict(model=MODEL, max_tokens=max_tokens, temperature=0)
        async with gate:
            if chat:
                made = api.chat.completions.create(messages=[{"role": "user", "content": prompt}], stream=stream,
                                                   stream_options={"include_usage": True} if stream else None, **args)
            else:
                made = api.completions.create(prompt=prompt, stream=stream,
                                              stream_options={"include_usage": True} if stream else None, **args)
            out = await made
            if not stream:
                choice = out.choices[0]
                return prompt, chat, max_tokens, choice.message.content if chat else choice.text, choice.finish_reason, \
                    out.usage
            text, finish, usage, ends = "", None, None, 0
            async for chunk in out:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices:
                    text += (choice.delta.content or "") if chat else choice.text
                    ends += choice.finish_reason is not None
                    finish = choice.finish_reason or finish
            assert ends == 1  # one finish reason, on the last chunk with a choice
            return prompt, chat, max_tokens, text, finish, usage

    async def everything():
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(LOAD_REQUESTS))), LOAD_LIMIT_S)

    start_time = time.monotonic()
    answers = asyncio.run(everything())
    wall = time.monotonic() - start_time
    wrong = [(prompt, chat, n, text, finish) for prompt, chat, n, text, finish, _ in answers
             if (text, finish) != expected(reference, prompt, chat, n)]
    assert wrong == [], f"{len(wrong)} of {LOAD_REQUESTS} answers differ from their decode alone: {wrong[:3]}"
    scrape = server.metrics()
    assert metric(scrape, "draftwise_requests_total") - before["draftwise_requests_total"] == LOAD_REQUESTS
    assert metric(scrape, "draftwise_completion_tokens_total") - before["draftwise_completion_tokens_total"] == \
        sum(u.completion_tokens for *_, u in answers)
    assert metric(scrape, "draftwise_prompt_tokens_total") - before["draftwise_prompt_tokens_total"] == \
        sum(u.prompt_tokens for *_, u in answers)
    assert metric(scrape, "draftwise_batch_size_count") > 0 and server.health()["in_flight"] == 0
    print(f"load: {LOAD_REQUESTS} requests in {wall:.1f} s")


def test_a_heuristic_verifier_is_refused_at_startup(tmp_path):
    result = subprocess.run([sys.executable, "-m", "draftwise.cli.main", "serve", *MODEL_ARGS, "--verifier", "typical",
                             "--port", "1"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "heuristic" in result.stdout + result.stderr
