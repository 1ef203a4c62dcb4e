"""The full negotiation matrix: every verifier against every semantics x relation x topology,
accepted or refused exactly as DESIGN.md's table says."""

import itertools

import pytest

from draftwise.runtime.contracts import ProbabilitySemantics as S, ProposerContract, SamplingRelation as R, TopologyKind as T
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.verify.base import IncompatibleVerifier, bind
from draftwise.verify.registry import VERIFIERS, auto_verifier_name

GREEDY = SamplingPolicy()
SAMPLED = SamplingPolicy(temperature=1.0)


def table_says(name: str, c: ProposerContract, policy: SamplingPolicy, exact: bool = True) -> bool:
    normalized = c.semantics is S.NORMALIZED_CONDITIONAL
    if name == "greedy":
        return policy.greedy
    if name == "membership":
        return True
    if name == "rejection":
        return normalized and c.relation is R.IID and c.topology is T.SEQUENCE
    if name == "specinfer":
        return normalized and c.relation is R.IID and c.topology is T.TREE
    if name == "sequoia":
        # a one-position set of without-replacement siblings is a depth-1 tree
        return normalized and c.relation is R.WITHOUT_REPLACEMENT and c.topology in (T.TREE, T.SET)
    if name == "spectr":
        return normalized and c.relation is R.IID and c.topology is T.SET
    if name == "typical":
        return (not exact) and c.topology is T.TREE
    raise AssertionError(name)


CASES = list(itertools.product(VERIFIERS, S, R, [T.SEQUENCE, T.SET, T.TREE], [GREEDY, SAMPLED], [True, False]))


@pytest.mark.parametrize("name,semantics,relation,topology,policy,exact", CASES)
def test_matrix(name, semantics, relation, topology, policy, exact):
    contract = ProposerContract(semantics, relation, topology)
    verifier = VERIFIERS[name]()
    if table_says(name, contract, policy, exact):
        assert bind(verifier, [contract], policy, exact=exact) is verifier
    else:
        with pytest.raises(IncompatibleVerifier):
            bind(verifier, [contract], policy, exact=exact)


def test_heuristic_refused_in_exact_mode_with_reason():
    c = ProposerContract(S.ABSENT, R.DETERMINISTIC_LOOKUP, T.TREE)
    with pytest.raises(IncompatibleVerifier, match="heuristic"):
        bind(VERIFIERS["typical"](), [c], SAMPLED, exact=True)


def test_single_source_verifiers_refuse_two_proposers():
    c = ProposerContract(S.NORMALIZED_CONDITIONAL, R.IID, T.TREE)
    with pytest.raises(IncompatibleVerifier, match="one proposal distribution"):
        bind(VERIFIERS["specinfer"](), [c, c], SAMPLED)
    assert bind(VERIFIERS["membership"](), [c, c], SAMPLED)


def test_frequency_never_reaches_rejection():
    c = ProposerContract(S.FREQUENCY, R.IID, T.SEQUENCE)
    with pytest.raises(IncompatibleVerifier, match="probability semantics frequency"):
        bind(VERIFIERS["rejection"](), [c], SAMPLED)


@pytest.mark.parametrize("contract,policy,expected", [
    (ProposerContract(S.ABSENT, R.DETERMINISTIC_LOOKUP, T.SEQUENCE), GREEDY, "greedy"),
    (ProposerContract(S.ABSENT, R.DETERMINISTIC_LOOKUP, T.SEQUENCE), SAMPLED, "membership"),
    (ProposerContract(S.NORMALIZED_CONDITIONAL, R.IID, T.SEQUENCE), SAMPLED, "rejection"),
    (ProposerContract(S.NORMALIZED_CONDITIONAL, R.IID, T.TREE), SAMPLED, "specinfer"),
    (ProposerContract(S.NORMALIZED_CONDITIONAL, R.WITHOUT_REPLACEMENT, T.TREE), SAMPLED, "sequoia"),
    # a sampled depth-1 draft template drawn without replacement: Sequoia, not q-blind membership
    (ProposerContract(S.NORMALIZED_CONDITIONAL, R.WITHOUT_REPLACEMENT, T.SET), SAMPLED, "sequoia"),
    (ProposerContract(S.NORMALIZED_CONDITIONAL, R.IID, T.SET), SAMPLED, "spectr"),
    (ProposerContract(S.FREQUENCY, R.DETERMINISTIC_LOOKUP, T.TREE), SAMPLED, "membership"),
])
def test_auto_choice_is_bindable(contract, policy, expected):
    name = auto_verifier_name([contract], policy)
    assert name == expected
    bind(VERIFIERS[name](), [contract], policy)
