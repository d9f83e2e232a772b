"""GenerationParams normalization and merging; finish-reason inference and stop truncation."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.core import GenerationParams, Output, infer_finish_reasons, truncate_at_stop_strings
from steer_hydra.core.params import DEFAULT_SEED_SCOPE


def test_from_kwargs_normalizes():
    p = GenerationParams.from_kwargs(
        max_new_tokens=8,
        do_sample=True,
        temperature=0.7,
        num_return_sequences=3,
        stop_strings="END",
        seed=4,
        seed_scope="dispatch",
        output_scores=True,
    )
    assert (p.max_new_tokens, p.greedy, p.temperature, p.n, p.stop_strings, p.seed, p.seed_scope) == (
        8,
        False,
        0.7,
        3,
        ("END",),
        4,
        "dispatch",
    )
    assert p.extra == {"output_scores": True}
    assert GenerationParams.from_kwargs().greedy and GenerationParams.from_kwargs(temperature=0.5).greedy is False
    with pytest.raises(ValueError, match="seed_scope"):
        GenerationParams.from_kwargs(seed_scope="whole")
    with pytest.raises(ValueError, match="max_new_tokens"):
        GenerationParams.from_kwargs(max_new_tokens=0)
    with pytest.raises(ValueError, match="disagree"):
        GenerationParams.from_kwargs(n=2, num_return_sequences=3)


def test_seed_scope_defaults_to_dispatch():
    assert DEFAULT_SEED_SCOPE == "dispatch"
    assert GenerationParams().seed_scope == "dispatch"
    assert GenerationParams.from_kwargs(temperature=1.0, seed=3).seed_scope == "dispatch"
    assert GenerationParams.from_kwargs(seed_scope=None).seed_scope == "dispatch"
    assert GenerationParams.from_kwargs(seed_scope="item").seed_scope == "item"


def test_merge_lowered_union_min_max():
    p = GenerationParams(max_new_tokens=20, stop_strings=("A",), stop_token_ids=(1,), min_new_tokens=2)
    merged = p.merge_lowered(
        {"stop_strings": ["B", "A"], "stop_token_ids": [2], "max_new_tokens": 30, "min_new_tokens": 5}
    )
    assert merged.stop_strings == ("A", "B") and merged.stop_token_ids == (1, 2)
    assert merged.max_new_tokens == 20 and merged.min_new_tokens == 5
    assert p.merge_lowered({"max_new_tokens": 4}).max_new_tokens == 4
    with pytest.raises(ValueError, match="temperature"):
        p.merge_lowered({"temperature": 1.0})


def test_truncate_at_earliest_stop():
    assert truncate_at_stop_strings("keep END drop STOP", ["STOP", "END"]) == "keep "
    assert truncate_at_stop_strings("nothing", ["X"]) == "nothing"
    assert truncate_at_stop_strings("a", None) == "a"


class _Tok:
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(96 + i) for i in ids if i not in (0, 9))


def test_infer_finish_reasons_rule_order():
    tok = _Tok()
    rows = torch.tensor(
        [
            [3, 5, 0, 0],  # stop token id
            [1, 2, 3, 0],  # "abc" contains stop string "bc"
            [4, 9, 0, 0],  # eos id 9
            [4, 4, 4, 4],  # reached max_new_tokens
            [4, 0, 0, 0],  # pads stripped, pad is not eos
        ]
    )
    reasons = infer_finish_reasons(
        rows, tok, max_new_tokens=4, stop_strings=["bc"], stop_token_ids=[5], eos_token_ids=[9]
    )
    assert reasons == ["stop", "stop", "eos", "length", None]
    # when pad equals eos, stripped trailing pads mean eos
    assert infer_finish_reasons(torch.tensor([[4, 0, 0]]), tok, max_new_tokens=4, eos_token_ids=[0]) == ["eos"]


def test_output_validates_and_exposes_first_reason():
    out = Output(torch.tensor([[1, 2]]), torch.tensor([[5]]), ["length"])
    assert out.finish_reason == "length" and out.generated_tokens is None
    with pytest.raises(ValueError, match="finish_reasons"):
        Output(torch.tensor([[1, 2]]), None, ["length", "stop"])
    with pytest.raises(ValueError, match="2-D"):
        Output(torch.tensor([1, 2]), None, ["length"])
