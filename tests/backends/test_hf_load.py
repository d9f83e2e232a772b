"""The Hugging Face backend loads a model whole: a tied output embedding left on the meta device is tied, and any
other parameter without data is refused at load, naming it, instead of failing at the first forward; loads in
several threads at once leave transformers' process-wide state (the class's `tie_weights`, the default dtype, the
patched torch functions) as they found it."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from steer_hydra.core import ModelSource, SteeringPipeline
from steer_hydra.models import TINY_REF, build_tiny_model
from steer_hydra.models.loading import ensure_loaded


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


def _process_state() -> dict[str, object]:
    """What transformers swaps process-wide while it builds a model and puts back on exit (by identity)."""
    from transformers import initialization
    from transformers.modeling_utils import PreTrainedModel

    state: dict[str, object] = {
        "PreTrainedModel.tie_weights": PreTrainedModel.tie_weights,
        "PreTrainedModel.init_weights": PreTrainedModel.init_weights,
        "torch.linspace": torch.linspace,
        "default dtype": torch.get_default_dtype(),
    }
    for module_name in initialization.TORCH_MODULES_TO_PATCH:
        module = sys.modules.get(module_name)
        for function in initialization.TORCH_INIT_FUNCTIONS:
            if module is not None and hasattr(module, function):
                state[f"{module_name}.{function}"] = getattr(module, function)
    return state


@pytest.fixture
def process_state():
    """The process-wide state before the test; whatever the test leaves changed is put back after it, so a failure
    here does not break the tests that run after it in this process."""
    from transformers.modeling_utils import PreTrainedModel

    before = _process_state()
    yield before
    for key, value in before.items():
        if key == "default dtype":
            torch.set_default_dtype(value)
        elif key.startswith("PreTrainedModel."):
            setattr(PreTrainedModel, key.split(".", 1)[1], value)
        else:
            module_name, name = key.rsplit(".", 1)
            setattr(sys.modules[module_name], name, value)


def test_pipelines_loading_in_two_threads_at_once_leave_tying_and_the_default_dtype_intact(process_state):
    # from_pretrained swaps PreTrainedModel.tie_weights for a no-op while it builds the model and restores what it
    # found: unserialized, the second thread restores the first one's no-op and no model of the process ties again
    source = ModelSource(TINY_REF, device_map=None, hf_model_kwargs={"dtype": torch.bfloat16})
    errors: list[BaseException] = []

    def load(barrier: threading.Barrier) -> None:
        try:
            barrier.wait(60)
            SteeringPipeline(source).steer().release()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    for _ in range(3):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=load, args=(barrier,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert not errors, errors
    after = _process_state()
    assert {k: v for k, v in after.items() if v is not process_state[k]} == {}
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        tied = LlamaForCausalLM(config)
    tied.load_state_dict({"model.embed_tokens.weight": torch.ones(32, 8)}, strict=False, assign=True)
    tied.tie_weights()
    assert tied.lm_head.weight is tied.model.embed_tokens.weight  # a model built afterwards still ties
