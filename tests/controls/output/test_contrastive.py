"""ContrastiveDecoding: the CD formula per step, the plausibility cut, batching with left padding, refusals, release."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

from steer_hydra.controls.output import ContrastiveDecoding, ContrastiveLogitsProcessor
from steer_hydra.controls.output.contrastive import contrastive_scores
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.capabilities import UnsupportedPipelineError
from steer_hydra.models import TINY_REF, TinySpec, build_tiny_model

AMATEUR = "steer_hydra:tiny?seed=1&hidden_size=32"  # another seed and width, the same tokenizer
PROMPTS = ["hello there cat and dog", "a", "what is the capital of france"]
GREEDY = {"max_new_tokens": 8, "do_sample": False}


def _ids(output, pad: int) -> list[int]:
    row = output.output_ids[0].tolist()
    while row and row[-1] == pad:
        row.pop()
    return row


def test_processor_scores_equal_the_formula_from_both_models_logits():
    expert, tok = build_tiny_model()
    amateur, _ = build_tiny_model(TinySpec(seed=1, hidden_size=32))
    batch = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (mask == 0).any()  # left padding is exercised
    processor = ContrastiveLogitsProcessor(amateur, ids, mask, alpha=0.1, amateur_temperature=0.7)
    with torch.no_grad():
        for _ in range(3):
            full_mask = torch.cat([mask, torch.ones(ids.shape[0], ids.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
            full_pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
            expert_logits = expert(input_ids=ids, attention_mask=full_mask, position_ids=full_pos).logits[:, -1]
            amateur_logits = amateur(input_ids=ids, attention_mask=full_mask, position_ids=full_pos).logits[:, -1]
            got = processor(ids, expert_logits)
            log_e = torch.log_softmax(expert_logits, -1)
            log_a = torch.log_softmax(amateur_logits / 0.7, -1)
            plausible = log_e.exp() >= 0.1 * log_e.exp().max(-1, keepdim=True).values
            want = torch.where(plausible, log_e - log_a, torch.full_like(log_e, -math.inf))
            assert torch.equal(torch.isinf(got), ~plausible)
            assert torch.allclose(got[plausible], want[plausible], atol=1e-4)
            assert not torch.allclose(got[plausible], log_e[plausible], atol=1e-3)  # the amateur term matters
            assert int(plausible.sum(-1).min()) >= 1 and int(plausible.sum(-1).max()) < log_e.shape[-1]
            next_ids = got.argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_ids], 1)


def test_plausibility_cut_and_alpha_one_keeps_only_the_argmax():
    expert = torch.tensor([[2.0, 1.0, 0.0, -5.0]])
    amateur = torch.tensor([[3.0, 0.0, -1.0, -9.0]])
    scores = contrastive_scores(expert, amateur, alpha=0.1)
    p = torch.softmax(expert, -1)
    assert torch.equal(torch.isinf(scores[0]), p[0] < 0.1 * p[0].max())
    assert int(scores.argmax()) == 1  # the expert's second choice: the amateur likes token 0 more
    only = contrastive_scores(expert, amateur, alpha=1.0)
    assert torch.isfinite(only[0]).tolist() == [True, False, False, False]


def test_greedy_differs_from_unsteered_and_a_row_alone_equals_the_same_row_in_a_batch(make_pipeline):
    steered = make_pipeline([ContrastiveDecoding(amateur=AMATEUR)])
    plain = make_pipeline([])
    pad = steered.tokenizer.pad_token_id
    batched = steered.generate(text=PROMPTS, return_output=True, **GREEDY)
    unsteered = plain.generate(text=PROMPTS, return_output=True, **GREEDY)
    assert [_ids(o, pad) for o in batched] != [_ids(o, pad) for o in unsteered]
    for prompt, in_batch in zip(PROMPTS, batched, strict=True):
        assert _ids(steered.generate(text=prompt, return_output=True, **GREEDY), pad) == _ids(in_batch, pad)
    assert steered.supports_batching is True
    assert ContrastiveDecoding.supports_refill is False
    assert steered.refill_blockers() == ["ContrastiveDecoding runs live logits processors or stopping criteria"]


def test_chat_batch_and_sampling_run(make_pipeline):
    steered = make_pipeline([ContrastiveDecoding(amateur=AMATEUR, alpha=0.2)])
    chats = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "what is the capital of france"}]]
    texts = steered.generate(messages=chats, max_new_tokens=5, do_sample=True, temperature=0.8, seed=3)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"alpha": 0.0}, r"ContrastiveDecoding.alpha must be in \(0, 1\]; got 0.0"),
        ({"alpha": 1.5}, r"ContrastiveDecoding.alpha must be in \(0, 1\]"),
        ({"alpha": float("nan")}, r"ContrastiveDecoding.alpha"),
        ({"amateur_temperature": 0}, r"ContrastiveDecoding.amateur_temperature must be a finite number > 0"),
        ({"amateur": " "}, r"ContrastiveDecoding.amateur must name a model"),
    ],
)
def test_invalid_args_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ContrastiveDecoding(**{"amateur": AMATEUR, **kwargs})


def test_amateur_is_required_and_typed():
    with pytest.raises(TypeError, match="amateur"):
        ContrastiveDecoding()
    with pytest.raises(TypeError, match=r"ContrastiveDecoding.amateur must be str"):
        ContrastiveDecoding(amateur=3)


def test_vocabulary_mismatch_is_refused_naming_the_field(make_pipeline):
    pipeline = make_pipeline([ContrastiveDecoding(amateur="steer_hydra:tiny?vocab_size=512")], steer=False)
    with pytest.raises(ValueError, match=r"ContrastiveDecoding.amateur=.*scores \d+ tokens.*Fix: set amateur"):
        pipeline.steer()
    assert not pipeline.is_steered


def test_check_refuses_vllm_naming_the_fix():
    pipeline = SteeringPipeline(TINY_REF, controls=[ContrastiveDecoding(amateur=AMATEUR)], backend="vllm")
    report = pipeline.check()
    assert not report.ok
    (failure,) = report.failures
    assert failure.control == "ContrastiveDecoding" and "in_process_torch" in failure.message
    assert "Fix: use backend=huggingface" in failure.message
    with pytest.raises(UnsupportedPipelineError, match="backend=huggingface"):
        pipeline.steer()
    assert SteeringPipeline(TINY_REF, controls=[ContrastiveDecoding(amateur=AMATEUR)]).check().ok


def test_processors_need_steer():
    with pytest.raises(RuntimeError, match=r"Fix: call pipeline.steer\(\) first"):
        ContrastiveDecoding(amateur=AMATEUR).get_logits_processors(torch.tensor([[1, 2]]), {})


def test_release_frees_the_amateur_and_leaves_the_model_unsteered():
    model, tokenizer = build_tiny_model()
    baseline = SteeringPipeline(model=model, tokenizer=tokenizer).steer()
    unsteered = baseline.generate(text=PROMPTS, **GREEDY)
    baseline.release()
    control = ContrastiveDecoding(amateur=AMATEUR)
    steered = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    amateur = weakref.ref(control.amateur_model)
    assert steered.generate(text=PROMPTS, **GREEDY) != unsteered
    steered.release()
    gc.collect()
    assert control.amateur_model is None and amateur() is None
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    again = SteeringPipeline(model=model, tokenizer=tokenizer).steer()
    assert again.generate(text=PROMPTS, **GREEDY) == unsteered
    again.release()
