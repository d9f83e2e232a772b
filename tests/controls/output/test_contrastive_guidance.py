"""ContrastiveGuidance, the generic form of contrastive decoding, DExperts and proxy-tuning: the mix per step against
full forwards of the second models, the nucleus and plausibility filters, batching, refusals."""

from __future__ import annotations

import math

import pytest
import torch

from steer_hydra.controls.output import ContrastiveGuidance, DExperts, MixingLogitsProcessor, ProxyTuning
from steer_hydra.controls.output.contrastive_guidance import mixed_scores, nucleus_mask
from steer_hydra.core import SteeringPipeline
from steer_hydra.models import TINY_REF, TinySpec, build_tiny_model

EXPERT = "steer_hydra:tiny?seed=1&hidden_size=32"  # the tiny tokenizer under other weights and widths
ANTI = "steer_hydra:tiny?seed=2&hidden_size=32"
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


def test_nucleus_keeps_the_smallest_set_reaching_top_p():
    log_probs = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01]]))
    assert nucleus_mask(log_probs, 0.8).tolist() == [[False, False, True, True], [False, True, True, True]]
    assert nucleus_mask(log_probs, 0.81).tolist()[0] == [False, False, False, True]


def test_mixed_scores_follow_the_weights_the_space_and_the_filters():
    base = torch.tensor([[2.0, 1.0, 0.0, -3.0]])
    expert = torch.tensor([[0.0, 3.0, 0.0, 0.0]])
    anti = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    dexperts = mixed_scores(base, [expert, anti], [2.0, -2.0])
    assert dexperts.tolist() == [[0.0, 7.0, 0.0, -3.0]]  # z + 2 (z+ - z-)
    filtered = mixed_scores(base, [expert, anti], [2.0, -2.0], top_p=0.8)
    p = torch.softmax(base, -1)[0]
    assert float(p[0]) < 0.8 <= float(p[0] + p[1])  # the nucleus at 0.8 is tokens 0 and 1
    assert filtered.tolist() == [[0.0, 7.0, -math.inf, -math.inf]]
    cd = mixed_scores(base, [expert], [-1.0], [0.5], space="log_probs", plausibility=0.2)
    want = torch.log_softmax(base, -1) - torch.log_softmax(expert / 0.5, -1)
    keep = torch.softmax(base, -1) >= 0.2 * torch.softmax(base, -1).max()
    assert torch.equal(torch.isfinite(cd), keep) and torch.allclose(cd[keep], want[keep])


def test_dexperts_step_equals_the_formula_from_the_three_models_full_forwards():
    model, tok = build_tiny_model()
    expert, _ = build_tiny_model(TinySpec(seed=1, hidden_size=32))
    anti, _ = build_tiny_model(TinySpec(seed=2, hidden_size=32))
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (mask == 0).any()
    processor = MixingLogitsProcessor([expert, anti], ids, mask, weights=[1.5, -1.5], top_p=0.9)

    def last(m, ids, full):
        with torch.no_grad():
            return m(input_ids=ids, attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp(min=0)).logits[:, -1]

    for _ in range(3):
        full = torch.cat([mask, torch.ones(ids.shape[0], ids.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
        z = last(model, ids, full)
        got = processor(ids, z.clone())
        want = z + 1.5 * (last(expert, ids, full) - last(anti, ids, full))
        outside = nucleus_mask(torch.log_softmax(z, -1), 0.9)
        assert torch.equal(torch.isinf(got), outside) and outside.any()
        assert torch.allclose(got[~outside], want[~outside], atol=1e-4)
        ids = torch.cat([ids, got.argmax(-1, keepdim=True)], 1)


def test_dexperts_batches_and_alpha_zero_is_the_base_models_greedy(make_pipeline):
    plain = make_pipeline([])
    pad = plain.tokenizer.pad_token_id
    none = make_pipeline([DExperts(expert=EXPERT, anti_expert=ANTI, alpha=0.0, top_p=None)])
    assert none.generate(text=PROMPTS, **GREEDY) == plain.generate(text=PROMPTS, **GREEDY)
    steered = make_pipeline([DExperts(expert=EXPERT, anti_expert=ANTI, alpha=4.0)])
    batched = _rows(steered.generate(text=PROMPTS, return_output=True, **GREEDY), pad)
    assert batched != _rows(plain.generate(text=PROMPTS, return_output=True, **GREEDY), pad)
    for prompt, row in zip(PROMPTS, batched, strict=True):
        assert _rows(steered.generate(text=[prompt], return_output=True, **GREEDY), pad)[0] == row
    assert steered.supports_batching and DExperts.supports_refill is False


def test_proxy_tuning_is_the_offset_of_expert_and_anti_expert_at_weight_alpha(make_pipeline):
    control = ProxyTuning(expert=EXPERT, anti_expert=ANTI)
    assert (control.models, control.weights, control.space, control.top_p) == (
        [EXPERT, ANTI],
        [1.0, -1.0],
        "logits",
        None,
    )
    generic = ContrastiveGuidance(models=[EXPERT, ANTI], weights=[1.0, -1.0])
    assert make_pipeline([control]).generate(text=PROMPTS, **GREEDY) == make_pipeline([generic]).generate(
        text=PROMPTS, **GREEDY
    )


def test_a_second_model_with_another_vocabulary_is_refused_naming_its_field(make_pipeline):
    pipeline = make_pipeline([DExperts(expert=EXPERT, anti_expert="steer_hydra:tiny?vocab_size=512")], steer=False)
    with pytest.raises(ValueError, match=r"DExperts.anti_expert=.*scores \d+ tokens.*Fix: set anti_expert"):
        pipeline.steer()
    assert not pipeline.is_steered


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (ContrastiveGuidance, {"models": [], "weights": []}, r"ContrastiveGuidance.models is empty. Fix"),
        (ContrastiveGuidance, {"models": [EXPERT], "weights": [1.0, 2.0]}, r"weights has 2 entries for 1 models"),
        (
            ContrastiveGuidance,
            {"models": [" "], "weights": [1.0]},
            r"ContrastiveGuidance.models\[0\] must name a model",
        ),
        (
            ContrastiveGuidance,
            {"models": [EXPERT], "weights": [1.0], "temperatures": [0.0]},
            r"temperatures must be finite numbers > 0",
        ),
        (ContrastiveGuidance, {"models": [EXPERT], "weights": [1.0], "plausibility": 0.0}, r"plausibility must be in"),
        (DExperts, {"expert": EXPERT, "anti_expert": ANTI, "top_p": 1.5}, r"DExperts.top_p must be in \(0, 1\]"),
        (DExperts, {"expert": EXPERT, "anti_expert": ""}, r"DExperts.anti_expert must name a model"),
        (
            ProxyTuning,
            {"expert": EXPERT, "anti_expert": ANTI, "alpha": math.inf},
            r"ProxyTuning.alpha must be a finite number; got inf",
        ),
    ],
)
def test_invalid_args_are_refused(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


@pytest.mark.parametrize(
    "control", [DExperts(expert=EXPERT, anti_expert=ANTI), ProxyTuning(expert=EXPERT, anti_expert=ANTI)]
)
def test_check_refuses_vllm_naming_the_fix(control):
    (failure,) = SteeringPipeline(TINY_REF, controls=[control], backend="vllm").check().failures
    assert "in_process_torch" in failure.message and "Fix: use backend=huggingface" in failure.message
    assert SteeringPipeline(TINY_REF, controls=[control]).check().ok
