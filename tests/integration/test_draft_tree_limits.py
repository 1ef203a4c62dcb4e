"""The draft proposer's own limits: a tree larger than the engine's default node budget is
drafted whole and right, and a draft whose context is nearly full drafts only what fits."""

import dataclasses

import numpy as np

from draftwise.backends.transformers import TransformersBackend
from draftwise.runtime.contracts import SamplingRelation
from draftwise.topology.tree_spec import TreeTemplate
from draftwise.proposers.draft_model import DraftConfig, DraftModelProposer, fit_template
from draftwise.runtime.sampling import SamplingPolicy
from draftwise.topology.templates import cartesian
from tests.helpers import assert_probs_close
from tests.integration.tiny_models import PROMPT, V, tiny_backend


def with_context(backend: TransformersBackend, context_length: int) -> TransformersBackend:
    return TransformersBackend(backend.model, backend.tokenizer,
                               dataclasses.replace(backend.info, context_length=context_length))


def proposer(draft, **config) -> DraftModelProposer:
    if "template" in config:
        config["tree"] = TreeTemplate(config.pop("template"))
    p = DraftModelProposer(draft, draft.info.tokenizer_hash, DraftConfig(**config))
    p.begin(SamplingPolicy(temperature=1.0), np.random.default_rng(0))
    return p


def test_a_tree_of_more_than_64_nodes_gives_every_parent_its_own_distribution():
    draft = with_context(tiny_backend(1), 256)
    template = cartesian([V, V, 1])  # levels 1-2 alone hold 72 nodes, over the default budget of 64
    result = proposer(draft, template=template, relation=SamplingRelation.BEAM).propose(PROMPT, "m")
    assert len(result.nodes) == len(template) == V + V * V + V * V
    fresh = {}
    for i, node in enumerate(result.nodes):
        parent_path = () if node.parent == -1 else result.path(node.parent)
        if parent_path not in fresh:  # the draft's own next-token law after the parent's path
            draft.reset()
            fresh[parent_path] = draft.extend(PROMPT + list(parent_path)).probs(0, SamplingPolicy(temperature=1.0))
        assert_probs_close(result.distributions[node.parent], fresh[parent_path], f"node {i} at depth {node.depth}")


def test_a_nearly_full_draft_context_drafts_only_what_fits():
    room = 3  # cells past the prompt
    draft = with_context(tiny_backend(1), len(PROMPT) + room)
    tree = proposer(draft, template=cartesian([2, 2, 1]), relation=SamplingRelation.IID).propose(PROMPT, "m")
    # depth 3 would re-read the pending token and levels 1-2 (1 + 2 + 4 rows > 3 cells): cut to depth 2
    assert max(n.depth for n in tree.nodes) == 2 and len(tree.nodes) == 2 + 4
    chain = proposer(draft, k=8, confidence_threshold=0.0).propose(PROMPT, "m")
    assert len(chain.nodes) == room + 1  # k - 1 drafted tokens are held past the prompt
    full = proposer(with_context(tiny_backend(1), len(PROMPT)), template=cartesian([2, 2])).propose(PROMPT, "m")
    assert [n.depth for n in full.nodes] == [1, 1]  # one level needs only the prompt's own cells


def test_fit_template_drops_the_deepest_levels_until_the_reread_rows_fit():
    template = cartesian([2, 2, 1])
    assert fit_template(template, 6) == template  # levels 1-2: 6 rows re-read
    assert fit_template(template, 5) == cartesian([2, 2])
    assert fit_template(template, 1) == cartesian([2])
    assert fit_template(template, -1) == ()
