"""`draftwise export vllm`: draftwise's measured choice as vLLM's speculative_config.

A typer sub-app; the main CLI mounts it with `app.add_typer(export_app, name="export")`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional, cast

import typer

from draftwise.backends.dtype import TorchDtype
from draftwise.cli.common import dim, fail, int_list
from draftwise.errors import DraftwiseError

export_app = typer.Typer(help="Export draftwise's measured choices to other engines.", no_args_is_help=True)


@export_app.command()
def vllm(
    out: Path = typer.Option(..., "--out", help="artifact directory to write (kind vllm_export)"),
    target: str = typer.Option("smollm2-135m", help="target model (alias, GGUF or transformers directory)"),
    workload: str = typer.Option("humaneval:0-7", help="the user's workload (as the bench takes it): first turns"),
    batches: str = typer.Option("1,2,4,8", help="batch sizes to choose K for"),
    max_new_tokens: int = typer.Option(64, help="new tokens per workload prompt"),
    dtype: str = typer.Option("bfloat16", help="the dtype vLLM runs (draftwise decodes and profiles in it too)"),
    max_k: int = typer.Option(8, help="largest num_speculative_tokens considered"),
    profile: Optional[Path] = typer.Option(None, help="a batch_verify_profile artifact (default: measured, as gate=auto batch=B does)"),
    profile_engine: str = typer.Option("vllm", help="where t_B(n) is measured: vllm (its kernels, .venv-vllm) or draftwise (gate=auto's batch profile)"),
    threads: Optional[int] = typer.Option(None, help="draftwise's threads (match vLLM's compute threads: 1 on a 2-core machine)"),
    verify: bool = typer.Option(False, "--verify", help="run vLLM (.venv-vllm) with it, with its default and without speculation"),
    eager: bool = typer.Option(False, "--eager", help="vLLM enforce_eager (profile and --verify; skips minutes of torch.compile per engine)"),
) -> None:
    """Write the vLLM speculative_config that draftwise's measurements predict fastest per batch size."""
    from draftwise.vllm.export import PREDICTION_FILE, VERIFY_REPORT, ExportConfig
    from draftwise.vllm.pipeline import export_vllm

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("draftwise").setLevel(logging.INFO)
    try:
        config = ExportConfig(target=target, workload=workload, batches=int_list(batches, "--batches"),
                              max_new_tokens=max_new_tokens, dtype=cast(TorchDtype, dtype),  # ExportConfig checks it
                              max_k=max_k, profile=profile, threads=threads,
                              profile_engine=profile_engine)
        written = export_vllm(config, out, verify=verify, eager=eager)
    except DraftwiseError as exc:
        fail(str(exc))
        return
    body = json.loads((written / "speculative_config.json").read_text())
    prediction = json.loads((written / PREDICTION_FILE).read_text())
    dim(f"wrote {written}")
    print(json.dumps(body["speculative_config"]))
    for choice in prediction["choices"]:
        print(f"B={choice['batch']}: K={choice['k']} predicted {choice['predicted']:.2f}x no speculation")
    if verify:
        print((written / VERIFY_REPORT).read_text())
