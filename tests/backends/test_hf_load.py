"""The Hugging Face backend loads a model whole: a tied output embedding left on the meta device is tied, and any
other parameter without data is refused at load, naming it, instead of failing at the first forward."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.backends.huggingface import ensure_loaded
from steer_hydra.models import build_tiny_model


def test_an_untied_meta_output_embedding_is_tied_and_other_meta_parameters_are_refused():
    model, _ = build_tiny_model()
    model.config.tie_word_embeddings = True
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight, device="meta"))
    ensure_loaded(model, "tiny")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.device.type == "cpu"

    broken, _ = build_tiny_model()
    layer = broken.model.layers[1].mlp.up_proj
    layer.weight = torch.nn.Parameter(torch.empty_like(layer.weight, device="meta"))
    with pytest.raises(RuntimeError, match=r"1 parameter\(s\) of tiny hold no data.*layers\.1\.mlp\.up_proj.*Fix:"):
        ensure_loaded(broken, "tiny")
    ensure_loaded(build_tiny_model()[0], "tiny")  # a whole model passes untouched
