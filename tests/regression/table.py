"""The bad-input table: one row per (bad input, surface), with the outcome every surface owes it.

surface  "cli": `draftwise ARGS...` through typer's CliRunner; "{name}" in an argument is a
             file of `conftest.bad_files` ({out_absent}: a path that must still not exist
             afterwards; {out_file}: a regular file that must be unchanged afterwards).
         "api": `call(context)` on the Python API (`draftwise.open_decoder`, `Decoder.generate`,
             the public config types), on the session's loaded models.
         "http": `call(context)` gives (path, body bytes) POSTed to `draftwise serve`'s app (in
             process, on the session's transformers model): the row's `status`, an OpenAI-style
             error body whose message holds `mentions`, and a good request served right after.
error    the DraftwiseError subclass the API raises (the CLI: exit code 2, one `error:` line).
mentions substrings the message must hold: the input it names and what is wrong with it.
backend  the session model the row runs on ("transformers" / "llamacpp"; None: no model).  After
         an API row, a good generation on that backend's decoder must still work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Literal

import draftwise
from draftwise.errors import ArtifactError, BackendError, ContractError, DraftwiseError, InputError, ModelError

Surface = Literal["cli", "api", "http"]
SURFACES: tuple[Surface, ...] = ("cli", "api", "http")
BACKENDS = ("transformers", "llamacpp")
BAD_UTF8 = b"\xff\xfe".decode("utf-8", "surrogateescape")  # what Python makes of those bytes in argv: '\udcff\udcfe'
LONG_TEXT = "hello " * 5000  # over llama.cpp's 4096-cell context (and with 128 new tokens, past 4096 anyway)


@dataclass(frozen=True)
class Row:
    id: str
    surface: Surface
    call: tuple[str, ...] | Callable[[Any], Any]
    error: type[DraftwiseError]
    mentions: tuple[str, ...] = ()
    backend: str | None = None
    out: Literal["absent", "file"] | None = None
    status: int | None = None  # http: the status the server answers with


def cli(id: str, args: list[str], error: type[DraftwiseError], *mentions: str, backend: str | None = None,
        out: Literal["absent", "file"] | None = None) -> Row:
    return Row(id, "cli", tuple(args), error, mentions, backend, out)


def api(id: str, call: Callable[[Any], Any], error: type[DraftwiseError], *mentions: str,
        backend: str | None = None) -> Row:
    return Row(id, "api", call, error, mentions, backend, None)


def http(id: str, path: str, body: dict[str, Any] | bytes, status: int, *mentions: str,
         error: type[DraftwiseError] = InputError) -> Row:
    """A request to the server: `body` (a JSON object, or the raw bytes sent) POSTed to /v1/`path`."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return Row(id, "http", lambda c: (path, raw), error, mentions, "transformers", None, status)


def gen(backend: str, *args: str) -> list[str]:
    """`draftwise generate` on the embedded model and `backend`, 4 new tokens."""
    return ["generate", "--backend", backend, "--max-new-tokens", "4", *args]


def _spec(**generation: Any) -> Any:
    return draftwise.DecoderSpec(generation=draftwise.GenerationConfig(**generation))


ROWS: list[Row] = []

# ---- prompts: not valid UTF-8, empty, over the context window (both backends, both surfaces) --------------
for b in BACKENDS:
    ROWS += [
        cli(f"prompt-not-utf8-{b}", gen(b, BAD_UTF8), InputError, "prompt is not valid UTF-8", "0xff",
            "at character 0", backend=b),
        cli(f"chat-prompt-not-utf8-{b}", gen(b, "--chat", "ok " + BAD_UTF8), InputError, "prompt is not valid UTF-8",
            "at character 3", backend=b),
        cli(f"prompt-empty-{b}", gen(b, ""), InputError, "prompt is empty", backend=b),
        cli(f"prompt-over-context-{b}", gen(b, LONG_TEXT, "--max-new-tokens", "4000"), BackendError, "prompt",
            "context of", backend=b),
        api(f"prompt-not-utf8-{b}", lambda c, b=b: c.decoder(b).generate(BAD_UTF8), InputError,
            "prompt is not valid UTF-8", "byte 0xff", "at character 0", backend=b),
        api(f"prompt-lone-surrogate-{b}", lambda c, b=b: c.decoder(b).generate("caf\ud800"), InputError,
            "prompt is not valid UTF-8", "U+D800", "at character 3", backend=b),
        api(f"chat-prompt-not-utf8-{b}", lambda c, b=b: c.decoder(b).generate("hi " + BAD_UTF8, chat=True), InputError,
            "chat message 0 content is not valid UTF-8", "at character 3", backend=b),
        api(f"prompt-empty-{b}", lambda c, b=b: c.decoder(b).generate(""), InputError, "prompt has no tokens", backend=b),
        api(f"prompt-ids-over-context-{b}", lambda c, b=b: c.decoder(b).generate([42] * 9000), BackendError,
            "prompt (9000 tokens)", "context of", backend=b),
        api(f"stream-not-utf8-{b}", lambda c, b=b: list(c.decoder(b).stream(BAD_UTF8)), InputError,
            "prompt is not valid UTF-8", backend=b),
    ]

# ---- stop strings ------------------------------------------------------------------------------------------
ROWS += [
    cli("stop-empty", gen("transformers", "hi", "--stop", ""), InputError, "stop string 0 is empty"),
    cli("stop-not-utf8", gen("transformers", "hi", "--stop", "ok", "--stop", BAD_UTF8), InputError,
        "stop string 1 is not valid UTF-8"),
    api("stop-not-utf8", lambda c: draftwise.GenerationConfig(stop_strings=("\udcff",)), InputError,
        "stop string 0 is not valid UTF-8"),
]

# ---- names: proposer, backend, verifier; heuristic verifiers in exact mode; contracts ------------------
ROWS += [
    cli("proposer-unknown", gen("transformers", "hi", "--proposer", "bogus"), InputError, "unknown proposer 'bogus'"),
    cli("backend-unknown", ["generate", "hi", "--backend", "bogus"], InputError, "unknown backend 'bogus'"),
    cli("verifier-unknown", gen("transformers", "hi", "--verifier", "bogus"), InputError, "unknown verifier 'bogus'"),
    cli("verifier-typical-exact", gen("transformers", "hi", "--verifier", "typical"), ContractError,
        "'typical' is a heuristic", "exact mode"),
    cli("verifier-cannot-verify-contract", gen("transformers", "hi", "--verifier", "rejection"), ContractError,
        "'rejection' cannot verify", "deterministic_lookup"),
    api("batch-zero", lambda c: c.open(batch=0), InputError, "batch=0", "at least 1 request"),
    api("batch-not-a-number", lambda c: c.open(batch="many"), InputError, "batch='many' is not an integer"),
    api("batch-prompt-empty", lambda c: c.decoder("transformers").generate_many(["hi", ""]), InputError,
        "prompt has no tokens", backend="transformers"),
    api("proposer-unknown", lambda c: c.open(proposer="bogus"), InputError, "unknown proposer 'bogus'"),
    api("backend-unknown", lambda c: c.open(backend="bogus"), InputError, "unknown backend 'bogus'"),
    api("verifier-unknown", lambda c: c.open(verifier="bogus"), InputError, "unknown verifier 'bogus'"),
    api("verifier-typical-exact", lambda c: c.open(verifier="typical"), ContractError, "'typical' is a heuristic"),
    api("verifier-cannot-verify-contract", lambda c: c.open(proposer="prompt-lookup", verifier="sequoia"),
        ContractError, "'sequoia' cannot verify", "deterministic_lookup"),
    api("key-unknown", lambda c: draftwise.spec_from_options({"bogus": "1"}), InputError, "unknown key(s) bogus"),
    api("key-of-another-proposer", lambda c: c.open(proposer="prompt-lookup", k=4), InputError,
        "k configures", "draft-model"),
]

# ---- numbers: token counts, sampling policy, tree limits ---------------------------------------------------
ROWS += [
    cli("prompts-missing-file", ["generate", "--prompts", "{missing}"], InputError, "--prompts", "does-not-exist"),
    cli("prompts-empty-file", ["generate", "--prompts", "{prompts_empty_txt}"], InputError, "holds no prompt"),
    cli("prompts-bad-jsonl", ["generate", "--prompts", "{prompts_bad_jsonl}"], InputError, "line 2", "not JSON"),
    cli("prompts-without-prompt-key", ["generate", "--prompts", "{prompts_noprompt_jsonl}"], InputError,
        "line 1", '"prompt" string'),
    cli("prompts-not-utf8", ["generate", "--prompts", "{prompts_binary_txt}"], InputError, "not valid UTF-8"),
    cli("prompts-and-prompt", ["generate", "hi", "--prompts", "{prompts_ok_txt}"], InputError, "not both"),
    cli("prompts-batch-zero", ["generate", "--prompts", "{prompts_ok_txt}", "--batch", "0"], InputError, "--batch 0"),
    cli("no-prompt", ["generate"], InputError, "give a prompt, or --prompts FILE"),
    cli("max-new-tokens-zero", ["generate", "hi", "--max-new-tokens", "0"], InputError, "max_new_tokens must be >= 1"),
    cli("max-new-tokens-negative", ["generate", "hi", "--max-new-tokens", "-5"], InputError,
        "max_new_tokens must be >= 1", "-5"),
    cli("max-new-tokens-huge", gen("llamacpp", "hi", "--max-new-tokens", "1000000000"), BackendError,
        "max_new_tokens (1000000000)", "context of", backend="llamacpp"),
    cli("temperature-negative", ["generate", "hi", "--temperature", "-0.5"], InputError, "temperature must be >= 0"),
    cli("temperature-nan", ["generate", "hi", "--temperature", "nan"], InputError, "temperature must be >= 0", "nan"),
    cli("top-p-zero", ["generate", "hi", "--top-p", "0"], InputError, "top-p must be in (0, 1]"),
    cli("top-p-above-one", ["generate", "hi", "--top-p", "1.5"], InputError, "top-p must be in (0, 1]", "1.5"),
    cli("top-k-negative", ["generate", "hi", "--top-k", "-1"], InputError, "top-k must be >= 0"),
    api("max-new-tokens-zero", lambda c: _spec(max_new_tokens=0), InputError, "max_new_tokens must be >= 1"),
    api("max-new-tokens-huge", lambda c: c.decoder("transformers").sized(10**9).generate("hi"), BackendError,
        "max_new_tokens (1000000000)", "context of", backend="transformers"),
    api("temperature-inf", lambda c: draftwise.SamplingPolicy(temperature=float("inf")), InputError,
        "temperature must be >= 0"),
    api("top-p-negative", lambda c: draftwise.SamplingPolicy(top_p=-0.1), InputError, "top-p must be in (0, 1]"),
    api("top-k-negative", lambda c: draftwise.SamplingPolicy(top_k=-3), InputError, "top-k must be >= 0"),
    api("max-nodes-negative", lambda c: c.open(max_nodes=-3), InputError, "max_nodes must be >= 0", "-3"),
    api("max-depth-not-integer", lambda c: c.open(max_depth="deep"), InputError, "max_depth='deep'", "not an integer"),
    api("lookup-zero", lambda c: c.open(proposer="prompt-lookup", lookup=0), InputError,
        "prompt lookup settings must be >= 1"),
    api("draft-k-zero", lambda c: c.open(proposer="draft-model", draft="smollm2-135m", k=0), InputError,
        "k must be >= 1"),
]

# ---- tree templates and tree artifacts ---------------------------------------------------------------------
DRAFTING = ["--proposer", "draft-model", "--draft", "smollm2-135m"]
ROWS += [
    cli("tree-zero-width", gen("transformers", "hi", *DRAFTING, "--tree", "wbd:2,0"), InputError,
        "tree template 'wbd:2,0'", "positive integers"),
    cli("tree-json-gap", gen("transformers", "hi", *DRAFTING, "--tree", "[[0],[2]]"), InputError,
        "tree template '[[0],[2]]'", "no gap"),
    cli("tree-json-nested", gen("transformers", "hi", *DRAFTING, "--tree", "[[[0]]]"), InputError,
        "tree template '[[[0]]]'", "non-negative integer slot indices"),
    cli("tree-huge-chain", gen("transformers", "hi", *DRAFTING, "--tree", "chain:1000000000"), InputError,
        "tree template 'chain:1000000000'", "more than 4096 nodes"),
    cli("tree-unknown-kind", gen("transformers", "hi", *DRAFTING, "--tree", "star:3"), InputError,
        "unknown kind 'star'"),
    cli("tree-missing-directory", gen("transformers", "hi", *DRAFTING, "--tree", "{missing}"), InputError,
        "no such tree directory"),
    api("tree-huge-cartesian", lambda c: c.open(proposer="draft-model", draft="smollm2-135m",
                                                tree="cartesian:1000,1000,1000"), InputError,
        "tree template 'cartesian:1000,1000,1000'", "more than 4096 nodes"),
    api("tree-not-json", lambda c: c.open(proposer="draft-model", draft="smollm2-135m", tree="[[0],"), InputError,
        "is not valid JSON"),
    api("tree-deeply-nested-json", lambda c: c.open(proposer="draft-model", draft="smollm2-135m",
                                                    tree="[" * 100_000), InputError, "is not valid JSON"),
    api("tree-artifact-not-an-artifact", lambda c: c.open(proposer="draft-model", draft="smollm2-135m",
                                                          tree=c.path("plain_dir")), ArtifactError,
        "manifest.json is missing", backend="transformers"),
    api("tree-artifact-wrong-kind", lambda c: c.open(proposer="draft-model", draft="smollm2-135m",
                                                     tree=c.path("heads_dir")), ArtifactError,
        "'draft_heads' artifact", "expected 'tree'", backend="transformers"),
    api("tree-artifact-garbage", lambda c: c.open(proposer="draft-model", draft="smollm2-135m",
                                                  tree=c.path("heads_garbage")), ArtifactError,
        "is not valid JSON", backend="transformers"),
]

# ---- model files -----------------------------------------------------------------------------------------
for b in BACKENDS:
    ROWS += [
        cli(f"model-garbage-gguf-{b}", ["generate", "hi", "--backend", b, "--target", "{garbage_gguf}"], BackendError,
            "could not load", "garbage.gguf"),
        api(f"model-empty-gguf-{b}", lambda c, b=b: draftwise.open_decoder(target=c.path("empty_gguf"), backend=b),
            BackendError, "could not load", "empty.gguf"),
        api(f"model-truncated-gguf-{b}", lambda c, b=b: draftwise.open_decoder(target=c.path("truncated_gguf"),
                                                                               backend=b),
            BackendError, "could not load", "truncated.gguf"),
    ]
ROWS += [
    cli("model-missing", ["generate", "hi", "--target", "{missing}"], ModelError, "unknown model", "does-not-exist"),
    api("model-not-gguf", lambda c: draftwise.open_decoder(target=c.path("model_txt")), ModelError,
        "model.txt is a file but not a .gguf model"),
    api("model-directory-bad-config", lambda c: draftwise.open_decoder(target=c.path("bad_config_dir"),
                                                                       backend="transformers"),
        BackendError, "cannot load", "bad-config"),
]

# ---- head sets, adapters, REST indexes, gate profiles ------------------------------------------------------
ROWS += [
    api("heads-missing", lambda c: c.open(proposer="medusa", heads=c.path("missing")), ArtifactError,
        "does-not-exist", "manifest.json is missing", backend="transformers"),
    api("heads-truncated", lambda c: c.open(proposer="medusa", heads=c.path("heads_truncated")), ArtifactError,
        "heads.safetensors is corrupt or was tampered with", backend="transformers"),
    api("heads-garbage-manifest", lambda c: c.open(proposer="medusa", heads=c.path("heads_garbage")), ArtifactError,
        "manifest.json is not valid JSON", backend="transformers"),
    api("heads-tampered-manifest", lambda c: c.open(proposer="medusa", heads=c.path("heads_tampered")),
        ArtifactError, "was edited after it was written", backend="transformers"),
    api("heads-other-target", lambda c: c.open(proposer="medusa", heads=c.path("heads_other_target")),
        ContractError, "trained for other-model.gguf", backend="transformers"),
    cli("heads-truncated", gen("transformers", "hi", "--proposer", "medusa", "--set", "heads={heads_truncated}"),
        ArtifactError, "heads.safetensors is corrupt or was tampered with", backend="transformers"),
    api("adapter-missing", lambda c: c.open(proposer="kangaroo", adapter=c.path("missing")), ArtifactError,
        "does-not-exist", backend="transformers"),
    api("adapter-truncated", lambda c: c.open(proposer="kangaroo", adapter=c.path("adapter_truncated")),
        ArtifactError, "adapter.safetensors is corrupt or was tampered with", backend="transformers"),
    api("adapter-garbage-manifest", lambda c: c.open(proposer="kangaroo", adapter=c.path("adapter_garbage")),
        ArtifactError, "manifest.json is not valid JSON", backend="transformers"),
    api("adapter-other-target", lambda c: c.open(proposer="kangaroo", adapter=c.path("adapter_other_target")),
        ContractError, "trained for other-model.gguf", backend="transformers"),
    api("index-missing", lambda c: c.open(proposer="rest", index=c.path("missing")), ArtifactError,
        "does-not-exist", backend="transformers"),
    api("index-wrong-kind", lambda c: c.open(proposer="rest", index=c.path("heads_dir")), ArtifactError,
        "'draft_heads' artifact", "expected 'rest_index'", backend="transformers"),
    api("index-garbage-manifest", lambda c: c.open(proposer="rest", index=c.path("heads_garbage")), ArtifactError,
        "manifest.json is not valid JSON", backend="transformers"),
    api("gate-not-a-directory", lambda c: c.open(gate=c.path("missing")), InputError,
        "gate must be auto or a verify_profile directory"),
    api("gate-name-too-long", lambda c: draftwise.spec_from_options({"gate": "g" * 300}), InputError,
        "gate must be auto or a verify_profile directory"),
    cli("gate-name-too-long", ["generate", "hi", "--gate", "g" * 300], InputError,
        "gate must be auto or a verify_profile directory"),
    api("tree-name-too-long", lambda c: c.open(proposer="draft-model", draft="smollm2-135m", tree="t" * 300),
        InputError, "tree template 'ttt"),
    api("model-name-too-long", lambda c: draftwise.open_decoder(target="m" * 300), ModelError, "unknown model 'mmm"),
    api("model-unknown-home", lambda c: draftwise.open_decoder(target="~nobody-here/model.gguf"), ModelError,
        "unknown model '~nobody-here/model.gguf'"),
    api("gate-wrong-kind", lambda c: c.open(gate=c.path("heads_dir")), ArtifactError, "'draft_heads' artifact",
        "expected 'verify_profile'", backend="transformers"),
]

# ---- --set, bench methods and workloads, outputs over existing files ---------------------------------------
BENCH = ["bench", "--quiet"]
WORKLOAD_NAME_TOO_LONG = "prompts:" + "p" * 300
ROWS += [
    cli("set-without-value", gen("transformers", "hi", "--set", "k"), InputError, "--set 'k': expected KEY=VALUE"),
    cli("set-twice", gen("transformers", "hi", "--set", "lookup=2", "--set", "lookup=3"), InputError,
        "--set lookup given twice"),
    cli("set-markup-like-value", gen("transformers", "hi", "--set", "[/x]=1"), InputError, "unknown key(s) [/x]"),
    cli("bench-method-bad-key", [*BENCH, "--out", "{out_absent}", "--workload", "humaneval:0-0",
                                 "--method", "NAME=dw:bad=1"], InputError, "method 'NAME'", "unknown key(s) bad",
        out="absent"),
    cli("bench-method-unknown-kind", [*BENCH, "--out", "{out_absent}", "--workload", "humaneval:0-0",
                                      "--method", "x=vllm"], InputError, "unknown method 'vllm'", out="absent"),
    cli("bench-method-contract", [*BENCH, "--out", "{out_absent}", "--workload", "humaneval:0-0",
                                  "--method", "x=dw:proposer=prompt-lookup,verifier=rejection"], InputError,
        "method 'x'", "'rejection' cannot verify", out="absent"),
    cli("bench-method-file-not-json", [*BENCH, "--out", "{out_absent}", "--workload", "humaneval:0-0",
                                       "--method", "x={method_json}"], InputError, "method.json cannot be read as JSON",
        out="absent"),
    cli("bench-method-file-not-utf8", [*BENCH, "--out", "{out_absent}", "--workload", "humaneval:0-0",
                                       "--method", "x={method_binary_toml}"], InputError,
        "method-binary.toml cannot be read as TOML", out="absent"),
    cli("bench-workload-reversed-range", [*BENCH, "--out", "{out_absent}", "--workload", "humaneval:5-2",
                                          "--method", "p=dw:proposer=none"], InputError, "humaneval:5-2",
        "range outside", out="absent"),
    cli("bench-workload-superscript", [*BENCH, "--out", "{out_absent}", "--workload", "humaneval:\u00b2",
                                       "--method", "p=dw:proposer=none"], InputError, "expected a range A-B",
        out="absent"),
    cli("bench-workload-unknown-kind", [*BENCH, "--out", "{out_absent}", "--workload", "gsm8k:0-3",
                                        "--method", "p=dw:proposer=none"], InputError, "unknown workload kind 'gsm8k'",
        out="absent"),
    cli("bench-workload-name-too-long", [*BENCH, "--out", "{out_absent}", "--workload", WORKLOAD_NAME_TOO_LONG,
                                         "--method", "p=dw:proposer=none"], InputError, "prompt file", "not found",
        out="absent"),
    cli("bench-out-is-a-file", [*BENCH, "--out", "{out_file}", "--workload", "humaneval:0-0",
                                "--method", "p=dw:proposer=none"], InputError, "exists and is not a directory",
        out="file"),
    cli("profile-out-is-a-file", ["profile", "--out", "{out_file}"], ArtifactError,
        "exists and is not a 'verify_profile' artifact", out="file"),
    cli("calibrate-out-is-a-file", ["calibrate", "--out", "{out_file}"], ArtifactError,
        "exists and is not a 'acceptance' artifact", out="file"),
    cli("tree-optimize-out-is-a-file", ["tree", "optimize", "--acceptance", "{missing}", "--profile", "{missing}",
                                        "--out", "{out_file}"], ArtifactError, "exists and is not a 'tree' artifact",
        out="file"),
]

# ---- the server: `draftwise serve`'s requests (docs/serve.md#errors) -----------------------------------------
SERVED = {"model": "smollm2-135m", "prompt": "hi", "max_tokens": 2, "temperature": 0}
ROWS += [
    http("body-not-json", "completions", b'{"model": "smollm2-135m", "prompt": ', 400, "not valid JSON"),
    http("body-not-utf8", "completions", b'{"model": "smollm2-135m", "prompt": "caf\xff"}', 400, "not valid UTF-8",
         "byte 0xff"),
    http("prompt-lone-surrogate", "completions", b'{"model": "smollm2-135m", "prompt": "caf\\ud800"}', 400,
         "prompt is not valid UTF-8", "U+D800", "at character 3"),
    http("chat-content-lone-surrogate", "chat/completions",
         {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi \ud800"}]}, 400,
         "messages[0].content is not valid UTF-8", "at character 3"),
    http("prompt-missing", "completions", {k: v for k, v in SERVED.items() if k != "prompt"}, 400,
         "missing required field 'prompt'"),
    http("prompt-empty", "completions", {**SERVED, "prompt": ""}, 400, "prompt is empty"),
    http("prompt-over-context", "completions", {**SERVED, "prompt": [42] * 9000}, 400, "prompt (9000 tokens)",
         "context of", error=BackendError),
    http("model-unknown", "completions", {**SERVED, "model": "gpt-4"}, 404, "'gpt-4' does not exist", "smollm2-135m"),
    http("max-tokens-zero", "completions", {**SERVED, "max_tokens": 0}, 400, "max_tokens must be >= 1"),
    http("max-tokens-over-limit", "completions", {**SERVED, "max_tokens": 10**6}, 400, "max_tokens 1000000",
         "--max-tokens-limit"),
    http("temperature-negative", "completions", {**SERVED, "temperature": -0.5}, 400, "temperature must be in [0, 2]"),
    http("top-p-zero", "completions", {**SERVED, "top_p": 0}, 400, "top_p must be in (0, 1]"),
    http("stop-empty", "completions", {**SERVED, "stop": ["ok", ""]}, 400, "stop string 1 is empty"),
    http("stop-too-many", "completions", {**SERVED, "stop": list("abcde")}, 400, "stop holds 5 strings", "at most 4"),
    http("n-two", "chat/completions", {"model": "smollm2-135m", "messages": [{"role": "user", "content": "hi"}],
                                       "n": 2}, 400, "n=2", "one choice per request"),
    http("logprobs", "completions", {**SERVED, "logprobs": 5}, 400, "logprobs are not supported"),
    http("body-too-large", "completions", {**SERVED, "prompt": "x" * (1 << 21)}, 413, "at most 1048576", "--max-body-bytes"),
]
