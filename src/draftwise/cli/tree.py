"""`draftwise calibrate` and `draftwise tree optimize`: measured inputs -> a chosen tree.

calibrate      run real verification on width-W trees over a workload and save the positional
               acceptance (an "acceptance" artifact) with the proposer's cost per depth;
tree optimize  combine it with a verify-cost profile (`draftwise profile`) and write the tree
               with the least predicted time per committed token (a "tree" artifact), which
               `draftwise generate --tree DIR` uses for a draft-model tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from draftwise.api import open_decoder
from draftwise.errors import DraftwiseError
from draftwise.logs import progress_to
from draftwise.optimize.calibrate import calibrated_families, calibration_spec
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.spec import DecoderSpec
from draftwise.cli.common import dim, err, fail as _fail

tree_app = typer.Typer(help="Hardware-aware trees: optimize a draft tree from measured artifacts.", no_args_is_help=True)



def calibrate(
    target: str = typer.Option(DecoderSpec().target, help="Target model."),
    proposer: str = typer.Option("draft-model", help=f"{' | '.join(calibrated_families())}."),
    draft: Optional[str] = typer.Option(None, help="Draft model for --proposer draft-model."),
    backend: str = typer.Option("auto", help="auto | transformers | llamacpp."),
    threads: Optional[int] = typer.Option(None, help="CPU threads (default: all cores)."),
    width: int = typer.Option(4, help="Children per parent: the slots measured."),
    depth: int = typer.Option(1, help="Tree depth; > 1 measures a depth-indexed profile."),
    relation: Optional[str] = typer.Option(None, help="Draft children: beam (top-k) | without_replacement | iid."),
    workload: str = typer.Option("humaneval:0-4", help="Spec-Bench JSONL, humaneval:A-B or a prompt file (first turns)."),
    max_new_tokens: int = typer.Option(64, help="Tokens generated per prompt."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0),
    top_k: int = typer.Option(0),
    seed: int = typer.Option(0),
    out: Path = typer.Option(..., help="Directory for the acceptance artifact."),
) -> None:
    """Measure positional acceptance p_j (and the proposer's cost per depth) by real verification."""
    from draftwise.workloads import messages_for, parse_workload
    from draftwise.optimize.calibrate import calibrate as run_calibration
    from draftwise.plan import check
    from draftwise.optimize.calibrate import calibration_provenance, profile_from_counts

    from draftwise.artifacts import check_out
    from draftwise.optimize.acceptance import ARTIFACT_KIND

    try:
        check_out(out, ARTIFACT_KIND)  # before a model is loaded or a prompt decoded
        policy = SamplingPolicy(temperature=temperature, top_k=top_k, top_p=top_p)
        spec = calibration_spec(target, backend, threads, proposer, draft, width, depth, relation, policy,
                                max_new_tokens, seed)
        verifier = check(spec)
        questions = parse_workload(workload).questions
        with progress_to(dim):
            opened = open_decoder(spec)
            decoder, target_backend = opened.engine, opened.target
            prompts = [target_backend.chat_prompt(messages_for(q, 0, [])) for q in questions]
            err.print(f"calibrating {proposer} (width {width}, depth {depth}, verifier {verifier}) on {len(prompts)} prompts")
            counts = run_calibration(decoder, prompts, width, depth)
        provenance = calibration_provenance(decoder, counts, workload, prompts, getattr(target_backend, "n_threads", threads))
        profile = profile_from_counts(counts, provenance)
        manifest = profile.save(out)
    except (DraftwiseError, OSError) as exc:
        _fail(str(exc))
        return
    table = Table("depth", "reached", *[f"p{j}" for j in range(width)], "none selected")
    for k, row in enumerate(profile.p):
        table.add_row(str(k + 1), str(counts.reached[k]), *[f"{x:.3f}" for x in row], f"{1 - sum(row):.3f}")
    Console().print(table)
    Console().print(f"{counts.rounds} rounds; proposer cost per depth {counts.draft_step_seconds * 1e3:.2f} ms; "
                    f"saved {out} (manifest {manifest.hash[:12]}…)")


@tree_app.command("optimize")
def optimize(
    acceptance: Path = typer.Option(..., help="Acceptance artifact from `draftwise calibrate`."),
    profile: Path = typer.Option(..., help="Verify-cost profile from `draftwise profile`."),
    draft_cost: Optional[float] = typer.Option(None, help="c per depth in plain-step units (default: measured)."),
    draft_profile: Optional[Path] = typer.Option(
        None, help="The draft model's own verify profile (`draftwise profile --target DRAFT --chain`): "
                   "price drafting forward by forward instead of a flat c per depth."),
    draft_catch_up: Optional[Path] = typer.Option(
        None, help="The draft's extend profile (`draftwise profile --target DRAFT --extend`) for its catch-up "
                   "over each round's published tokens (default: --draft-profile's verify times)."),
    max_nodes: int = typer.Option(32, help="Largest tree, root included."),
    max_depth: int = typer.Option(8, help="Deepest tree."),
    out: Path = typer.Option(..., help="Directory for the tree artifact."),
) -> None:
    """Pick (n, d) and the Sequoia tree with the least predicted time per committed token."""
    from draftwise.artifacts import check_out
    from draftwise.optimize.select import ARTIFACT_KIND, FLAT_DRAFT_MODEL, optimize_from_artifacts

    try:
        check_out(out, ARTIFACT_KIND)  # before the inputs are read and the search runs
        choice, manifest = optimize_from_artifacts(acceptance, profile, out, max_depth=max_depth, max_nodes=max_nodes,
                                                   draft_cost=draft_cost, draft_profile_dir=draft_profile,
                                                   draft_catch_up_dir=draft_catch_up)
    except (DraftwiseError, OSError) as exc:
        _fail(str(exc))
        return
    flat = choice.draft_model == FLAT_DRAFT_MODEL
    table = Table("n", "best d", "G", "t(n)+dc" if flat else "t(n)+draft", "predicted speedup")
    for n in sorted({pt.n for pt in choice.grid}):
        points = [pt for pt in choice.grid if pt.n == n and pt.speedup is not None]
        if points:
            best = max(points, key=lambda pt: pt.speedup)
            table.add_row(str(n), str(best.d), f"{best.expected_tokens:.3f}", f"{best.time:.3f}", f"{best.speedup:.3f}")
    Console().print(table)
    Console().print(f"chosen: n={choice.n} d={choice.d} G={choice.expected_tokens:.4f} "
                    f"predicted speedup {choice.speedup:.3f} "
                    f"({f'c={choice.draft_cost:.4f}' if flat else 'draft priced by its profile'}); "
                    f"paths {list(map(list, choice.paths))}")
    Console().print(f"saved {out} (manifest {manifest.hash[:12]}…); use it with `draftwise generate --tree {out}`")
