"""The lowering of generation params to vLLM sampling fields, seeds and token-id rows (pure, no vLLM)."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.backends.vllm.lowering import (
    candidates_per_request,
    expand_candidates,
    pad_continuations,
    prompt_rows,
    refuse_extra,
    rollout_params,
    rollout_seeds,
    row_seeds,
    sampling_fields,
)
from steer_hydra.core.identity import derive_item_seed
from steer_hydra.core.params import GenerationParams


def test_greedy_lowers_to_temperature_zero_one_candidate_and_no_sampling_fields():
    params = GenerationParams.from_kwargs(max_new_tokens=7, n=3, top_p=0.5, top_k=4, seed=11)
    fields = sampling_fields(params, seed=123)
    assert fields == {"max_tokens": 7, "n": 1, "temperature": 0.0, "include_stop_str_in_output": True}
    assert candidates_per_request(params) == 1


def test_sampling_lowers_every_mapped_field():
    params = GenerationParams.from_kwargs(
        max_new_tokens=20,
        min_new_tokens=3,
        do_sample=True,
        temperature=0.7,
        top_p=0.9,
        top_k=5,
        repetition_penalty=1.2,
        n=4,
        seed=1,
        stop_strings=["\n\n", "END"],
        stop_token_ids=[2, 9],
    )
    assert sampling_fields(params, seed=42) == {
        "max_tokens": 20,
        "min_tokens": 3,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "repetition_penalty": 1.2,
        "n": 4,
        "seed": 42,
        "stop": ["\n\n", "END"],
        "include_stop_str_in_output": True,
        "stop_token_ids": [2, 9],
    }


def test_sampling_without_temperature_samples_at_one_and_top_k_zero_is_not_sent():
    fields = sampling_fields(GenerationParams.from_kwargs(do_sample=True, top_k=0, max_new_tokens=4))
    assert fields["temperature"] == 1.0
    assert "top_k" not in fields and "top_p" not in fields and "seed" not in fields


def test_unmapped_generation_kwarg_is_refused_by_name():
    params = GenerationParams.from_kwargs(max_new_tokens=4, no_repeat_ngram_size=3, length_penalty=0.5)
    with pytest.raises(ValueError, match=r"length_penalty, no_repeat_ngram_size .*backend 'vllm'.*huggingface"):
        refuse_extra(params, "vllm")
    refuse_extra(GenerationParams.from_kwargs(max_new_tokens=4), "vllm")  # nothing extra: no error


def test_row_seeds_pass_the_pipeline_seeds_through():
    item = GenerationParams.from_kwargs(do_sample=True, seed=5, seed_scope="item")
    expected = [derive_item_seed(5, "generate", i) for i in range(3)]
    assert row_seeds(item, expected, 3) == expected
    assert row_seeds(GenerationParams.from_kwargs(seed=5), expected, 3) == [None] * 3  # greedy: no seeds
    with pytest.raises(ValueError, match="2 seeds for 3 prompt rows"):
        row_seeds(item, expected[:2], 3)


def test_rollout_seeds_differ_per_call_and_row_and_are_none_unseeded():
    first, second = rollout_seeds(7, 0, 2), rollout_seeds(7, 1, 2)
    assert first == rollout_seeds(7, 0, 2)
    assert len(set(first + second)) == 4
    assert rollout_seeds(None, 3, 2) == [None, None]


def test_prompt_rows_keep_only_real_tokens():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 11, 0, 12]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 0, 1]])
    assert prompt_rows(ids, mask) == [[5, 6], [7, 8, 9, 10], [11, 12]]
    with pytest.raises(ValueError, match="no real tokens"):
        prompt_rows(ids[:1], torch.zeros_like(ids[:1]))


def test_candidates_group_by_prompt_copy_a_greedy_candidate_and_right_pad():
    flat = expand_candidates([[[1, 2, 3]], [[4], [5, 6]]], 2)
    assert flat == [[1, 2, 3], [1, 2, 3], [4], [5, 6]]
    padded = pad_continuations(flat, pad_token_id=0)
    assert padded.tolist() == [[1, 2, 3], [1, 2, 3], [4, 0, 0], [5, 6, 0]]
    assert padded.dtype == torch.long
    with pytest.raises(RuntimeError, match="2 candidates for prompt row 0; expected 3"):
        expand_candidates([[[1], [2]]], 3)


def test_rollout_params_map_model_generate_kwargs_and_refuse_beams():
    params = rollout_params(
        {"num_return_sequences": 4, "do_sample": True, "max_new_tokens": 9, "temperature": 0.8, "num_beams": 1},
        stop_strings=["."],
        stop_token_ids=[3],
        backend_kind="vllm",
    )
    assert (params.n, params.greedy, params.max_new_tokens, params.temperature) == (4, False, 9, 0.8)
    assert (params.stop_strings, params.stop_token_ids) == ((".",), (3,))
    with_eos = rollout_params(
        {"do_sample": True, "eos_token_id": [2, 3]}, stop_strings=(), stop_token_ids=[3], backend_kind="vllm"
    )
    assert with_eos.stop_token_ids == (3, 2) and not with_eos.extra
    with pytest.raises(ValueError, match=r"num_beams=3 .*backend 'vllm_serve'.*DeAL.*backend=huggingface"):
        rollout_params(
            {"num_beams": 3, "num_return_sequences": 3}, stop_strings=(), stop_token_ids=(), backend_kind="vllm_serve"
        )
    with pytest.raises(ValueError, match="output_scores"):
        rollout_params({"output_scores": True}, stop_strings=(), stop_token_ids=(), backend_kind="vllm")
