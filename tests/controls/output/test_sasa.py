"""SASA: the subspace fitted from labeled data (closed-form LDA) or given, the per-step formula against full forwards,
the margin of what greedy decoding writes rising with beta, batching with left padding, refusals."""

from __future__ import annotations

import math

import pytest
import torch

from steer_hydra.controls.output import SASA, SubspaceMarginValues
from steer_hydra.controls.output.probes import Margin, fit_linear_probe, states_of_rows, two_class_margin
from steer_hydra.controls.output.value_guidance import ValueGuidedProcessor
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.capabilities import UnsupportedPipelineError
from steer_hydra.models import TINY_REF, build_tiny_model

WANTED = ["the cat and the dog play in the house", "a warm house with a dog", "the cat sleeps", "we walk home"]
UNWANTED = ["math code number count", "count the numbers and write code", "code math code math", "write the math essay"]
DATA = [{"text": t, "label": 0} for t in WANTED] + [{"text": t, "label": 1} for t in UNWANTED]
PROMPTS = ["hello there cat and dog", "a", "what is the capital of france", "tell me a story"]
GREEDY = {"max_new_tokens": 8, "do_sample": False}


def _rows(outputs, pad: int) -> list[list[int]]:
    rows = []
    for output in outputs:
        row = output.output_ids[0].tolist()
        while row and row[-1] == pad:
            row.pop()
        rows.append(row)
    return rows


def test_fitted_subspace_is_the_closed_form_discriminant_and_separates_its_data():
    model, tok = build_tiny_model()
    control = SASA(data=DATA)
    control.steer(model, tokenizer=tok)
    margins = control.margins_of(WANTED + UNWANTED)
    assert (margins[:4] > 0).all() and (margins[4:] < 0).all()
    # the same discriminant written out: pooled covariance shrunk by 0.05 toward its mean eigenvalue
    states = states_of_rows(model, [tok(t)["input_ids"] for t in WANTED + UNWANTED], tok.pad_token_id).double()
    good, bad = states[:4], states[4:]
    pooled = ((good - good.mean(0)).T @ (good - good.mean(0)) + (bad - bad.mean(0)).T @ (bad - bad.mean(0))) / 6
    eye = torch.eye(pooled.shape[0], dtype=torch.float64)
    shrunk = 0.95 * pooled + 0.05 * torch.trace(pooled) / pooled.shape[0] * eye
    w = torch.linalg.solve(shrunk, good.mean(0) - bad.mean(0))
    offset = -float(w @ (good.mean(0) + bad.mean(0))) / 2
    direction = control.margin.direction.double()
    assert math.isclose(float(direction.norm()), 1.0, rel_tol=1e-6)
    assert float(direction @ (w / w.norm())) > 1 - 1e-5  # the same direction (float32 solve vs float64)
    assert math.isclose(control.margin.offset, offset / float(w.norm()), rel_tol=1e-4, abs_tol=1e-4)
    assert control.vector_hash is not None and len(control.vector_hash) == 16


def test_pairs_fit_the_negative_responses_as_unwanted():
    model, tok = build_tiny_model()
    pairs = [{"prompt": "tell me", "positive": w, "negative": u} for w, u in zip(WANTED, UNWANTED, strict=True)]
    control = SASA(data=pairs)
    control.steer(model, tokenizer=tok)
    assert control.margin is not None and math.isclose(float(control.margin.direction.norm()), 1.0, rel_tol=1e-6)


def test_processor_scores_equal_the_formula_from_full_forwards():
    model, tok = build_tiny_model()
    margin = two_class_margin(
        fit_linear_probe(
            states_of_rows(model, [tok(t)["input_ids"] for t in WANTED + UNWANTED], tok.pad_token_id),
            ["wanted"] * 4 + ["unwanted"] * 4,
        ),
        "wanted",
    )
    batch = tok(PROMPTS, return_tensors="pt", padding=True)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (mask == 0).any()
    beta, k = 3.0, 6
    values = SubspaceMarginValues(model, margin, ids, mask, batch_size=7, pad_token_id=tok.pad_token_id)
    processor = ValueGuidedProcessor(values, beta=beta, top_k=k)
    for _ in range(3):
        full = torch.cat([mask, torch.ones(ids.shape[0], ids.shape[1] - mask.shape[1], dtype=mask.dtype)], 1)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp(min=0)).logits
        logits = logits[:, -1]
        got = processor(ids, logits.clone())
        top = logits.topk(k, dim=-1)
        want = torch.full_like(logits, -math.inf)
        for row in range(ids.shape[0]):
            prefix = ids[row][full[row].bool()].tolist()
            states = states_of_rows(model, [prefix + [int(t)] for t in top.indices[row]], tok.pad_token_id)
            want[row, top.indices[row]] = top.values[row] + beta * margin(states)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        assert torch.allclose(got[torch.isfinite(got)], want[torch.isfinite(want)], atol=1e-4)
        assert float((got.gather(1, top.indices) - top.values).std()) > 0.05  # the margins differ between candidates
        ids = torch.cat([ids, got.argmax(-1, keepdim=True)], 1)


def _mean_step_margin(beta: float) -> float:
    """The mean margin, over every generated position, of what greedy SASA writes for PROMPTS."""
    model, tok = build_tiny_model()
    control = SASA(data=DATA, beta=beta, top_k=20)
    with SteeringPipeline(model=model, tokenizer=tok, controls=[control]) as pipeline:
        pipeline.steer()
        outputs = pipeline.generate(text=PROMPTS, return_output=True, **GREEDY)
        margins = []
        for output, row in zip(outputs, _rows(outputs, tok.pad_token_id), strict=True):
            prompt = output.adapted_input_ids[0]
            prompt = prompt[prompt != tok.pad_token_id].tolist()
            states = states_of_rows(model, [prompt + row[: i + 1] for i in range(len(row))], tok.pad_token_id)
            margins.append(float(control.margin(states).mean()))
    return sum(margins) / len(margins)


def test_larger_beta_raises_the_margin_of_what_greedy_decoding_writes():
    low, mid, high = _mean_step_margin(0.0), _mean_step_margin(0.5), _mean_step_margin(5.0)
    assert low < mid < high and high - low > 1.0


def test_beta_zero_is_the_base_models_greedy_and_a_row_alone_equals_the_row_in_a_batch(make_pipeline):
    plain = make_pipeline([])
    untouched = make_pipeline([SASA(data=DATA, beta=0.0, top_k=5)])
    pad = plain.tokenizer.pad_token_id
    assert untouched.generate(text=PROMPTS, **GREEDY) == plain.generate(text=PROMPTS, **GREEDY)
    for control, prompts, tokens in (
        (SASA(data=DATA, beta=2.0, top_k=30, candidate_batch_size=50), PROMPTS, 8),
        (SASA(data=DATA, beta=2.0, top_k=None, candidate_batch_size=1024), PROMPTS[:2], 2),  # every finite token
    ):
        steered = make_pipeline([control])
        greedy = {"return_output": True, "max_new_tokens": tokens, "do_sample": False}
        batched = _rows(steered.generate(text=prompts, **greedy), pad)
        assert batched != _rows(plain.generate(text=prompts, **greedy), pad)
        for prompt, row in zip(prompts, batched, strict=True):
            assert _rows(steered.generate(text=[prompt], **greedy), pad)[0] == row
    assert steered.supports_batching and SASA.supports_refill is False


def test_a_given_direction_is_used_normalized_and_must_match_the_hidden_size(make_pipeline):
    model, tok = build_tiny_model()
    hidden = model.config.hidden_size
    control = SASA(direction=[2.0] + [0.0] * (hidden - 1), offset=4.0)
    control.steer(model, tokenizer=tok)
    assert isinstance(control.margin, Margin)
    assert control.margin.direction[0] == 1.0 and control.margin.offset == 2.0
    pipeline = make_pipeline([SASA(direction=[1.0] * (hidden + 1))], steer=False)
    with pytest.raises(ValueError, match=rf"SASA.direction has {hidden + 1} entries .* hidden size is {hidden}.*Fix"):
        pipeline.steer()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, r"SASA needs exactly one of data .* and direction"),
        ({"data": DATA, "direction": [1.0]}, r"SASA needs exactly one of data"),
        ({"data": DATA[:1]}, r"SASA.data holds 1 example"),
        ({"direction": [0.0, 0.0]}, r"SASA.direction is all zeros"),
        ({"data": DATA, "beta": -1.0}, r"SASA.beta must be a finite number >= 0"),
        ({"data": DATA, "top_k": 0}, r"SASA.top_k must be >= 1"),
        ({"data": DATA, "shrinkage": 1.0}, r"SASA.shrinkage must be in \[0, 1\)"),
        ({"data": DATA, "candidate_batch_size": 0}, r"SASA.candidate_batch_size must be >= 1 or None"),
    ],
)
def test_invalid_args_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SASA(**kwargs)


def test_bad_examples_are_refused_naming_the_entry():
    model, tok = build_tiny_model()
    with pytest.raises(ValueError, match=r"SASA.data\[1\].label must be 0 .* or 1"):
        SASA(data=[{"text": "a", "label": 0}, {"text": "b", "label": 2}]).steer(model, tokenizer=tok)
    with pytest.raises(ValueError, match=r"SASA.data\[0\] has keys \['words'\]"):
        SASA(data=[{"words": "a"}, {"text": "b", "label": 1}]).steer(model, tokenizer=tok)
    with pytest.raises(ValueError, match=r"two classes with two examples each"):
        SASA(data=[{"text": "a", "label": 0}, {"text": "b", "label": 0}]).steer(model, tokenizer=tok)


def test_check_refuses_vllm_naming_the_fix():
    pipeline = SteeringPipeline(TINY_REF, controls=[SASA(data=DATA)], backend="vllm")
    report = pipeline.check()
    (failure,) = report.failures
    assert failure.control == "SASA" and "in_process_torch" in failure.message
    assert "Fix: use backend=huggingface" in failure.message
    with pytest.raises(UnsupportedPipelineError, match="backend=huggingface"):
        pipeline.steer()
    assert SteeringPipeline(TINY_REF, controls=[SASA(data=DATA)]).check().ok
    with pytest.raises(RuntimeError, match=r"Fix: call pipeline.steer\(\) first"):
        SASA(data=DATA).get_logits_processors(torch.tensor([[1, 2]]), {})
