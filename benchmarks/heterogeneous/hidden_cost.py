"""What tracking the target's hidden states costs a one-row decode step of the embedded model on
transformers (the heads read the last row's; Hydra++'s prefix layer keeps every committed row's):
48 steps per mode, the median of steps 9-48, modes interleaved within each repeat.

Usage: python benchmarks/heterogeneous/hidden_cost.py [REPEATS=6]
"""

from __future__ import annotations

import statistics
import sys
import time

from draftwise.measure.load import load_backend

MODES = {"off": (False, False), "hidden": (True, False), "context": (True, True)}  # (track_hidden, track_context)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    backend = load_backend("smollm2-135m", "transformers", 2)
    prompt = backend.chat_prompt([{"role": "user", "content": "Explain the water cycle in detail."}])
    medians: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(repeats):
        for mode, (hidden, context) in MODES.items():
            backend.track_context(context)
            backend.track_hidden(hidden)
            backend.reset()
            token = int(backend.extend(list(prompt)).argmax()[-1])
            steps = []
            for _ in range(48):
                started = time.perf_counter()
                logits = backend.verify(token, None)
                backend.commit(())
                steps.append(time.perf_counter() - started)
                token = int(logits.argmax()[-1])
            medians[mode].append(statistics.median(steps[8:]) * 1e3)
    for mode, values in medians.items():
        print(f"{mode:8s} median step {statistics.median(values):.2f} ms (repeats {min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    main()
