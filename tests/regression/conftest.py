"""What the bad-input rows run on: each backend's embedded model loaded once per session (through
the public `draftwise.open_decoder`), a loader that hands those loaded backends to every decoder
a row opens (CLI or API), and the bad files, built once."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

import draftwise

MODEL = "smollm2-135m"
SHORT = 4  # new tokens of every good generation here: enough to show the decoder still works


def _heads_dir() -> Path:
    import draftwise.data

    return Path(draftwise.data.__file__).parent


@dataclass
class Context:
    """What a row's call reads: loaded decoders per backend, the shared loader, the bad files."""

    decoders: dict[str, Any]
    loader: Callable[[str, str, str], Any]
    paths: dict[str, str]

    def decoder(self, backend: str) -> Any:
        return self.decoders[backend]

    def open(self, **options: Any) -> Any:
        """`draftwise.open_decoder` on the session's loaded backends (nothing is loaded per row);
        on transformers unless the row says otherwise (every proposer family runs there)."""
        options.setdefault("backend", "transformers")
        spec = draftwise.DecoderSpec(generation=draftwise.GenerationConfig(max_new_tokens=SHORT))
        return draftwise.open_decoder(spec, loader=self.loader, **options)

    def path(self, name: str) -> str:
        return self.paths[name]


class SharedBackends:
    """The embedded model on each backend, loaded on first use and kept for the session."""

    def __init__(self) -> None:
        self.loaded: dict[str, Any] = {}

    def get(self, backend: str) -> Any:
        if backend not in self.loaded:
            if backend == "llamacpp":
                pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
                logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
            # one llama.cpp thread: two spin at every barrier on a shared 2-core box
            spec = draftwise.DecoderSpec(backend=backend, threads=1 if backend == "llamacpp" else None,
                                         generation=draftwise.GenerationConfig(max_new_tokens=SHORT))
            self.loaded[backend] = draftwise.open_decoder(spec, proposer="prompt-lookup")
        return self.loaded[backend]

    def loader(self, model: str, backend: str, role: str) -> Any:
        if model != MODEL:
            raise AssertionError(f"a regression row asked the shared loader for {model!r}; only {MODEL} is loaded")
        return self.get("llamacpp" if backend == "auto" else backend).target


class LazyDecoders(dict):
    def __init__(self, shared: SharedBackends) -> None:
        super().__init__()
        self._shared = shared

    def __missing__(self, backend: str) -> Any:
        return self._shared.get(backend)


@pytest.fixture(scope="session")
def shared_backends() -> SharedBackends:
    return SharedBackends()


@pytest.fixture(scope="session")
def bad_files(tmp_path_factory) -> dict[str, str]:
    """Every bad model, head, adapter, index, tree and profile file the rows name, made once."""
    from draftwise.artifacts import write_manifest

    root = tmp_path_factory.mktemp("bad")
    data = _heads_dir()
    paths: dict[str, str] = {"missing": str(root / "does-not-exist")}

    def write(name: str, content: bytes) -> Path:
        path = root / name
        path.write_bytes(content)
        paths[name.replace(".", "_").replace("-", "_")] = str(path)
        return path

    write("garbage.gguf", b"this is not a model\n" * 50)
    write("empty.gguf", b"")
    write("model.txt", b"a text file, not a model\n")
    write("prompts-empty.txt", b"\n  \n")
    write("prompts-bad.jsonl", b'{"prompt": "fine"}\n{not json\n')
    write("prompts-noprompt.jsonl", b'{"text": "no prompt key"}\n')
    write("prompts-binary.txt", b"\xff\xfe hello\n")
    write("prompts-ok.txt", b"hello\n")
    from draftwise.models import REGISTRY, cache_dir

    model_file = cache_dir() / REGISTRY[MODEL].filename
    if model_file.is_file():  # the embedded model's first 2 MB: a GGUF header with its tensors cut off
        with open(model_file, "rb") as handle:
            write("truncated.gguf", handle.read(2_000_000))
    baddir = root / "bad-config"
    baddir.mkdir()
    (baddir / "config.json").write_text("{not json")
    paths["bad_config_dir"] = str(baddir)

    def artifact_copies(source: Path, prefix: str, weights: str) -> None:
        """Truncated weights, a garbage manifest, a hand-edited manifest, and a valid one bound to another target."""
        for flaw in ("truncated", "garbage", "tampered", "other_target"):
            copy = root / f"{prefix}-{flaw}"
            shutil.copytree(source, copy)
            paths[f"{prefix}_{flaw}"] = str(copy)
        weights_file = root / f"{prefix}-truncated" / weights
        weights_file.write_bytes(weights_file.read_bytes()[:1000])
        (root / f"{prefix}-garbage" / "manifest.json").write_bytes(b"\xff\xfe\x00garbage\x89PNG")
        tampered = root / f"{prefix}-tampered" / "manifest.json"
        body = json.loads(tampered.read_text())
        body["provenance"]["target"]["checkpoint"] = "someone-else.gguf@0000"
        tampered.write_text(json.dumps(body))
        other = root / f"{prefix}-other_target"
        body = json.loads((other / "manifest.json").read_text())
        (other / "manifest.json").unlink()
        provenance = dict(body["provenance"])
        provenance["target"] = {"checkpoint": "other-model.gguf@0123456789abcdef",
                                "tokenizer_hash": provenance["target"]["tokenizer_hash"]}
        write_manifest(other, body["kind"], provenance)

    artifact_copies(data / "heads" / "medusa-smollm2-135m", "heads", "heads.safetensors")
    artifact_copies(data / "adapters" / "kangaroo-smollm2-135m", "adapter", "adapter.safetensors")
    plain_dir = root / "plain-dir"  # a directory, but no artifact of any kind
    plain_dir.mkdir()
    (plain_dir / "notes.txt").write_text("hello")
    paths["plain_dir"] = str(plain_dir)
    paths["heads_dir"] = str(data / "heads" / "medusa-smollm2-135m")  # a valid artifact of the wrong kind elsewhere
    bad_method = write("method.json", b"{\"proposer\": ")
    paths["method_json"] = str(bad_method)
    write("method-binary.toml", b"\xff\xfe\x00\x01")
    return paths


@pytest.fixture(scope="session")
def context(shared_backends, bad_files) -> Context:
    return Context(LazyDecoders(shared_backends), shared_backends.loader, bad_files)


@pytest.fixture
def cli_on_shared(monkeypatch, shared_backends):
    """The CLI's generate, opening its decoder on the session's loaded backends."""
    import draftwise.cli.generate as generate

    real = generate.open_decoder

    def open_shared(spec=None, **kwargs):
        if spec is not None and spec.target == MODEL:
            kwargs["loader"] = shared_backends.loader
        return real(spec, **kwargs)

    monkeypatch.setattr(generate, "open_decoder", open_shared)


@pytest.fixture(scope="session")
def served(shared_backends):
    """`draftwise serve`'s app on the session's transformers model, in process: a function that
    POSTs raw bytes to /v1/PATH and returns the response."""
    import asyncio

    import httpx

    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    from draftwise.serve.app import create_app
    from draftwise.serve.config import ServeConfig
    from draftwise.serve.server import build_state

    state = build_state(shared_backends.get("transformers"), ServeConfig(model=MODEL, max_batch=2))
    app = create_app(state)
    state.worker.start()  # the app's lifespan would; an in-process transport does not run it

    def post(path: str, body: bytes) -> httpx.Response:
        async def send() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://served") as client:
                return await client.post(f"/v1/{path}", content=body, headers={"content-type": "application/json"},
                                         timeout=120)

        return asyncio.run(send())

    yield post
    state.worker.close(60)
