"""`draftwise bench serve`'s option strings: servers, load levels, refusals before any server starts."""

import pytest

from draftwise.bench.serving.loadgen import CHAT, CLOSED, COMPLETIONS, OPEN, Endpoint, Load, Sampling
from draftwise.bench.serving.servers import (BUILTIN, DRAFTWISE, LLAMACPP, NEUTRAL_FIELDS, LaunchConfig, ServerSpec,
                                             command, parse_server)
from draftwise.bench.serving.settings import ServeBenchSettings, check, first_turns, parse_loads, parse_servers
from draftwise.errors import InputError


def test_builtin_and_defined_servers():
    assert parse_server("draftwise-none") == BUILTIN["draftwise-none"]
    assert parse_server("look=draftwise:--proposer prompt-lookup --gate 'auto'") == ServerSpec(
        "look", DRAFTWISE, ("--proposer", "prompt-lookup", "--gate", "auto"))
    assert parse_server("lc=llamacpp") == ServerSpec("lc", LLAMACPP, ())
    picked = parse_servers("llamacpp-server,look", ["look=draftwise:--proposer none"])
    assert [s.name for s in picked] == ["llamacpp-server", "look"]


@pytest.mark.parametrize("bad", ["nope", "x=vllm:", "=draftwise:", "x=draftwise:--a 'unclosed"])
def test_bad_servers_refused(bad):
    with pytest.raises(InputError):
        parse_server(bad)


def test_a_server_named_twice_refused():
    with pytest.raises(InputError, match="twice"):
        parse_servers("draftwise-none,draftwise-none", [])


def test_loads():
    assert parse_loads("1, 4", "0.5,inf") == (Load(CLOSED, 1), Load(CLOSED, 4), Load(OPEN, 0.5),
                                              Load(OPEN, float("inf")))
    assert parse_loads("", "2") == (Load(OPEN, 2.0),)
    for concurrency, rates in (("", ""), ("0", ""), ("1.5", ""), ("2", "-1"), ("2", "nan"), ("x", "")):
        with pytest.raises(InputError):
            parse_loads(concurrency, rates)


@pytest.mark.parametrize("change", [{"endpoint": "embeddings"}, {"max_tokens": 0}, {"num_prompts": 0},
                                    {"repeats": 0}, {"threads": 0}, {"temperature": -0.1}, {"servers": ()}])
def test_settings_refused_before_any_server_starts(change):
    with pytest.raises(InputError):
        check(ServeBenchSettings(**change))


def test_too_few_questions_refused():
    with pytest.raises(InputError, match="has 2 questions"):
        first_turns("humaneval:0-1", 3)
    assert len(first_turns("humaneval:0-1", 2)) == 2


def test_commands_bind_127_0_0_1_and_append_the_server_args(tmp_path):
    config = LaunchConfig("smollm2-135m", "/m.gguf", "llamacpp", 2, 5.0, tmp_path)
    lc = command(BUILTIN["llamacpp-server"], config, 9999)
    assert lc[1:3] == ["-m", "llama_cpp.server"] and lc[lc.index("--host") + 1] == "127.0.0.1"
    assert lc[-2:] == ["--interrupt_requests", "False"] and "/m.gguf" in lc
    dw = command(BUILTIN["draftwise-auto"], config, 9999)
    assert dw[dw.index("serve"):][:3] == ["serve", "--target", "smollm2-135m"] and dw[-2:] == ["--proposer", "auto"]
    assert dw[dw.index("--port") + 1] == "9999" and dw[dw.index("--backend") + 1] == "llamacpp"


def test_llama_cpp_server_is_asked_for_the_plain_distribution():
    # its own defaults (repeat_penalty 1.1, top_k 40, min_p 0.05) would change even greedy answers
    endpoint = Endpoint("http://127.0.0.1:1", "m", CHAT, NEUTRAL_FIELDS[LLAMACPP])
    body = endpoint.payload("hi", Sampling(8, 0.0, 3))
    assert (body["repeat_penalty"], body["top_k"], body["min_p"]) == (1.0, 0, 0.0)
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True} and (body["max_tokens"], body["seed"]) == (8, 3)
    plain = Endpoint("http://127.0.0.1:1", "m", COMPLETIONS, NEUTRAL_FIELDS[DRAFTWISE]).payload("hi", Sampling(8, 0.0, 3))
    assert plain["prompt"] == "hi" and "repeat_penalty" not in plain and "messages" not in plain
