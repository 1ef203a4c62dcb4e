"""Issue 28's comparison page from `heads_compare.sh` runs:
    .venv/bin/python benchmarks/heads_families/heads_compare.py RUN_DIR [RUN_DIR ...] [--out DIR]"""

import argparse
from pathlib import Path

from draftwise.bench.heads_report import read_run, write_comparison


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "comparison")
    args = parser.parse_args()
    print(write_comparison([read_run(r) for r in args.runs], args.out))


if __name__ == "__main__":
    main()
