"""LoReFT on the tiny model: training lowers the loss on the training responses with the model frozen and restored,
R keeps orthonormal rows, the edit acts only at the prompt's first and last positions, a row alone decodes as in a
padded batch, the parameters are reused from the cache (zero steps) and retrained for new rows, and the trainer
reads the training split only."""

from __future__ import annotations

import json

import pytest
import torch

from steer_hydra.controls.trained import LoReFT
from steer_hydra.controls.trained.reft import intervention_mask, loreft
from steer_hydra.core import SteeringPipeline
from steer_hydra.models import build_tiny_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

PAIRS = [
    {"prompt": f"tell me about the {w}", "positive": f"the {w} is kind and calm", "negative": f"the {w} is rude"}
    for w in ("cat", "dog", "bird", "fish")
]
PROMPTS = ["tell me about the cat", "hello", "what is the capital of france and of spain"]
FAST = {"epochs": 10, "learning_rate": 1e-2, "layer": 0}


def test_the_mask_covers_each_rows_first_and_last_prompt_positions():
    mask = intervention_mask(torch.tensor([2, 0]), torch.tensor([5, 3]), 8, first=2, last=1)
    assert mask.int().tolist() == [[0, 0, 1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    hidden, rotation = torch.randn(3, 8), torch.linalg.qr(torch.randn(8, 2))[0].T
    weight, bias = torch.randn(2, 8), torch.randn(2)
    edited = loreft(hidden, rotation, weight, bias)
    # inside the subspace the state becomes W h + b; its orthogonal complement is untouched
    assert torch.allclose(edited @ rotation.T, hidden @ weight.T + bias, atol=1e-5)
    complement = torch.eye(8) - rotation.T @ rotation
    assert torch.allclose(edited @ complement, hidden @ complement, atol=1e-5)


def test_training_lowers_the_loss_and_leaves_the_model_as_it_was(tmp_path):
    model, tokenizer = build_tiny_model()
    model.lm_head.weight.requires_grad_(False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    plain = SteeringPipeline(model=model, tokenizer=tokenizer).steer()
    before = plain.generate(text=PROMPTS, max_new_tokens=8, do_sample=False)
    plain.release()
    control = LoReFT(data=PAIRS, cache_dir=str(tmp_path), **FAST)
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    assert control.trained_steps == 10 and control.losses[-1] < control.losses[0] - 0.5, control.losses
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())  # the model never changed
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    rotation = control._tensors["rotation"]
    assert torch.allclose(rotation @ rotation.T, torch.eye(rotation.shape[0]), atol=1e-5)
    after = pipeline.generate(text=PROMPTS, max_new_tokens=8, do_sample=False)
    assert sum(a != b for a, b in zip(after, before, strict=True)) >= 2  # the edit reaches later tokens
    pipeline.release()
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) == 0


def test_a_row_alone_decodes_as_in_a_padded_batch(tmp_path):
    model, tokenizer = build_tiny_model()
    pipeline = SteeringPipeline(
        model=model, tokenizer=tokenizer, controls=[LoReFT(data=PAIRS, cache_dir=str(tmp_path), **FAST)]
    ).steer()
    batched = pipeline.generate(text=PROMPTS, max_new_tokens=8, do_sample=False)
    assert [pipeline.generate(text=p, max_new_tokens=8, do_sample=False) for p in PROMPTS] == batched
    pipeline.release()


def test_parameters_are_reused_by_digest_and_the_trainer_reads_the_training_split_only(tmp_path):
    data = tmp_path / "rows.jsonl"
    held_out = [{"prompt": "DEV name a river", "response": "DEV", "split": "dev"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in [*({**p, "split": "train"} for p in PAIRS), *held_out]))
    first = LoReFT(data=str(data), cache_dir=str(tmp_path / "c"), **FAST)
    assert [p for p, _ in first.training_rows()] == [p["prompt"] for p in PAIRS]
    model, tokenizer = build_tiny_model()
    SteeringPipeline(model=model, tokenizer=tokenizer, controls=[first]).steer().release()
    again = LoReFT(data=str(data), cache_dir=str(tmp_path / "c"), **FAST)
    SteeringPipeline(model=model, tokenizer=tokenizer, controls=[again]).steer().release()
    assert again.trained_steps == 0 and again.artifact_path == first.artifact_path
    assert again.vector_hash == first.vector_hash
    fewer = LoReFT(data=PAIRS[:3], cache_dir=str(tmp_path / "c"), **FAST)
    SteeringPipeline(model=model, tokenizer=tokenizer, controls=[fewer]).steer().release()
    assert fewer.trained_steps == 10 and fewer.artifact_path != first.artifact_path
    assert not SteeringPipeline("steer_hydra:tiny", controls=[fewer], backend="vllm").check().ok
    with pytest.raises(ValueError, match="first"):
        LoReFT(data=PAIRS, first=0, last=0)
