"""The server's pure parts, without a model: request bodies to requests (each refusal named),
stop strings left out of streamed and whole answers alike, the limits' checks, and the serve
package's place (it imports neither the CLI nor the bench, and the core imports without it)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from draftwise.errors import InputError
from draftwise.serve.config import DEFAULT_MAX_TOKENS, ServeConfig
from draftwise.serve.errors import ApiError
from draftwise.serve.schema import parse_body
from draftwise.serve.stops import StopText, cut_at_stop

CONFIG = ServeConfig(model="m", max_tokens_limit=64)


def parse(chat: bool = False, **body):
    return parse_body(json.dumps({"model": "m", **body}).encode(), chat, CONFIG)


def refused(raw: bytes, chat: bool = False) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_body(raw, chat, CONFIG)
    return info.value


def test_a_completion_request_with_every_field():
    r = parse(prompt="hi", max_tokens=5, temperature=0, top_p=0.5, top_k=3, seed=9, stop="\n", stream=True,
              stream_options={"include_usage": True}, n=1, logprobs=None, user="someone")
    assert (r.prompt, r.max_tokens, r.temperature, r.top_p, r.top_k, r.seed, r.stop, r.stream, r.include_usage) == \
        ("hi", 5, 0.0, 0.5, 3, 9, ("\n",), True, True)


def test_defaults_are_openai_s():
    r = parse(prompt=[1, 2, 3])
    assert (r.prompt, r.max_tokens, r.temperature, r.top_p, r.seed, r.stop, r.stream) == \
        ((1, 2, 3), None, 1.0, 1.0, None, (), False)
    assert CONFIG.default_max_tokens == min(DEFAULT_MAX_TOKENS, 64)


def test_chat_messages_with_text_parts():
    r = parse(chat=True, messages=[{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
              max_completion_tokens=7)
    assert [(m.role, m.content) for m in r.messages] == [("system", "be brief"), ("user", "ab")] and r.max_tokens == 7


@pytest.mark.parametrize("raw,status,code,param", [
    (b"{", 400, "invalid_json", None),
    (b'"text"', 400, "invalid_type", None),
    (b'{"model": "m", "prompt": "\xc3"}', 400, "invalid_encoding", None),
    (b'{"model": "m", "prompt": "x", "top_p": Infinity}', 400, "invalid_json", None),
    (b'{"prompt": "x"}', 400, "missing_field", "model"),
    (b'{"model": "other", "prompt": "x"}', 404, "model_not_found", "model"),
    (b'{"model": "m", "prompt": 5}', 400, "invalid_type", "prompt"),
    (b'{"model": "m", "prompt": [1, "a"]}', 400, "invalid_type", "prompt"),
    (b'{"model": "m", "prompt": []}', 400, "empty_prompt", "prompt"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 65}', 400, "invalid_value", "max_tokens"),
    (b'{"model": "m", "prompt": "x", "max_tokens": 1.5}', 400, "invalid_type", "max_tokens"),
    (b'{"model": "m", "prompt": "x", "temperature": -0.1}', 400, "invalid_value", "temperature"),
    (b'{"model": "m", "prompt": "x", "top_k": -1}', 400, "invalid_value", "top_k"),
    (b'{"model": "m", "prompt": "x", "seed": "1"}', 400, "invalid_type", "seed"),
    (b'{"model": "m", "prompt": "x", "stop": [1]}', 400, "invalid_type", "stop"),
    (b'{"model": "m", "prompt": "x", "stop": ["\\udc80"]}', 400, "invalid_encoding", "stop"),
    (b'{"model": "m", "prompt": "x", "stream": true, "stream_options": 1}', 400, "invalid_type", "stream_options"),
    (b'{"model": "m", "prompt": "x", "stream": true, "stream_options": {"include_usage": "y"}}', 400, "invalid_type",
     "stream_options.include_usage"),
    (b'{"model": "m", "prompt": "x", "n": "1"}', 400, "invalid_type", "n"),
    (b'{"model": "m", "prompt": "x", "logprobs": 2}', 400, "unsupported_value", "logprobs"),
    (b'{"model": "m", "prompt": "x", "echo": true}', 400, "unsupported_value", "echo"),
    (b'{"model": "m", "prompt": "x", "best_of": 3}', 400, "unsupported_value", "best_of"),
])
def test_completion_refusals(raw, status, code, param):
    error = refused(raw)
    assert (error.status, error.code, error.param) == (status, code, param), error.message
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["message"]


@pytest.mark.parametrize("messages,code,param", [
    ([{"content": "x"}], "invalid_value", "messages[0].role"),
    (["x"], "invalid_type", "messages[0]"),
    ([{"role": "user"}], "missing_field", "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "invalid_type", "messages[0].content"),
    ([{"role": "user", "content": "caf\ud800"}], "invalid_encoding", "messages[0].content"),
])
def test_chat_refusals(messages, code, param):
    error = refused(json.dumps({"model": "m", "messages": messages}).encode(), chat=True)
    assert (error.code, error.param) == (code, param), error.message


def test_a_stream_holds_back_what_may_begin_a_stop_string():
    stops = StopText(["END", "\n\n"])
    shown = [stops.feed(p) for p in ["Hello E", "N", "ough. ", "Then\n", "\nmore"]]
    assert shown == ["Hello ", "", "ENough. ", "Then", ""]
    assert stops.finish("Hello ENough. Then\n\nmore") == ""
    assert stops.text[:stops.sent] == "Hello ENough. Then"


def test_a_stop_string_inside_a_token_cuts_the_answer_there():
    stops = StopText(["world"])
    assert stops.feed("hello wor") == "hello "
    assert stops.feed("ld!") == ""  # 'world!' came as one token: nothing of it is shown
    assert stops.finish("hello world!") == "" and stops.text[:stops.sent] == "hello "
    assert cut_at_stop("a b c", ["c", "b"]) == 2 and cut_at_stop("abc", ["x"]) is None


def test_streamed_pieces_add_up_to_the_whole_answer():
    text = "one two\n\nthree END four"
    for size in (1, 2, 3, 5):
        stops = StopText(["END", "\n\n"])
        pieces = [stops.feed(text[i:i + size]) for i in range(0, len(text), size)]
        pieces.append(stops.finish(text))
        assert "".join(pieces) == "one two"


@pytest.mark.parametrize("changes,words", [
    (dict(max_batch=0), "--max-batch"), (dict(max_queue=-1), "--max-queue"), (dict(request_timeout=0), "--request-timeout"),
    (dict(grace_seconds=-1), "--grace-seconds"), (dict(model=""), "name"), (dict(max_body_bytes=0), "--max-body-bytes"),
])
def test_serve_config_refuses_bad_limits(changes, words):
    with pytest.raises(InputError, match=words):
        ServeConfig(**{"model": "m", **changes})


def test_serve_imports_neither_the_cli_nor_the_bench():
    package = Path(__file__).resolve().parents[2] / "src" / "draftwise" / "serve"
    found = []
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{path.name}: {n}" for n in names if n.startswith(("draftwise.cli", "draftwise.bench"))]
    assert found == []


def test_the_core_and_the_cli_import_without_the_serve_extra():
    """fastapi, uvicorn and prometheus_client are imported by the serve package's runtime modules only."""
    import subprocess
    import sys

    code = ("import sys; sys.modules.update(dict.fromkeys(['fastapi', 'uvicorn', 'prometheus_client'])); "
            "import draftwise, draftwise.cli.main, draftwise.serve.config, draftwise.serve.schema")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
