"""Oracles for the tree optimizer: a toy hardware-aware choice worked by hand, and DP == brute force.

Toy (worked by hand): h = [0.82, 0.48, 0.24] -> p = [0.82, 0.0864, 0.022464]; n = 2..8 nodes
(root included), depth <= 4, t(2..8) = [1.00, 1.03, 1.08, 1.16, 1.28, 1.43, 1.62], c = 0.09.
The best tree is the five-node chain of depth four:
    G = 1 + 0.82 + 0.82^2 + 0.82^3 + 0.82^4 = 3.49588976
    time per token = (t(5) + 4 c) / G = 1.52 / 3.49588976 = 0.43480 (speedup 2.30)
"""

from __future__ import annotations

from draftwise.optimize.acceptance import selected_child_probs
from draftwise.optimize.select import optimize_tree
from draftwise.optimize.sequoia_dp import brute_force, solve
from draftwise.oracles.registry import OracleResult, register

TOY_H = (0.82, 0.48, 0.24)
TOY_P = (0.82, 0.0864, 0.022464)  # by hand: 0.48 * 0.18, 0.24 * 0.18 * 0.52
TOY_T = dict(zip(range(2, 9), (1.00, 1.03, 1.08, 1.16, 1.28, 1.43, 1.62)))
TOY_C = 0.09
TOY_D_MAX = 4
TOY_G = 3.49588976
TOY_TIME_PER_TOKEN = 0.4348  # to 4 decimals
TOY_PATHS = ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
TOLERANCE = 1e-12

# Acceptance vectors for the exhaustive check: monotone, flat, non-monotone, depth-indexed.
BRUTE_FORCE_P = (
    (0.82, 0.0864, 0.022464),
    (0.3, 0.25, 0.2, 0.15),
    (0.2, 0.5, 0.1),
    ((0.8, 0.1, 0.05), (0.6, 0.2, 0.1), (0.3, 0.3, 0.3)),
)
BRUTE_FORCE_N, BRUTE_FORCE_D = 7, 5


@register
def hardware_tree_toy() -> OracleResult:
    """The toy above: the optimizer must pick the five-node chain with G = 3.49588976."""
    p = selected_child_probs(TOY_H)
    # the chain's G reads p[0] only: the h -> p conversion is checked against the hand values itself
    p_ok = all(abs(float(a) - b) <= TOLERANCE for a, b in zip(p, TOY_P)) and len(p) == len(TOY_P)
    choice = optimize_tree(p, TOY_T.__getitem__, TOY_C, TOY_T.keys(), TOY_D_MAX)
    shape_ok = (choice.n, choice.d, choice.paths) == (5, 4, TOY_PATHS)
    tpt_ok = round(choice.time_per_token, 4) == TOY_TIME_PER_TOKEN
    g_ok = abs(choice.expected_tokens - TOY_G) <= TOLERANCE
    return OracleResult(
        name="hardware_tree_toy",
        computed=choice.expected_tokens,
        expected=TOY_G,
        tolerance=TOLERANCE,
        passed=p_ok and shape_ok and tpt_ok and g_ok,
        detail=(f"p = {[round(float(x), 12) for x in p]} (expect {list(TOY_P)}); "
                f"chose n={choice.n} d={choice.d} paths={choice.paths}; time/token "
                f"{choice.time_per_token:.6f} (expect {TOY_TIME_PER_TOKEN}), speedup {choice.speedup:.4f}"),
    )


@register
def sequoia_dp_brute_force() -> OracleResult:
    """Sequoia's DP equals exhaustive search over all ordered trees, n <= 7, d <= 5."""
    worst, cases, feasibility_mismatch = 0.0, 0, 0
    for p in BRUTE_FORCE_P:
        table = solve(p, BRUTE_FORCE_N, BRUTE_FORCE_D)
        for n in range(1, BRUTE_FORCE_N + 1):
            for d in range(BRUTE_FORCE_D + 1):
                value, paths = brute_force(p, n, d)
                cases += 1
                if (paths is None) != (not table.feasible(n, d)):
                    feasibility_mismatch += 1
                elif paths is not None:
                    worst = max(worst, abs(table.value(n, d) - value))
    return OracleResult(
        name="sequoia_dp_brute_force",
        computed=worst,
        expected=0.0,
        tolerance=TOLERANCE,
        passed=worst <= TOLERANCE and feasibility_mismatch == 0,
        detail=f"{cases} (p, n, d) cases, max |DP - brute force| = {worst:.3g}, "
               f"{feasibility_mismatch} feasibility mismatches",
    )
