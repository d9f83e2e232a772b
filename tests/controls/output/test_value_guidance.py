"""ValueGuidance, the generic form of RAD, FUDGE and ARGS: head values, normalization, the candidate set and masking,
FUDGE's log-probability step against full forwards, batching, refusals."""

from __future__ import annotations

import math

import pytest
import torch

from steer_hydra.controls.output import ValueGuidance, ValueGuidedProcessor
from steer_hydra.controls.output.value_guidance import ClassifierValues, head_values, normalized
from steer_hydra.core import SteeringPipeline
from steer_hydra.models import TINY_REF, TINY_REWARD_REF, build_tiny_model
from steer_hydra.models.tiny import parse_tiny_reference

REWARD = f"{TINY_REWARD_REF}?seed=3"
PROMPTS = ["hello there cat and dog", "a", "what is the capital of france"]
GREEDY = {"max_new_tokens": 6, "do_sample": False}


def _rows(outputs, pad: int) -> list[list[int]]:
    rows = []
    for output in outputs:
        row = output.output_ids[0].tolist()
        while row and row[-1] == pad:
            row.pop()
        rows.append(row)
    return rows


def test_head_values_read_the_label_as_probability_log_probability_or_logit():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    probs = torch.softmax(logits, -1)
    assert math.isclose(float(head_values(logits, None, "probability")), float(probs[0, 2]), rel_tol=1e-6)
    assert math.isclose(float(head_values(logits, 0, "log_probability")), math.log(float(probs[0, 0])), rel_tol=1e-6)
    assert float(head_values(logits, 1, "logit")) == 0.0
    single = torch.tensor([[0.5]])
    assert math.isclose(float(head_values(single, None, "log_probability")), -math.log1p(math.exp(-0.5)), rel_tol=1e-6)
    assert float(head_values(single, None, "logit")) == 0.5


def test_normalization_is_per_row_over_the_valid_candidates():
    values = torch.tensor([[1.0, 3.0, 2.0], [5.0, 5.0, 9.0]])
    valid = torch.tensor([[True, True, True], [True, True, False]])
    soft = normalized(values, valid, "softmax")
    assert torch.allclose(soft[0], torch.softmax(values[0], -1)) and soft[1].tolist() == [0.5, 0.5, 0.0]
    span = normalized(values, valid, "minmax")
    assert span[0].tolist() == [0.0, 1.0, 0.5] and span[1, :2].tolist() == [0.5, 0.5]  # all equal: 0.5
    assert torch.equal(normalized(values, valid, "none"), values)


class _Constant:
    """Candidate values given by a table over the vocabulary (value of token x = table[x])."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.calls = 0

    def __call__(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.table[candidates]


def test_candidates_masking_and_the_every_finite_token_set():
    scores = torch.tensor([[3.0, 2.0, 1.0, -math.inf, 0.0]])
    values = _Constant(torch.tensor([0.0, 1.0, 4.0, 9.0, 0.5]))
    masked = ValueGuidedProcessor(values, beta=2.0, top_k=2)(torch.tensor([[1]]), scores)
    assert masked.tolist() == [[3.0, 4.0, -math.inf, -math.inf, -math.inf]]
    kept = ValueGuidedProcessor(values, beta=2.0, top_k=2, mask_non_candidates=False)(torch.tensor([[1]]), scores)
    assert kept.tolist() == [[3.0, 4.0, 1.0, -math.inf, 0.0]]
    every = ValueGuidedProcessor(values, beta=1.0, top_k=None)(torch.tensor([[1]]), scores)
    assert every.tolist() == [[3.0, 3.0, 5.0, -math.inf, 0.5]]  # the -inf token stays -inf


def test_fudge_configuration_adds_the_classifiers_log_probability_to_each_candidate():
    model, tok = build_tiny_model()
    classifier, _ = build_tiny_model(parse_tiny_reference(REWARD))
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    values = ClassifierValues(classifier, ids, mask, label=0, kind="log_probability", batch_size=4)
    processor = ValueGuidedProcessor(values, beta=1.0, top_k=5)
    for _ in range(2):
        full = torch.cat([mask, torch.ones(ids.shape[0], ids.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp(min=0)).logits
        logits = logits[:, -1]
        got = processor(ids, logits.clone())
        top = logits.topk(5, dim=-1)
        for row in range(ids.shape[0]):
            prefix = ids[row][full[row].bool()]
            for value, token in zip(top.values[row], top.indices[row], strict=True):
                with torch.no_grad():
                    head = classifier(input_ids=torch.cat([prefix, token.view(1)]).unsqueeze(0)).logits
                want = value + torch.log_softmax(head, -1)[0, 0]
                assert math.isclose(float(got[row, token]), float(want), abs_tol=1e-4)
        assert int(torch.isfinite(got).sum()) == 5 * ids.shape[0]
        ids = torch.cat([ids, got.argmax(-1, keepdim=True)], 1)


def test_a_row_alone_equals_the_row_in_a_batch_and_guidance_changes_greedy(make_pipeline):
    control = ValueGuidance(
        value_model=REWARD, beta=3.0, top_k=8, value="logit", normalize="minmax", mask_non_candidates=False
    )
    steered, plain = make_pipeline([control]), make_pipeline([])
    pad = steered.tokenizer.pad_token_id
    assert control.uses_prefix_cache
    batched = _rows(steered.generate(text=PROMPTS, return_output=True, **GREEDY), pad)
    assert batched != _rows(plain.generate(text=PROMPTS, return_output=True, **GREEDY), pad)
    for prompt, row in zip(PROMPTS, batched, strict=True):
        assert _rows(steered.generate(text=[prompt], return_output=True, **GREEDY), pad)[0] == row
    assert steered.supports_batching and ValueGuidance.supports_refill is False
    assert steered.refill_blockers() == ["ValueGuidance runs live logits processors or stopping criteria"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"value_model": " "}, r"ValueGuidance.value_model must name a sequence classifier"),
        ({"beta": -1.0}, r"ValueGuidance.beta must be a finite number >= 0; got -1.0. Fix"),
        ({"top_k": 0}, r"ValueGuidance.top_k must be >= 1; got 0. Fix"),
        ({"label": -2}, r"ValueGuidance.label must be a class index >= 0 or None"),
        ({"value_batch_size": 0}, r"ValueGuidance.value_batch_size must be >= 1 or None"),
    ],
)
def test_invalid_args_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ValueGuidance(**{"value_model": REWARD, **kwargs})
    with pytest.raises(TypeError, match=r"ValueGuidance.value must be one of"):
        ValueGuidance(value_model=REWARD, value="reward")


def test_check_refuses_vllm_and_steer_needs_the_live_model():
    pipeline = SteeringPipeline(TINY_REF, controls=[ValueGuidance(value_model=REWARD)], backend="vllm")
    (failure,) = pipeline.check().failures
    assert failure.control == "ValueGuidance" and "Fix: use backend=huggingface" in failure.message
    with pytest.raises(RuntimeError, match=r"ValueGuidance needs the live model and its value_model.*Fix"):
        ValueGuidance(value_model=REWARD).steer(None)
    with pytest.raises(RuntimeError, match=r"Fix: call pipeline.steer\(\) first"):
        ValueGuidance(value_model=REWARD).get_logits_processors(torch.tensor([[1, 2]]), {})
