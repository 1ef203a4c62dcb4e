"""Request bodies to frozen requests: each field checked once, each refusal named.

A body is parsed here, on the event loop, before it reaches the engine: JSON and its types,
the served model's name, the fields OpenAI's API has and draftwise does not support (refused,
never ignored: a client asking for `n=2` or `logprobs` would otherwise get an answer that is
not what it asked for), the sampling ranges, the stop strings.  What needs the model (the
prompt's tokens, the chat template, the context window) is checked by the engine worker.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from draftwise.errors import InputError
from draftwise.serve.config import ServeConfig
from draftwise.serve.errors import ApiError, bad_request
from draftwise.runtime.text import check_utf8

ROLES = ("system", "user", "assistant")
# OpenAI fields draftwise does not implement, with the value that means "not used"; any other value is refused
UNSUPPORTED = {"best_of": (None, 1), "echo": (None, False), "suffix": (None, ""), "presence_penalty": (None, 0),
               "frequency_penalty": (None, 0), "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []),
               "response_format": (None, {"type": "text"}), "top_logprobs": (None, 0)}


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class CompletionRequest:
    """One parsed request.  `prompt` for /v1/completions (text or token ids), `messages` for chat."""

    chat: bool
    model: str
    prompt: str | tuple[int, ...] | None
    messages: tuple[Message, ...]
    max_tokens: int | None  # None: the server's default, within what the context leaves
    temperature: float
    top_p: float
    top_k: int
    seed: int | None  # None: a fresh seed per request (as OpenAI samples without one)
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool


def parse_body(raw: bytes, chat: bool, config: ServeConfig) -> CompletionRequest:
    """A request body (bytes as received) as a `CompletionRequest`, or an `ApiError` naming what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(f"the request body is not valid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start}",
                          "invalid_encoding") from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_kind(body)}", "invalid_type")
    return parse_request(body, chat, config)


def parse_request(body: Mapping[str, Any], chat: bool, config: ServeConfig) -> CompletionRequest:
    model = _required(body, "model", str)
    if model != config.model:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {config.model!r}",
                       "model_not_found", "model")
    _refuse_unsupported(body)
    prompt = None if chat else _prompt(body)
    messages = _messages(body) if chat else ()
    stream = _optional(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and not stream:
        raise bad_request("stream_options is only allowed when stream is true", "invalid_value", "stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_request(f"stream_options must be an object, got {_kind(options)}", "invalid_type", "stream_options")
    include_usage = _optional(options or {}, "include_usage", bool, False, "stream_options.include_usage")
    return CompletionRequest(
        chat=chat, model=model, prompt=prompt, messages=messages,
        max_tokens=_max_tokens(body, chat, config),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_top_p(body),
        top_k=_integer(body, "top_k", 0, 0),
        seed=_seed(body),
        stop=_stop(body, config.max_stop_strings),
        stream=stream, include_usage=include_usage,
    )


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


_EXPECTED = {str: "a string", bool: "a boolean", int: "an integer", dict: "an object", list: "an array"}


def _typed(value: Any, kind: type, name: str) -> Any:
    # bool is an int in Python, not in JSON: `"max_tokens": true` is refused
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise bad_request(f"{name} must be {_EXPECTED.get(kind, kind.__name__)}, got {_kind(value)}", "invalid_type", name)
    return value


def _required(body: Mapping[str, Any], name: str, kind: type) -> Any:
    if body.get(name) is None:
        raise bad_request(f"missing required field {name!r}", "missing_field", name)
    return _typed(body[name], kind, name)


def _optional(body: Mapping[str, Any], name: str, kind: type, default: Any, param: str | None = None) -> Any:
    value = body.get(name)
    return default if value is None else _typed(value, kind, param or name)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    if n is not None and (_typed(n, int, "n") != 1):
        raise bad_request(f"n={n}: draftwise serve returns one choice per request (n=1); send {n} requests instead",
                          "unsupported_value", "n")
    logprobs = body.get("logprobs")
    if logprobs not in (None, False):  # (0 is False)
        raise bad_request("logprobs are not supported by draftwise serve (a speculative round's accepted tokens have "
                          "no per-token sampling record to report)", "unsupported_value", "logprobs")
    for name, neutral in UNSUPPORTED.items():
        if name in body and body[name] not in neutral:
            raise bad_request(f"{name} is not supported by draftwise serve (only {neutral[-1]!r} or null)",
                              "unsupported_value", name)


def _text(value: str, what: str, param: str) -> str:
    try:
        return check_utf8(value, what)
    except InputError as exc:
        raise bad_request(str(exc), "invalid_encoding", param) from None


def _prompt(body: Mapping[str, Any]) -> str | tuple[int, ...]:
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("missing required field 'prompt'", "missing_field", "prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) != 1:
            raise bad_request(f"prompt holds {len(prompt)} prompts: draftwise serve takes one per request",
                              "unsupported_value", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("the prompt is empty: give the text to continue", "empty_prompt", "prompt")
        return _text(prompt, "prompt", "prompt")
    if isinstance(prompt, list):
        if not prompt:
            raise bad_request("the prompt is empty: give the text (or token ids) to continue", "empty_prompt", "prompt")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad_request("prompt must be a string, or an array of token ids (integers)", "invalid_type", "prompt")
        return tuple(prompt)
    raise bad_request(f"prompt must be a string or an array of token ids, got {_kind(prompt)}", "invalid_type", "prompt")


def _messages(body: Mapping[str, Any]) -> tuple[Message, ...]:
    messages = _required(body, "messages", list)
    if not messages:
        raise bad_request("messages is empty: give at least one message", "empty_prompt", "messages")
    out = []
    for number, message in enumerate(messages):
        param = f"messages[{number}]"
        if not isinstance(message, dict):
            raise bad_request(f"{param} must be an object with role and content, got {_kind(message)}", "invalid_type", param)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad_request(f"{param}.role must be one of {', '.join(ROLES)}, got {role!r}", "invalid_value",
                              f"{param}.role")
        out.append(Message(role, _text(_content(message, param), f"{param}.content", f"{param}.content")))
    return tuple(out)


def _content(message: Mapping[str, Any], param: str) -> str:
    """A message's text: a string, or an array of text parts (OpenAI's content parts; no images)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    if content is None:
        raise bad_request(f"{param} has no content", "missing_field", f"{param}.content")
    raise bad_request(f"{param}.content must be a string or an array of text parts, got {_kind(content)}",
                      "invalid_type", f"{param}.content")


def _integer(body: Mapping[str, Any], name: str, default: int, lowest: int) -> int:
    value: int = _optional(body, name, int, default)
    if value < lowest:
        raise bad_request(f"{name} must be >= {lowest}, got {value}", "invalid_value", name)
    return value


def _number(body: Mapping[str, Any], name: str, default: float, lowest: float, highest: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"{name} must be a number, got {_kind(value)}", "invalid_type", name)
    if not lowest <= value <= highest:
        raise bad_request(f"{name} must be in [{lowest:g}, {highest:g}], got {value}", "invalid_value", name)
    return float(value)


def _top_p(body: Mapping[str, Any]) -> float:
    value = _number(body, "top_p", 1.0, 0.0, 1.0)
    if value == 0.0:  # an empty nucleus: the sampler needs at least its top token
        raise bad_request("top_p must be in (0, 1], got 0", "invalid_value", "top_p")
    return value


def _max_tokens(body: Mapping[str, Any], chat: bool, config: ServeConfig) -> int | None:
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(name)
    if value is None:
        return None
    _typed(value, int, name)
    if value < 1:
        raise bad_request(f"{name} must be >= 1, got {value}", "invalid_value", name)
    if value > config.max_tokens_limit:
        raise bad_request(f"{name} {value} is over this server's limit of {config.max_tokens_limit} "
                          "(--max-tokens-limit)", "invalid_value", name)
    return int(value)


def _seed(body: Mapping[str, Any]) -> int | None:
    value = body.get("seed")
    if value is None:
        return None
    _typed(value, int, "seed")
    if not 0 <= value < 1 << 64:
        raise bad_request(f"seed must be in [0, 2**64), got {value}", "invalid_value", "seed")
    return int(value)


def _stop(body: Mapping[str, Any], most: int) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop must be a string or an array of strings", "invalid_type", "stop")
    if len(stops) > most:
        raise bad_request(f"stop holds {len(stops)} strings; at most {most}", "invalid_value", "stop")
    for number, s in enumerate(stops):
        if not s:
            raise bad_request(f"stop string {number} is empty: it would end every answer at once", "invalid_value", "stop")
        _text(s, f"stop string {number}", "stop")
    return tuple(stops)
