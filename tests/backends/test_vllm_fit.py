"""backend=vllm with a vector still to fit, on a real vLLM engine: fitted on the Hugging Face model of the same
checkpoint before the engine starts, cached, then steering inside the engine as the same CAA and DirectionalAblation
do on Hugging Face.
Its own module, so its engine starts after the shared one of test_vllm_engine.py is released."""

from __future__ import annotations

import pytest
from vllm_real import ENGINE_OPTIONS, MIN_AGREEMENT, TINY64, agreement, generate, rows, steered

from steer_hydra.controls.state import CAA, DirectionalAblation
from steer_hydra.core import BackendSpec

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]

PAIRS = [
    {"prompt": "How do you feel?", "positive": "Wonderful and happy.", "negative": "Awful and sad."},
    {"prompt": "Describe the day.", "positive": "Bright and lovely.", "negative": "Gloomy and grim."},
]


def test_vectors_fitted_for_the_engine_steer_like_the_same_controls_on_hugging_face(
    tmp_path, monkeypatch, record_property
):
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path))  # the fitted vectors (and the tiny checkpoint) go here

    def controls():
        return [CAA(data=PAIRS, layer_id=1, multiplier=4.0), DirectionalAblation(data=PAIRS, layer_id=1)]

    with steered(TINY64, controls()) as hf:
        expected = {name: rows(hf, generate(hf, (name,))) for name in ("CAA", "DirectionalAblation")}
        unsteered = rows(hf, generate(hf))
    with steered(TINY64, controls(), BackendSpec("vllm", ENGINE_OPTIONS)) as engine:
        served = {name: rows(engine, generate(engine, (name,))) for name in expected}
    for name in expected:
        assert agreement(f"offline fitted {name}", expected[name], served[name], record_property) >= MIN_AGREEMENT
        assert served[name] != unsteered  # the fitted vector really steers
    assert len(list((tmp_path / "vectors").glob("*.safetensors"))) == 2  # one fit each, cached
