"""The tiny reward model: `steer_hydra:tiny-reward` parses, builds deterministically, round-trips, keeps digests."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from steer_hydra.models import TINY_REWARD_REF, TinySpec, build_tiny_model, resolve_model_reference
from steer_hydra.models.tiny import parse_tiny_reference
from steer_hydra.testing.numerics import assert_equal_up_to_rounding, decoder_roundings


def test_reference_parses_to_a_classifier_spec_with_overrides():
    spec = parse_tiny_reference(TINY_REWARD_REF)
    assert (spec.head, spec.num_labels, spec.chat_template) == ("sequence_classification", 2, True)
    custom = parse_tiny_reference(f"{TINY_REWARD_REF}?num_labels=1&seed=4&hidden_size=32")
    assert (custom.head, custom.num_labels, custom.seed, custom.hidden_size) == ("sequence_classification", 1, 4, 32)
    assert parse_tiny_reference("steer_hydra:tiny").head == "causal_lm"
    with pytest.raises(ValueError, match="tiny-reward"):
        parse_tiny_reference("steer_hydra:tiny-rewards")


def test_classifier_is_seeded_deterministic_and_shares_the_tiny_tokenizer():
    spec = parse_tiny_reference(TINY_REWARD_REF)
    (m1, tok), (m2, _) = build_tiny_model(spec), build_tiny_model(spec)
    _, base_tok = build_tiny_model()
    assert type(m1).__name__ == "LlamaForSequenceClassification" and m1.config.num_labels == 2
    assert tok.get_vocab() == base_tok.get_vocab()
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values(), strict=True))
    other, _ = build_tiny_model(TinySpec(head="sequence_classification", seed=1))
    assert not torch.equal(m1.score.weight, other.score.weight)
    batch = tok(["hello there cat", "what is the capital of france"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = m1(**batch).logits
    assert logits.shape == (2, 2) and not torch.allclose(logits[0], logits[1])  # the score depends on the text


def test_reference_materializes_a_checkpoint_that_loads_as_the_same_classifier():
    path = resolve_model_reference(f"{TINY_REWARD_REF}?num_labels=1")
    loaded = AutoModelForSequenceClassification.from_pretrained(path)
    built, tok = build_tiny_model(parse_tiny_reference(f"{TINY_REWARD_REF}?num_labels=1"))
    assert AutoTokenizer.from_pretrained(path).get_vocab() == tok.get_vocab()
    ids = tok("hello there", return_tensors="pt")["input_ids"]
    built_weights = built.state_dict()
    assert loaded.state_dict().keys() == built_weights.keys()
    assert all(torch.equal(w, built_weights[k]) for k, w in loaded.state_dict().items())  # the same classifier
    with torch.no_grad():  # the same function: equal but for the rounding of another kernel's summation order
        assert loaded(ids).logits.shape == (1, 1)
        terms = decoder_roundings(built.config, ids.shape[1])
        assert_equal_up_to_rounding(loaded(ids).logits, built(ids).logits, terms=terms)
    assert resolve_model_reference(TINY_REWARD_REF) != resolve_model_reference("steer_hydra:tiny")


def test_head_fields_leave_existing_digests_unchanged_and_bad_heads_are_refused():
    # the causal checkpoints' identity from before the head fields existed (cached folders stay valid)
    assert TinySpec().digest() == "859a28f1d5a3"
    assert TinySpec(head="sequence_classification").digest() != TinySpec().digest()
    assert (
        TinySpec(head="sequence_classification", num_labels=3).digest()
        != TinySpec(head="sequence_classification").digest()
    )
    with pytest.raises(ValueError, match=r"TinySpec.head must be one of"):
        build_tiny_model(TinySpec(head="masked_lm"))
