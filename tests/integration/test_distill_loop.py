"""Self-distillation's own greedy loop against transformers' `generate` on a tiny Llama: the
same answers (an eos in the vocabulary ends some early, so samples leave the batch at
different steps) and the same final-norm states; chunks resume by key, groups batch apart."""

from __future__ import annotations

import torch

from draftwise.training.distill import distill_chunks, generate_greedy

from tests.helpers import assert_rows_close
from tests.integration.tiny_models import tiny_backend

PROMPTS = [[1, 2, 3], [4, 6, 7, 1, 2, 3], [7], [3, 3, 3, 3], [7, 1], [2, 6, 4, 4, 4, 4, 4, 1]]
EOS = frozenset({0, 5})


def reference(model, prompt, max_new):
    """`generate` on one unpadded prompt: answer (cut after the first eos) and its fed states."""
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                             output_hidden_states=True, return_dict_in_generate=True, pad_token_id=0,
                             eos_token_id=sorted(EOS))
    answer = []
    for token in out.sequences[0, len(prompt):].tolist():
        answer.append(token)
        if token in EOS:
            break
    rows = [out.hidden_states[0][-1][0]] + [out.hidden_states[s][-1][0, -1:] for s in range(1, len(answer))]
    return answer, torch.cat(rows)  # [P + len(answer) - 1, d]


def test_the_loop_matches_generate():
    model = tiny_backend(5).model
    got = generate_greedy(PROMPTS, model, EOS, 12)
    lengths = set()
    for prompt, (answer, hidden) in zip(PROMPTS, got):
        want, rows = reference(model, prompt, 12)
        assert answer == want
        lengths.add(len(answer))
        assert hidden.dtype == torch.bfloat16 and hidden.shape[0] == len(prompt) + len(answer)
        # both sides are fp32 states of another kernel order (a padded batch against one prompt), each
        # rounded once to bfloat16: they part by at most one bfloat16 ulp of the row's scale, plus fp32 rounding
        assert_rows_close(hidden[:-1], rows.to(torch.bfloat16), "kept states", factor=2)
        assert not hidden[-1].any()  # the last answer token is never fed
    assert len(lengths) > 1  # some samples stopped early


def test_chunks_resume_and_groups_batch_apart(tmp_path):
    model = tiny_backend(5).model
    groups = [range(0, 2), range(2, 6)]
    first = distill_chunks(PROMPTS, model, EOS, 8, 3, tmp_path, groups)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk-0000.safetensors", "chunk-0001.safetensors",
                                                          "chunk-0002.safetensors"]
    again = distill_chunks(PROMPTS, None, EOS, 8, 3, tmp_path, groups)  # every chunk read back: no model needed
    assert [a for a, _ in again] == [a for a, _ in first]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(first, again))
