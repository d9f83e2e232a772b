"""CAA's in-process fit memo: the same model, layer and pairs reuse one fit; any change of them fits again."""

from __future__ import annotations

import torch

from steer_hydra.controls.state import CAA
from steer_hydra.controls.state import caa as caa_module
from steer_hydra.tasks.concepts import concept_pairs


def test_a_second_fit_of_the_same_vector_is_reused_and_equal(tiny, monkeypatch):
    model, tokenizer = tiny
    monkeypatch.setattr(caa_module, "_FITTED", {})
    calls = []
    real = caa_module.fit_mean_difference
    monkeypatch.setattr(caa_module, "fit_mean_difference", lambda *a, **k: calls.append(a[3]) or real(*a, **k))
    pairs = concept_pairs("weddings")[:3]

    def fitted(**kw) -> CAA:
        control = CAA(
            **{"data": pairs, "layer_id": 0, "accumulate": "completion", "strength_unit": "median_norm", **kw}
        )
        control.steer(model, tokenizer=tokenizer)
        return control

    first = fitted(multiplier=0.5)
    again = fitted(multiplier=2.0, direction="negated")  # another strength and a sanity arm: the same fit
    assert calls == [0] and again.vector.metadata["median_norm"] == first.vector.metadata["median_norm"]
    torch.testing.assert_close(again.vector.tensor, -first.vector.tensor)
    fitted(layer_id=1)  # another layer
    fitted(data=concept_pairs("weddings")[:2])  # other pairs
    fitted(accumulate="last_token")
    assert calls == [0, 1, 0, 0]
    monkeypatch.setattr(caa_module, "_FITTED", {})
    torch.testing.assert_close(fitted(multiplier=0.5).vector.tensor, first.vector.tensor)  # a fresh fit agrees
    assert len(calls) == 5
