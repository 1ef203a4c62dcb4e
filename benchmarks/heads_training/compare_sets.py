"""Per-depth validation accuracy of several head sets on ONE hidden-state cache's validation split.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/heads_training/compare_sets.py --stream WORK/stream \
        [--json RUN/compare.json] NAME=HEADS_DIR ... > RUN/compare.md

Each set's manifest records the accuracy on the validation split it was trained beside; sets
trained on different caches are only comparable on the same conversations, which this script
scores: teacher-forced paths, top-1 / top-5 per depth, a label outside a set's draft vocabulary
counts as a miss (the `evaluate` of training, so a set scored on its own cache reproduces its
manifest's figures).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from draftwise.measure.load import load_backend
from draftwise.heads.arch import DraftVocab
from draftwise.heads.artifact import load_heads
from draftwise.training.hidden_cache import load_stream
from draftwise.training.train import Rows, coverage, evaluate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", type=Path, required=True, help="a hidden-state cache (WORK/stream)")
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("sets", nargs="+", help="NAME=HEADS_DIR")
    args = parser.parse_args()
    stream = load_stream(args.stream)
    validation = stream.subset("validation")
    target = load_backend(args.target, "transformers")
    lm_head = target.model.get_output_embeddings().weight.detach().float()  # [V, d]
    embed = target.model.get_input_embeddings().weight.detach().float()  # [V, d]
    results = {}
    for item in args.sets:
        name, _, directory = item.partition("=")
        head_set = load_heads(Path(directory))
        head_set.check_target(target.info.checkpoint, target.info.tokenizer_hash)
        vocab = DraftVocab(lm_head, head_set.token_map)
        rows = Rows(validation, head_set.arch, vocab.index_of())
        with torch.inference_mode():
            scores = evaluate(head_set.heads, vocab, embed if head_set.arch.dependent else None, rows)
        data = head_set.provenance.get("data", {})
        results[name] = {"heads": str(directory), "family": head_set.arch.family, "layers": head_set.arch.layers,
                         "trained_on_tokens": data.get("tokens"), "trained_on_labels": data.get("label_tokens"),
                         "coverage": coverage(validation, head_set.token_map), "rows": len(rows.anchors[1]),
                         **scores}
        print(f"{name}: {scores}", file=sys.stderr)
    record = {"stream": str(args.stream), "stream_manifest": stream.manifest_hash,
              "validation_segments": int(len(validation.split["validation"])),
              "validation_tokens": int(len(validation.tokens)), "sets": results}
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    fmt = lambda xs: " / ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    print(f"Validation: {record['validation_segments']} conversations, {record['validation_tokens']} tokens "
          f"(cache {stream.manifest_hash[:12]}).\n")
    print("| set | trained on (tokens / labels) | top-1 by depth | top-5 by depth | draft-vocabulary coverage |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['trained_on_tokens']:,} / {r['trained_on_labels']:,} | {fmt(r['top1'])} | "
              f"{fmt(r['top5'])} | {r['coverage']:.3f} |")


if __name__ == "__main__":
    main()
