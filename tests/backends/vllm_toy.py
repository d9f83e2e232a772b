"""A stand-in for a vLLM model and model runner, for the worker plugin's tests without vLLM.

`ToyModel(attention, linear)` keeps vLLM's decoder-layer contract (`layer(positions, hidden, residual) -> (hidden,
residual)`, the stream being their sum; the attention output joins the stream inside the layer, as vLLM's fused add
before the MLP); each test module gives it its own attention block and linear layers. `runner(model, requests)` is a
stand-in model runner holding `requests = [(req_id, n_tokens, extra_args)]` in persistent-batch order, and
`xargs(additions, prompt_length)` the `vllm_xargs` a request carries.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import numpy as np
import torch

from steer_hydra.backends.vllm.steering import steering_fields

HIDDEN = 8


class ToyLayer(torch.nn.Module):
    def __init__(
        self, seed: int, attention: Callable[[int], torch.nn.Module], linear: Callable[[int], torch.nn.Linear]
    ):
        super().__init__()
        self.self_attn = attention(seed + 10)
        self.linear = linear(seed)

    def forward(self, positions, hidden_states, residual):
        residual = hidden_states if residual is None else hidden_states + residual
        mixed = residual + 0.1 * positions[:, None].float()
        residual = residual + self.self_attn(mixed)
        return torch.tanh(self.linear(residual)), residual


class ToyModel(torch.nn.Module):
    def __init__(self, attention: Callable[[int], torch.nn.Module], linear: Callable[[int], torch.nn.Linear]):
        super().__init__()
        self.embed = torch.nn.Embedding(32, HIDDEN)
        self.layers = torch.nn.ModuleList([ToyLayer(seed, attention, linear) for seed in (1, 2, 3)])

    def forward(self, input_ids, positions):
        hidden, residual = self.embed(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        return hidden + residual


def runner(model, requests):
    """A stand-in model runner holding `requests` = [(req_id, n_tokens, extra_args)] in persistent-batch order."""
    bounds = np.cumsum([0] + [n for _, n, _ in requests])
    states = {rid: types.SimpleNamespace(sampling_params=types.SimpleNamespace(extra_args=x)) for rid, _, x in requests}
    return types.SimpleNamespace(
        input_batch=types.SimpleNamespace(num_reqs=len(requests), req_ids=[r for r, _, _ in requests]),
        query_start_loc=types.SimpleNamespace(np=bounds),
        requests=states,
        get_model=lambda: model,
        model_config=types.SimpleNamespace(hf_text_config=types.SimpleNamespace(num_hidden_layers=3)),
    )


def xargs(additions, prompt_length):
    """The `vllm_xargs` of a request steered by `additions` after a prompt of `prompt_length` tokens."""
    return steering_fields(additions, prompt_length).get("vllm_xargs")
