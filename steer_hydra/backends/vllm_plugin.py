"""vLLM general plugin (worker side): adds each request's residual additions inside the engine, per token.

Registered under the `vllm.general_plugins` entry point, so vLLM calls `register()` in each of its processes;
it does nothing unless `STEER_HYDRA_VLLM_STEERING=1` (backend=vllm sets it for its engine; a server is started
with it: `STEER_HYDRA_VLLM_STEERING=1 VLLM_USE_V2_MODEL_RUNNER=0 vllm serve MODEL --enforce-eager`). It hooks vLLM's
V1 model runner, which vLLM 0.32 runs only with `VLLM_USE_V2_MODEL_RUNNER=0` where Triton is importable. When
on, it wraps the worker's `load_model` so that, once the model is loaded, `install(model_runner)` puts three kinds
of hooks on it:

- a forward pre-hook on the model builds the step's plan: the requests of the persistent batch in order
  (`input_batch.req_ids`), their token ranges in the flat batch (`query_start_loc`), their positions (the
  model's `positions` argument) and their `SamplingParams.extra_args` (see `vllm_steering` for the wire format)
  give, per (layer, site), the flat token indices to steer and the rows to add there;
- a forward pre-hook (site `input`) and a forward hook (site `output`) on every decoder layer apply the plan.

vLLM decoder layers take and return `(hidden_states, residual)`: the residual stream is their sum (the next
norm adds them). The addition goes into `hidden_states` out of place (never an in-place write on an inference
tensor); norm preservation rescales the whole stream `hidden + residual`, not `hidden` alone. Requests without
additions (and padding rows) are untouched. Hooks inside a torch.compile'd model would be traced once, so
steering needs eager mode (`enforce_eager=True`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.backends.vllm_steering import ENV_FLAG, RUNNER_ENV, XARGS_KEY, XARGS_START

logger = logging.getLogger("vllm.steer_hydra")  # under vLLM's logger: its processes print it

_MARK = "_steer_hydra_steering"


def register() -> None:
    """vLLM's entry point: when the env flag is on, make the worker install the hooks after loading the model."""
    if os.environ.get(ENV_FLAG) != "1":
        return
    try:
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as error:  # another vLLM layout: say so, steering is then unavailable
        logger.warning("steer_hydra steering plugin: no vllm.v1 Worker (%s); steering is off.", error)
        return
    if getattr(Worker.load_model, _MARK, False):
        return
    original = Worker.load_model

    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        install(self.model_runner)
        return result

    setattr(load_model, _MARK, True)
    Worker.load_model = load_model


@dataclass(frozen=True, slots=True)
class Addition:
    """One parsed addition of the wire format (rows as a float32 tensor)."""

    layer: int
    site: str
    mode: str
    preserve_norm: bool
    rows: torch.Tensor


@functools.lru_cache(maxsize=512)
def parse(payload: str) -> tuple[Addition, ...]:
    """The additions of one request's `steer_hydra` payload (cached: every row of a call shares it)."""
    return tuple(
        Addition(
            int(item["layer"]),
            str(item["site"]),
            str(item["mode"]),
            bool(item.get("preserve_norm", False)),
            torch.tensor(item["rows"], dtype=torch.float32),
        )
        for item in json.loads(payload)
    )


Plan = dict[tuple[int, str, bool], tuple[torch.Tensor, torch.Tensor]]


def build_plan(
    requests: Sequence[tuple[int, int, dict[str, Any] | None]], positions: torch.Tensor, num_layers: int
) -> Plan:
    """Per (layer, site, preserve_norm): the flat token indices to steer and the `[k, hidden]` rows added there.

    `requests` lists each request's token range `[start, end)` in the flat batch and its extra_args.
    """
    pieces: dict[tuple[int, str, bool], list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for begin, end, xargs in requests:
        if not xargs or XARGS_KEY not in xargs or end <= begin:
            continue
        additions = parse(xargs[XARGS_KEY])
        starts = list(xargs.get(XARGS_START) or [])
        if len(starts) != len(additions):
            raise ValueError(f"{XARGS_START} has {len(starts)} entries for {len(additions)} additions.")
        tokens = torch.arange(begin, end)
        where = positions[begin:end].to(torch.long).cpu()
        for addition, start in zip(additions, starts, strict=True):
            if not 0 <= addition.layer < num_layers:
                raise ValueError(f"Steering layer {addition.layer} is out of range (the model has {num_layers}).")
            offset = where - int(start)
            inside = offset >= 0
            if addition.mode == "block":
                inside &= offset < addition.rows.shape[0]
                index = offset[inside]
            else:
                index = torch.zeros(int(inside.sum()), dtype=torch.long)
            if not bool(inside.any()):
                continue
            key = (addition.layer, addition.site, addition.preserve_norm)
            pieces.setdefault(key, []).append((tokens[inside], addition.rows[index]))
    return {key: (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])) for key, parts in pieces.items()}


def add_rows(
    hidden: torch.Tensor, residual: torch.Tensor | None, index: torch.Tensor, rows: torch.Tensor, preserve: bool
) -> torch.Tensor:
    """`hidden` with `rows` added at flat positions `index` (out of place); the stream is `hidden + residual`."""
    index = index.to(hidden.device)
    rows = rows.to(device=hidden.device, dtype=hidden.dtype)
    if not preserve:
        return hidden.index_add(0, index, rows)
    part = hidden.index_select(0, index)
    rest = residual.index_select(0, index) if residual is not None else torch.zeros_like(part)
    stream = part + rest
    steered = stream + rows
    steered = steered * (stream.norm(dim=-1, keepdim=True) / steered.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    return hidden.index_copy(0, index, steered - rest)


class SteeringHooks:
    """The hooks of one model runner: a per-step plan and its application at each decoder layer."""

    def __init__(self, runner: Any, num_layers: int) -> None:
        self.runner = runner
        self.num_layers = num_layers
        self.plan: Plan = {}
        self.steps = 0  # forwards that steered at least one token (for tests and logs)

    def requests(self, num_tokens: int) -> list[tuple[int, int, dict[str, Any] | None]]:
        batch = self.runner.input_batch
        num_reqs = int(batch.num_reqs)
        if num_reqs == 0:
            return []
        bounds = self.runner.query_start_loc.np[: num_reqs + 1].tolist()
        states = self.runner.requests
        out = []
        for i, req_id in enumerate(batch.req_ids[:num_reqs]):
            state = states.get(req_id)
            params = getattr(state, "sampling_params", None)
            xargs = getattr(params, "extra_args", None)
            begin, end = int(bounds[i]), min(int(bounds[i + 1]), num_tokens)
            out.append((begin, end, xargs))
        return out

    def before_model(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.plan = {}
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        if positions is None:
            return
        requests = self.requests(int(positions.shape[-1]))
        if not any(x and XARGS_KEY in x for _, _, x in requests):
            return
        if positions.dim() != 1:
            raise ValueError("steer_hydra steering supports 1-D token positions (text models), not M-RoPE.")
        self.plan = build_plan(requests, positions, self.num_layers)
        self.steps += bool(self.plan)

    def before_layer(self, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        if not self.plan:
            return None
        hits = [(key, value) for key, value in self.plan.items() if key[0] == layer and key[1] == "input"]
        if not hits:
            return None
        args = list(args)
        hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
        residual = args[2] if len(args) > 2 else kwargs.get("residual")
        for (_, _, preserve), (index, rows) in hits:
            hidden = add_rows(hidden, residual, index, rows, preserve)
        if len(args) > 1:
            args[1] = hidden
        else:
            kwargs["hidden_states"] = hidden
        return tuple(args), kwargs

    def after_layer(self, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        if not self.plan:
            return None
        hits = [(key, value) for key, value in self.plan.items() if key[0] == layer and key[1] == "output"]
        if not hits:
            return None
        hidden, residual = (output[0], output[1]) if isinstance(output, tuple) else (output, None)
        for (_, _, preserve), (index, rows) in hits:
            hidden = add_rows(hidden, residual, index, rows, preserve)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def decoder_layers(model: torch.nn.Module, expected: int | None) -> torch.nn.ModuleList:
    """The model's decoder-layer list: the longest `ModuleList` named `...layers` (of `expected` length if known)."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h", "blocks")
    ]
    if expected is not None:
        found = [(n, m) for n, m in found if len(m) == expected] or found
    if not found:
        raise ValueError(f"No decoder-layer ModuleList found in {type(model).__name__}; steering cannot install.")
    return max(found, key=lambda item: len(item[1]))[1]


def install(runner: Any) -> SteeringHooks | None:
    """Put the steering hooks on the runner's model (eager mode) once; returns them (also kept on the model).

    Returns None, hooking nothing, for a runner without the V1 persistent batch this reads.
    """
    missing = [name for name in ("input_batch", "query_start_loc", "requests") if not hasattr(runner, name)]
    if missing:  # another model runner (e.g. vLLM's V2): leave it alone; the client's probe reports no steering
        logger.warning(
            "steer_hydra steering: %s has no %s (vLLM's V2 model runner?); steering is off. Fix: start the engine "
            "with %s=0.",
            type(runner).__name__,
            missing,
            RUNNER_ENV,
        )
        return None
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    existing = getattr(model, _MARK, None)
    if existing is not None:  # hooked already (a reload): follow the current runner
        existing.runner = runner
        return existing
    config = getattr(getattr(runner, "model_config", None), "hf_text_config", None)
    layers = decoder_layers(model, getattr(config, "num_hidden_layers", None))
    hooks = SteeringHooks(runner, len(layers))
    model.register_forward_pre_hook(hooks.before_model, with_kwargs=True)
    for index, layer in enumerate(layers):
        layer.register_forward_pre_hook(functools.partial(hooks.before_layer, index), with_kwargs=True)
        layer.register_forward_hook(functools.partial(hooks.after_layer, index), with_kwargs=True)
    setattr(model, _MARK, hooks)
    logger.info("steer_hydra steering hooks on %d decoder layers of %s", len(layers), type(model).__name__)
    return hooks
