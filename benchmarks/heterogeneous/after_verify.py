"""What a many-row verify leaves to the one-row steps after it, on a backend: plain steps timed
by how many steps ago the last verify of ROWS candidate rows (all rejected) ran.

On llama.cpp the first one-row step after a many-row verify rebuilds its compute graph for the
one-row shape, and the next few are slower too: a cost of speculation that its own rounds do not
see, and that a plain exploration (which always follows a speculative round) would count as
plain's.  `DoNoHarm._charge_switch` gives it back to speculation.

Usage: python benchmarks/heterogeneous/after_verify.py [BACKEND=llamacpp] [ROWS=10] [EVERY=10] [REPEATS=3]
"""

from __future__ import annotations

import statistics
import sys
import time

from draftwise.api import open_decoder
from draftwise.measure.profile import chain_round

PROMPT = ("Solve: a train leaves at 3pm going 60 mph; another leaves at 4pm going 80 mph. "
          "When does the second catch up?")


def steps_after_verify(target, prompt: list[int], rows: int, every: int, steps: int = 160) -> dict[int, list[float]]:
    """Seconds of each plain step, keyed by steps since the last many-row verify (5: five or more;
    no verify at all when `every` is 0)."""
    target.reset()
    target.verify(prompt[-1], None, prompt[:-1])
    target.commit([])
    token, since, by_distance = 5, 99, {}
    for step in range(steps):
        position = len(prompt) + step  # the pending token's
        if every and step % every == 0:
            target.verify(token, chain_round(position + 1, rows, target.info.vocab_size))
            target.commit([])  # every candidate rejected: only the pending row stays
            since = 0
        else:
            since += 1
            start = time.perf_counter()
            target.verify(token, None)
            target.commit([])
            by_distance.setdefault(min(since, 5), []).append(time.perf_counter() - start)
        token = (token * 7 + 3) % 40000
    return by_distance


def main(backend: str = "llamacpp", rows: int = 10, every: int = 10, repeats: int = 3) -> None:
    decoder = open_decoder(proposer="none", target="smollm2-135m", backend=backend)
    prompt = decoder.prompt_ids(PROMPT, chat=True)
    print(f"{backend}: one-row steps (median ms) by steps since a verify of {rows} candidate rows, every {every} steps")
    for repeat in range(repeats):
        for label, period in (("never", 0), (f"every {every}", every)):
            measured = steps_after_verify(decoder.target, prompt, rows, period)
            cells = ", ".join(f"{'>=5' if k == 5 else k}: {statistics.median(v) * 1e3:.2f}"
                              for k, v in sorted(measured.items()))
            print(f"  repeat {repeat + 1}, {label:>9s}: {cells}")


if __name__ == "__main__":
    main(*(int(a) if i else a for i, a in enumerate(sys.argv[1:])))
