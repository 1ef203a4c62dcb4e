"""The head-family comparison read from bench summaries: families and budgets recognized from
the method configs, goal ratios at equal budgets, plots written."""

import json

from draftwise.bench.heads_report import goal_lines, read_run, write_comparison


def method(config, ms, speedup, accepted, head_ms, plain=False):
    overall = {"questions": 3, "ms_per_token": ms, "speedup": speedup, "mean_accepted": accepted,
               "acceptance_by_depth": [0.5, 0.25], "propose_ms_per_round": head_ms, "rows_verified_mean": 4.0,
               "mismatches": 0}
    return {"config": config, "backend": "transformers", "plain": plain, "overall": overall}


def summary(tmp_path):
    methods = {
        "plain": method("dw: proposer=none, backend=transformers", 50.0, 1.0, 0.0, 0.0, plain=True),
        "lookup-gate": method("dw: proposer=prompt-lookup, gate=auto", 40.0, 1.25, 0.6, 0.1),
        "medusa-n8": method("dw: proposer=medusa, tree=auto, tree_nodes=8", 48.0, 1.04, 0.40, 1.0),
        "hydra-n8": method("dw: proposer=hydra, tree=auto, tree_nodes=8", 45.0, 1.11, 0.50, 2.0),
        "hydrapp-n8": method("dw: proposer=hydra++, tree=auto, tree_nodes=8", 44.0, 1.14, 0.60, 3.0),
        "clover-n8": method("dw: proposer=clover, tree=auto, tree_nodes=8", 38.0, 1.32, 0.55, 1.5),
        "clover-n4": method("dw: proposer=clover, tree=[[0], [1], [0, 0]], relation=beam", 41.0, 1.22, 0.45, 1.2),
        "clover-n5": method("dw: proposer=clover, tree=chain:4, relation=beam", 42.0, 1.19, 0.40, 1.1),
        "medusa-auto": method("dw: proposer=medusa, tree=auto", 47.0, 1.06, 0.2, 1.0),
        "hydra-auto": method("dw: proposer=hydra, tree=auto", 40.0, 1.25, 0.3, 1.2),
        "hydra-chain": method("dw: proposer=hydra, relation=beam", 60.0, 0.8, 0.3, 1.2),
        "not-run": {"config": "dw: proposer=hydra, tree_nodes=16", "plain": False, "overall": {"questions": 0}},
    }
    return write_summary(tmp_path, {"settings": {"temperature": 1.0, "target": "tiny"}, "methods": methods})


def write_summary(directory, body):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(body))
    return directory


def test_families_budgets_and_goals_are_read_from_the_summary(tmp_path):
    run = read_run(summary(tmp_path))
    # tree=auto at its default budget is read as budget None (after the fixed budgets); a chain is not a tree
    assert [(r.family, r.nodes) for r in run.rows] == [("medusa", 8), ("medusa", None), ("hydra", 8),
                                                      ("hydra", None), ("hydra++", 8),
                                                      ("clover", 4), ("clover", 5),
                                                      ("clover", 8)]
    assert run.plain_ms_per_token == 50.0 and run.lookup_speedup == 1.25 and run.backend == "transformers"
    goals = goal_lines(run)
    n8 = next(g for g in goals if g.startswith("n=8:"))
    assert "Hydra++/Hydra accepted 1.20x" in n8
    assert "Clover accepted 0.55 vs Hydra 0.50" in n8 and "at head cost 1.50 vs Hydra++ 3.00" in n8
    assert "fastest family clover is 1.26x Medusa's" in n8
    assert goals[-1].startswith("overall fastest: clover-n8, 1.32x plain")
    assert not any(g.startswith("n=4:") and "Hydra++" in g for g in goals)  # no equal-budget pair at n=4
    auto = next(g for g in goals if g.startswith("n=auto (each family's own tree):"))
    assert "fastest family hydra is 1.18x Medusa's" in auto and "Hydra++/Hydra" not in auto


def test_the_comparison_writes_a_table_and_two_plots_per_run(tmp_path):
    run = read_run(summary(tmp_path / "run"))
    page = write_comparison([run], tmp_path / "out")
    text = page.read_text()
    assert "| clover | 8 | 38.0 | 1.32 | 0.55 | 0.50 / 0.25 | 1.50 | 4.0 | 0 |" in text
    assert "| hydra | auto | 40.0 | 1.25 | 0.30 |" in text
    # named by the run's directory: two machines' runs of one backend and temperature keep their own plots
    assert (tmp_path / "out" / "accepted_vs_head_cost_run.png").stat().st_size > 1000
    assert (tmp_path / "out" / "speedup_vs_tree_size_run.png").stat().st_size > 1000


def test_a_run_of_auto_trees_only_gets_its_table_but_no_budget_plots(tmp_path):
    body = {"settings": {"temperature": 1.0, "target": "tiny"}, "methods": {
        "plain": method("dw: proposer=none", 50.0, 1.0, 0.0, 0.0, plain=True),
        "hydra-auto": method("dw: proposer=hydra, tree=auto", 40.0, 1.25, 0.3, 1.2)}}
    body["methods"]["hydra-auto"]["overall"]["mismatches"] = None  # sampled: no token reference
    text = write_comparison([read_run(write_summary(tmp_path / "auto", body))], tmp_path / "out").read_text()
    assert "| hydra | auto | 40.0 | 1.25 | 0.30 | 0.50 / 0.25 | 1.20 | 4.0 | – |" in text
    assert not list((tmp_path / "out").glob("*.png")) and "![" not in text


def test_auto_trees_that_all_fell_back_to_plain_decoding_get_no_goal_ratios(tmp_path):
    body = {"settings": {"temperature": 0.0, "target": "tiny"}, "methods": {
        "plain": method("dw: proposer=none", 50.0, 1.0, 0.0, 0.0, plain=True),
        **{f"{f}-auto": method(f"dw: proposer={f}, tree=auto", 50.0, 1.0, 0.0, 0.0) for f in
           ("medusa", "hydra", "hydra++", "clover")}}}
    for row in body["methods"].values():
        row["overall"]["rows_verified_mean"] = 1.0
    goals = goal_lines(read_run(write_summary(tmp_path / "auto", body)))
    assert goals[0] == "n=auto: no family's auto tree drafts on this hardware (each ran as plain decoding)"
    assert not any("Clover accepted" in g or "Medusa's time" in g for g in goals)
    # one family drafting is enough for the ratios to be written
    body["methods"]["hydra-auto"]["overall"]["rows_verified_mean"] = 2.0
    assert "Clover accepted" in goal_lines(read_run(write_summary(tmp_path / "auto", body)))[0]
