"""`--proposer auto`: the replay reproduces the engine's rounds on the embedded model (greedy,
prompt lookup chains and trees, with and without the gate, a draft chain), and the choice
follows the measured cost: plain decoding where every wider round costs 100 plain steps,
prompt lookup where rows are free.  Artifacts are measured once, reused, and measured again
when tampered with."""

import pytest

from draftwise.logs import progress_to
from draftwise.spec import GateProfile
from tests.helpers import make_spec
from draftwise.runtime.round import GenerationConfig
from draftwise.runtime.decoder import SpeculativeDecoder
from draftwise.runtime.gate import CostGateConfig
from draftwise.optimize.auto import AutoTreeConfig, auto_gate_directory
from draftwise.optimize.auto_proposer import choose_proposer
from draftwise.runtime.cost_profile import VerifyCostProfile
from draftwise.optimize.replay import replay, trace_from_records
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer
from draftwise.proposers.prompt_lookup import PromptLookupConfig, PromptLookupProposer
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.registry import make_verifier
from tests.integration.tiny_models import tiny_backend

NEW = 24
STEEP = [1.0] + [3.3] * 64  # this CPU's transformers shape: one row cheap, every wider round ~3.3 steps


def profile(relative, model="smollm2-135m"):
    return VerifyCostProfile(rows=tuple(range(1, len(relative) + 1)), relative=tuple(relative), absolute_s=None,
                             model=model, backend="transformers", threads=2, machine="test")


def shape(records):
    return [(r.nodes, r.accepted, r.emitted, r.gated) for r in records]


@pytest.fixture(scope="module")
def traces(smol_target, spec_bench_prompts):
    out = []
    for text in spec_bench_prompts[:3]:
        prompt = smol_target.chat_prompt([{"role": "user", "content": text}])
        plain = SpeculativeDecoder(smol_target, [], make_verifier("auto", [], SamplingPolicy()),
                                   GenerationConfig(max_new_tokens=NEW)).generate(prompt)
        out.append(trace_from_records(prompt, plain.tokens, [sum(r.seconds.values()) for r in plain.records]))
    return out


@pytest.mark.model
@pytest.mark.parametrize("candidates,relative", [(1, None), (4, None), (1, STEEP), (4, STEEP)])
def test_the_replay_is_the_engines_rounds_for_prompt_lookup(smol_target, traces, candidates, relative):
    gate = None if relative is None else CostGateConfig(profile(relative))
    config = GenerationConfig(max_new_tokens=NEW, gate=gate)
    lookup = PromptLookupConfig(max_candidates=candidates)
    gated = 0
    for trace in traces:
        proposer = PromptLookupProposer(lookup)
        result = SpeculativeDecoder(smol_target, [proposer], make_verifier("auto", [proposer.contract], config.policy),
                                    config).generate(list(trace.prompt))
        assert result.tokens == trace.tokens
        replayed = replay(trace, PromptLookupProposer(lookup), max_new_tokens=NEW, limits=config.limits,
                          context_length=smol_target.info.context_length, gate=gate)
        assert shape(replayed) == shape(result.records)
        gated += sum(r.gated for r in replayed)
    assert (gated > 0) == (relative is not None)  # the steep profile made the gate cut somewhere


@pytest.mark.model
def test_the_replay_is_the_engines_rounds_for_a_greedy_draft_chain(smol_target, smol_draft, traces):
    config = GenerationConfig(max_new_tokens=NEW)
    draft = DraftConfig(k=4)
    trace = traces[0]
    proposer = DraftModelProposer(smol_draft, smol_target.info.tokenizer_hash, draft)
    result = SpeculativeDecoder(smol_target, [proposer], make_verifier("auto", [proposer.contract], config.policy),
                                config).generate(list(trace.prompt))
    replayed = replay(trace, DraftModelProposer(smol_draft, smol_target.info.tokenizer_hash, draft),
                      max_new_tokens=NEW, limits=config.limits, context_length=smol_target.info.context_length)
    assert shape(replayed) == shape(result.records)
    assert all(r.propose_s > 0 for r in replayed[:-1])  # the draft's own time is measured, not modelled


@pytest.mark.model
@pytest.mark.parametrize("relative", [None, STEEP])
def test_the_replay_is_the_engines_rounds_for_rest_trees(smol_target, traces, relative, tmp_path):
    from draftwise.proposers.retrieval.index import build_from_token_documents
    from draftwise.proposers.retrieval.proposer import RestProposer

    # a datastore holding the answers themselves: deep tries, taken in part
    build_from_token_documents([list(t.tokens) for t in traces], tmp_path / "idx", smol_target.info.vocab_size,
                               smol_target.info.tokenizer_hash)
    proposer = RestProposer.open(tmp_path / "idx", smol_target.info.tokenizer_hash)
    gate = None if relative is None else CostGateConfig(profile(relative))
    config = GenerationConfig(max_new_tokens=NEW, gate=gate)
    for trace in traces[:2]:
        result = SpeculativeDecoder(smol_target, [proposer], make_verifier("auto", [proposer.contract], config.policy),
                                    config).generate(list(trace.prompt))
        replayed = replay(trace, proposer, max_new_tokens=NEW, limits=config.limits,
                          context_length=smol_target.info.context_length, gate=gate)
        assert shape(replayed) == shape(result.records) and max(r.nodes for r in replayed) > 1


@pytest.mark.parametrize("candidates,relative", [(1, None), (3, None), (3, STEEP)])
def test_the_replay_is_the_engines_rounds_on_a_tiny_model(candidates, relative):
    # the model-free counterpart of the tests above: a real target, not the trace backend,
    # decides the engine's rounds, so a trace backend predicting any row wrongly shows here
    target = tiny_backend(0)
    gate = None if relative is None else CostGateConfig(profile(relative, model=target.info.checkpoint))
    config = GenerationConfig(max_new_tokens=24, gate=gate)
    lookup = PromptLookupConfig(max_candidates=candidates)
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7, 4, 5], [3]):
        plain = SpeculativeDecoder(target, [], make_verifier("auto", [], config.policy),
                                   GenerationConfig(max_new_tokens=24)).generate(prompt)
        trace = trace_from_records(prompt, plain.tokens, [sum(r.seconds.values()) for r in plain.records])
        proposer = PromptLookupProposer(lookup)
        result = SpeculativeDecoder(target, [proposer], make_verifier("auto", [proposer.contract], config.policy),
                                    config).generate(prompt)
        assert result.tokens == trace.tokens
        replayed = replay(trace, PromptLookupProposer(lookup), max_new_tokens=24, limits=config.limits,
                          context_length=target.info.context_length, gate=gate)
        assert shape(replayed) == shape(result.records)
        assert sum(r.accepted for r in replayed) > 0 or prompt == [3]


CONFIG = AutoTreeConfig(profile_prefix_len=16, profile_repeats=1)
PROMPTS = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 6, 7, 4, 5]]
SPEC = make_spec(GenerationConfig(max_new_tokens=24), proposer="auto")


def choose(target, cache, spec=SPEC, draft=None):
    messages: list[str] = []
    with progress_to(messages.append):
        choice = choose_proposer(spec, target, draft, PROMPTS, cache, trace_tokens=24, profile_config=CONFIG)
    return choice, " ".join(messages)


def test_auto_proposer_measures_once_reuses_and_remeasures_what_was_tampered_with(tmp_path):
    target = tiny_backend(0)
    first, log = choose(target, tmp_path)
    assert "plain trace" in log and "measuring" in log
    assert [s.name for s in first.scores if s.name == "plain"] == ["plain"]
    assert {s.name for s in first.scores} == {"plain", "prompt-lookup", "prompt-lookup+gate"}
    assert first.spec.proposer in ("none", "prompt-lookup") and first.chosen == first.scores[0].name
    assert first.scores[0].seconds_per_token == min(s.seconds_per_token for s in first.scores)

    again, log = choose(target, tmp_path)
    assert "plain trace" not in log and "measuring" not in log
    assert again.traces_directory == first.traces_directory

    data = first.traces_directory / "traces.json"
    data.write_text(data.read_text().replace("[", "[ ", 1))  # same JSON, different bytes: not trusted
    _, log = choose(target, tmp_path)
    assert "plain trace" in log and "measuring" not in log

    sampled, log = choose(target, tmp_path, make_spec(GenerationConfig(policy=SamplingPolicy(temperature=1.0)), proposer="auto"),
                          draft=tiny_backend(1))
    assert "plain trace" in log and sampled.traces_directory != first.traces_directory
    # said, with the reason, not dropped (the self-drafters: sampled chains verified by rejection;
    # the head families: no heads ship for this tiny model)
    reasons = dict(sampled.skipped)
    assert set(reasons) == {"draft-model", "layer-skip", "kangaroo", "medusa", "hydra", "hydra++", "clover"}
    assert all("heads ship for" in reasons[f] for f in ("medusa", "hydra", "hydra++", "clover"))


@pytest.mark.parametrize("relative,expected", [([1.0] + [100.0] * 10, {"plain"}),
                                               ([1.0] * 11, {"prompt-lookup", "prompt-lookup+gate"})])
def test_the_choice_follows_the_verify_cost(tmp_path, relative, expected):
    target = tiny_backend(0)
    directory = auto_gate_directory(target, 11, tmp_path, CONFIG, chain=True)  # prompt lookup: 10-token chains
    profile(relative, model=target.info.checkpoint).save(directory)
    choice, log = choose(target, tmp_path)
    assert "measuring" not in log  # the hand-written profile was used
    assert choice.chosen in expected, choice.table()
    plain = next(s for s in choice.scores if s.name == "plain")
    assert plain.speedup == 1.0 and plain.mean_accepted == 0.0
    if choice.chosen != "plain":
        assert choice.scores[0].speedup > 1.0 and choice.scores[0].mean_accepted > 0
        if choice.chosen.endswith("+gate"):
            assert choice.spec.gate == GateProfile(directory)  # the chosen gate reads the profile it was predicted with


def test_auto_replays_a_union_of_prompt_lookup_and_the_draft_model(tmp_path):
    """With a draft model under greedy decoding, `auto` also replays the heterogeneous round
    prompt-lookup+draft-model; its replay accepts at least what the draft alone accepts where
    the sources' rows are merged (the union's tree holds the draft's chain)."""
    spec = make_spec(GenerationConfig(max_new_tokens=24), proposer="auto", draft="tiny")
    choice, _ = choose(tiny_backend(0), tmp_path, spec, draft=tiny_backend(0))  # the target as its own draft
    scores = {s.name: s for s in choice.scores}
    assert {"draft-model", "prompt-lookup+draft-model"} <= set(scores), choice.table()
    assert scores["prompt-lookup+draft-model"].mean_accepted >= scores["draft-model"].mean_accepted


def test_auto_puts_its_choice_behind_the_guard_unless_told_otherwise(tmp_path):
    from dataclasses import replace as _replace

    from draftwise.spec import Guard

    target = tiny_backend(0)
    directory = auto_gate_directory(target, 11, tmp_path, CONFIG, chain=True)
    profile([1.0] * 11, model=target.info.checkpoint).save(directory)  # rows free: lookup is chosen
    choice, _ = choose(target, tmp_path)
    assert choice.spec.drafter is not None and choice.spec.guard is Guard.ON
    assert "do-no-harm guard" in choice.table()
    off, _ = choose(target, tmp_path, _replace(SPEC, guard=Guard.OFF))
    assert off.spec.guard is Guard.OFF


HEAD_TREE = ((0,), (1,), (0, 0), (1, 0), (0, 0, 0))  # wide enough that near-miss orderings would show


def heads_proposer(family, backend):
    from draftwise.proposers.family import DrafterResources
    from draftwise.proposers.heads import HeadsConfig
    from draftwise.proposers.registry import DRAFTERS
    from draftwise.topology.templates import from_paths
    from draftwise.topology.tree_spec import TreeTemplate

    return DRAFTERS.get(family).make(HeadsConfig(tree=TreeTemplate(from_paths(HEAD_TREE))), DrafterResources(backend))


@pytest.mark.model
@pytest.mark.parametrize("family", ["hydra", "hydra++"])  # the frontier state alone; a layer over the whole context
def test_the_replay_is_the_engines_rounds_for_draft_heads_on_the_targets_recorded_states(smol_target, traces, family,
                                                                                        tmp_path):
    """The shipped heads, replayed on the states recorded along each trace, run the rounds they
    run on the target; states one position off (a planted fault) do not."""
    import numpy as np

    from draftwise.optimize.replay import trace_eos
    from draftwise.optimize.trace_backend import HiddenTraceBackend
    from draftwise.optimize.trace_hidden import ensure_hidden

    config = GenerationConfig(max_new_tokens=NEW)
    recorded = ensure_hidden(smol_target, traces, {"test": family}, tmp_path / "hidden")
    weights = smol_target.token_weights()
    shifted = 0
    for trace, hidden in zip(traces, recorded):
        proposer = heads_proposer(family, smol_target)
        result = SpeculativeDecoder(smol_target, [proposer], make_verifier("auto", [proposer.contract], config.policy),
                                    config).generate(list(trace.prompt))
        assert result.tokens == trace.tokens

        def replayed(states, trace=trace, first=hidden.first):
            stand_in = HiddenTraceBackend(trace.prompt, trace.tokens, smol_target.info.context_length,
                                          trace_eos(trace, NEW), target=smol_target.info, hidden=states,
                                          first=first, weights=weights)
            return replay(trace, heads_proposer(family, stand_in), max_new_tokens=NEW, limits=config.limits,
                          context_length=smol_target.info.context_length, target=stand_in)

        rounds = replayed(hidden.states)
        assert shape(rounds) == shape(result.records)
        assert sum(r.accepted for r in rounds) > 0 and sum(r.propose_s > 0 for r in rounds) >= len(rounds) - 1
        shifted += shape(replayed(np.roll(hidden.states, 1, axis=0))) != shape(result.records)
    assert shifted == len(traces)


@pytest.mark.model
def test_auto_plans_the_shipped_heads_tree_and_replays_it_alone_and_with_prompt_lookup(smol_target, spec_bench_prompts,
                                                                                     tmp_path):
    """The embedded model ships Hydra heads: `auto` plans their tree as `--tree auto` would (the
    same cached artifacts), replays them on recorded states, and merges them with prompt lookup."""
    from dataclasses import replace as _replace

    from draftwise.optimize.auto import auto_head_tree
    from draftwise.topology.tree_spec import TreeTemplate

    spec = make_spec(GenerationConfig(max_new_tokens=24), proposer="auto")
    spec = _replace(spec, drafter=_replace(spec.drafter, candidates=tuple(
        c for c in spec.drafter.candidates if c.family.name in ("prompt-lookup", "hydra"))))
    prompts = [smol_target.chat_prompt([{"role": "user", "content": spec_bench_prompts[0]}])]
    config = AutoTreeConfig(profile_prefix_len=64, profile_repeats=1)
    choice = choose_proposer(spec, smol_target, None, prompts, tmp_path, trace_tokens=24, profile_config=config)
    scores = {s.name: s for s in choice.scores}
    assert {"plain", "prompt-lookup", "prompt-lookup+gate"} <= set(scores), choice.table()
    if "hydra" not in scores:  # the measured profile made every tree lose: said, not dropped
        assert "chose no tree" in dict(choice.skipped)["hydra"]
        return
    assert {"prompt-lookup+hydra", "prompt-lookup+hydra+gate"} <= set(scores) and scores["hydra"].mean_accepted > 0
    hydra = next(c for c in spec.drafter.candidates if c.family.name == "hydra")
    planned = auto_head_tree(_replace(spec, drafter=hydra), smol_target, prompts, tmp_path, config)  # cached: the same
    assert (tmp_path / "trace_hidden").is_dir() and planned.choice.n > 1
    if choice.chosen in ("hydra", "prompt-lookup+hydra", "prompt-lookup+hydra+gate"):
        members = getattr(choice.spec.drafter, "members", (choice.spec.drafter,))
        tree = next(m for m in members if m.family.name == "hydra").config.tree
        assert isinstance(tree, TreeTemplate) and len(tree.paths) + 1 == planned.choice.n


def test_traces_cached_from_a_busy_hour_are_timed_again_before_they_decide(tmp_path):
    """A trace set whose plain step disagrees with the verify profile's one-row step (one was timed
    while something else ran, and cached) is not trusted: the traces are timed again."""
    import json

    from draftwise.artifacts import write_manifest
    from draftwise.optimize.auto_proposer import TRACES_FILE, TRACES_KIND, steps_agree
    from draftwise.optimize.replay import Trace

    target = tiny_backend(0)
    first, _ = choose(target, tmp_path)
    data = first.traces_directory / TRACES_FILE
    body = json.loads(data.read_text())
    for trace in body["traces"]:
        trace["step_s"] = 0.5  # a 500 ms step: a tiny model's is a millisecond or two
    data.write_text(json.dumps(body))
    key = json.loads((first.traces_directory / "manifest.json").read_text())["provenance"]
    write_manifest(first.traces_directory, TRACES_KIND, key)  # a valid artifact, only timed on a busy machine
    again, log = choose(target, tmp_path)
    assert "timed again" in log and "plain trace" in log
    if data.is_file():  # kept: the new timings agree with the profile
        retimed = [Trace.from_dict(t) for t in json.loads(data.read_text())["traces"]]
        assert all(t.step_s < 0.5 for t in retimed)
        assert steps_agree(retimed, VerifyCostProfile.load(again.profile_directory))
    else:  # a tiny model's millisecond steps on a machine busy right now: said, and nothing kept
        assert "machine is busy" in log

    fast = VerifyCostProfile.from_absolute([1, 2], [0.030, 0.031], model="m", backend="b", threads=2, machine="x")
    trace = Trace((1,), (2,), 0.1, 0.036)
    assert steps_agree([trace], fast)  # 36 ms against 30: context length and the engine's bookkeeping
    assert not steps_agree([Trace((1,), (2,), 0.1, 0.250)], fast)  # 7x: a busy hour
    assert not steps_agree([Trace((1,), (2,), 0.1, 0.020)], fast)  # the profile was the slow one


@pytest.mark.model
def test_a_unions_head_member_with_tree_auto_gets_the_tree_planned_for_it_alone(smol_target, tmp_path, caplog):
    """`prompt-lookup+hydra++ --set tree=auto`: the heads' tree is the one `--proposer hydra++
    --tree auto` plans (the same cached artifacts); prompt lookup is untouched.  Where the machine
    was busy while the profile was measured, that profile is not cached (by design), so the second
    plan measures again and may choose another tree: then only the union's own shape is checked."""
    from dataclasses import replace as _replace

    from draftwise.optimize.auto import auto_head_tree
    from draftwise.plan import check, resolve
    from draftwise.spec import UnionDrafter
    from draftwise.topology.tree_spec import TreeTemplate
    from draftwise.workloads import first_turn_prompts

    spec = make_spec(GenerationConfig(max_new_tokens=24), proposer="prompt-lookup+hydra++", tree="auto")
    check(spec)
    resolved, choices = resolve(spec, smol_target, cache_root=tmp_path, calibration="humaneval:0-0")
    alone = make_spec(GenerationConfig(max_new_tokens=24), proposer="hydra++", tree="auto")
    prompts = first_turn_prompts(smol_target.chat_prompt, "humaneval:0-0")
    planned = auto_head_tree(alone, smol_target, prompts, tmp_path)  # cached: nothing measured again
    assert [c.what for c in choices] == ["tree of hydra++"]
    if any("the machine was busy" in record.getMessage() for record in caplog.records):
        assert resolved.proposer == "prompt-lookup" or isinstance(resolved.drafter.members[1].config.tree, TreeTemplate)
        return
    if planned.choice.n == 1:  # no tree paid: the union is prompt lookup alone
        assert resolved.proposer == "prompt-lookup"
        return
    assert isinstance(resolved.drafter, UnionDrafter)
    lookup, heads = resolved.drafter.members
    assert lookup == spec.drafter.members[0]
    assert isinstance(heads.config.tree, TreeTemplate) and len(heads.config.tree.paths) + 1 == planned.choice.n
    assert _replace(heads.config, tree=None) == _replace(spec.drafter.members[1].config, tree=None)
