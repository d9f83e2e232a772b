"""The tiny offline model: deterministic construction, templates, padding, save/load, references."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from steer_hydra.models import TINY_BASE_REF, TINY_REF, TinySpec, build_tiny_model, resolve_model_reference
from steer_hydra.models.tiny import parse_tiny_reference
from steer_hydra.testing.numerics import assert_equal_up_to_rounding, decoder_roundings


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_same_seed_builds_identical_model_and_tokenizer():
    (m1, t1), (m2, t2) = build_tiny_model(TinySpec(seed=3)), build_tiny_model(TinySpec(seed=3))
    w1, w2 = _weights(m1), _weights(m2)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert t1.get_vocab() == t2.get_vocab()


def test_different_seed_gives_different_weights_and_rng_is_untouched():
    state = torch.get_rng_state()
    m1, _ = build_tiny_model(TinySpec(seed=0))
    m2, _ = build_tiny_model(TinySpec(seed=1))
    assert torch.equal(state, torch.get_rng_state())
    assert not torch.equal(m1.lm_head.weight, m2.lm_head.weight)


def test_tokenizer_has_special_tokens_left_padding_and_template():
    _, tok = build_tiny_model()
    assert tok.padding_side == "left"
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3
    rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert rendered == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    batch = tok(["hi", "what is the capital of france"], padding=True)
    assert batch["input_ids"][0][0] == tok.pad_token_id and batch["attention_mask"][0][0] == 0
    assert batch["input_ids"][1][0] == tok.bos_token_id


def test_base_variant_has_no_chat_template():
    _, tok = build_tiny_model(TinySpec(chat_template=False))
    assert tok.chat_template is None


def test_attention_implementation_option():
    model, _ = build_tiny_model(TinySpec(attn_implementation="eager"))
    assert model.config._attn_implementation == "eager"


def test_save_and_load_round_trip(tmp_path):
    model, tok = build_tiny_model(TinySpec(seed=5))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok("hello there", return_tensors="pt")["input_ids"]
    assert loaded_tok("hello there", return_tensors="pt")["input_ids"].tolist() == ids.tolist()
    assert loaded_tok.chat_template == tok.chat_template and loaded_tok.padding_side == "left"
    assert _weights(loaded).keys() == _weights(model).keys()
    assert all(torch.equal(w, _weights(model)[k]) for k, w in _weights(loaded).items())  # saved and read exactly
    with torch.no_grad():  # the same function: equal but for the rounding of another kernel's summation order
        terms = decoder_roundings(model.config, ids.shape[1])
        assert_equal_up_to_rounding(loaded(ids).logits, model(ids).logits, terms=terms)


def test_references_materialize_once_into_the_cache():
    path = resolve_model_reference(TINY_REF)
    assert os.path.isfile(os.path.join(path, "config.json"))
    stamp = os.path.getmtime(os.path.join(path, "config.json"))
    assert resolve_model_reference(TINY_REF) == path
    assert os.path.getmtime(os.path.join(path, "config.json")) == stamp
    base = resolve_model_reference(TINY_BASE_REF)
    assert base != path and AutoTokenizer.from_pretrained(base).chat_template is None
    assert resolve_model_reference("gpt2") == "gpt2"


def test_reference_overrides_and_unknown_fields():
    spec = parse_tiny_reference("steer_hydra:tiny?hidden_size=128&head_dim=64&seed=2&attn_implementation=eager")
    assert (spec.hidden_size, spec.head_dim, spec.seed, spec.attn_implementation) == (128, 64, 2, "eager")
    with pytest.raises(ValueError, match="hiden_size"):
        parse_tiny_reference("steer_hydra:tiny?hiden_size=128")
