"""State controls lowered to vLLM: residual-stream edits (CAA, ActAdd, DirectionalAblation, ITI, CAST, angular
steering, ActivationAdapter) carried per request.

A state control that declares `adds_residual` (its whole effect is fixed `ResidualAddition` edits of decoder layers'
residual streams: CAA adds at a layer's output from a token-scope start, ActAdd a positional block at a layer's
input, DirectionalAblation projects one direction out of each layer's streams, ITI adds to chosen heads' slices of
the attention output projection's input, angular steering rotates the stream in a plane, CAST reads a condition on
the prompt and gates its addition per request) is bound at `steer()` on a model
skeleton built on the meta device from the checkpoint's config (no weights; a vector to fit comes fitted, see
`fit`), and lowered per call to the edits its `residual_edits()` returns. Each prompt row then carries them
in `SamplingParams.extra_args` (offline) or `vllm_xargs` (server) under `steer_hydra` (the edits as JSON: layer,
site, mode, rows; an angle, a gate, a threshold and a comparison where they apply) and `steer_hydra_start` (one
start position per edit, from the row's prompt length), plus a `cache_salt` naming the steering, so steered and
unsteered requests never share prefix-cache blocks. A request whose edits read a condition also carries a nonce of
its own (`steer_hydra_nonce`, in its salt too): its gate is decided from its own prompt, computed in full. The worker
side (`steer_hydra.backends.vllm.plugin`) maps the flat token batch to requests and applies the edits.

Nothing here imports vLLM: lowering and the wire format are unit-tested on a CPU. The rows are the control's own
(the tensor its hooks add, the unit direction they project out), so normalisation, strength units and sanity
directions match the Hugging Face path exactly. PASTA (attention scores) stays on backend=huggingface, and so do
vectors to fit on vllm_serve: `check()` says so.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import ResidualAddition, StateControl

logger = logging.getLogger(__name__)

XARGS_KEY = "steer_hydra"  # JSON list of additions
XARGS_START = "steer_hydra_start"  # one start position per addition
XARGS_NONCE = "steer_hydra_nonce"  # a request's own name for its gates (requests whose edits read a condition)
ENGINE_HOOK_KEY = "engine"  # the HookSet key under which lowered additions travel to `applied()`
ENV_FLAG = "STEER_HYDRA_VLLM_STEERING"  # "1" switches the worker plugin on in vLLM's processes
# vLLM 0.32 runs its V2 model runner wherever Triton is importable (every CUDA install) unless this is "0"; the worker
# plugin hooks the V1 runner's persistent batch, so steered engines run V1.
RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
V1_RUNNER = "v1"
PROBE_SCALE = 1000.0  # per-dimension scale of the additions that check the engine really steers
_ENCODED: dict[bytes, tuple[str, str]] = {}  # additions' content digest -> (payload, its sha256); see `encoded`
_ENCODED_LOCK = threading.Lock()
_CURRENT: contextvars.ContextVar[tuple[ResidualAddition, ...]] = contextvars.ContextVar(
    "steer_hydra_engine_steering", default=()
)


def forced_v2_runner(environ: Mapping[str, str] | None = None) -> str | None:
    """The value of `RUNNER_ENV` when it asks for vLLM's V2 model runner (anything but unset, empty or false)."""
    value = (os.environ if environ is None else environ).get(RUNNER_ENV, "")
    return value if value.strip().lower() not in ("", "0", "false", "no", "off") else None


def forced_v2_problem(value: str) -> str:
    """One line: why a forced V2 runner is refused, and the fix."""
    return (
        f"{RUNNER_ENV}={value} forces vLLM's V2 model runner, whose batch layout steer_hydra's in-engine steering "
        f"does not read, so steered arms would run unsteered (and arms of one study would mix runners). Fix: unset "
        f"{RUNNER_ENV} (backend=vllm then runs its engine with {RUNNER_ENV}=0, vLLM's V1 runner)."
    )


@contextlib.contextmanager
def steering_engine_environment() -> Iterator[None]:
    """The environment a steering engine boots in (its processes inherit it): the worker plugin on (`ENV_FLAG=1`)
    and the V1 model runner (`RUNNER_ENV=0`). Raises ValueError when `RUNNER_ENV` forces V2; restores both after."""
    forced = forced_v2_runner()
    if forced is not None:
        raise ValueError(forced_v2_problem(forced))
    saved = {name: os.environ.get(name) for name in (ENV_FLAG, RUNNER_ENV)}
    os.environ.update({ENV_FLAG: "1", RUNNER_ENV: "0"})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def wire(addition: ResidualAddition) -> dict[str, Any]:
    """The JSON form the worker reads (floats written exactly: float32 values round-trip through float64; the
    angle and threshold are Python floats); fields at their defaults are left out."""
    item: dict[str, Any] = {
        "layer": addition.layer,
        "site": addition.site,
        "mode": addition.mode,
        "preserve_norm": addition.preserve_norm,
        "rows": addition.rows.double().tolist(),
    }
    if addition.mode in ("rotate", "rotate_to"):
        item["angle"] = float(addition.angle)
    if addition.gate is not None:
        item["gate"] = addition.gate
    if addition.mode == "condition":
        item["threshold"] = float(addition.threshold)
        item["comparison"] = addition.comparison
    return item


def is_lowerable(control: Any) -> bool:
    """Whether the vLLM backends can run `control` inside the engine (a state control declaring `adds_residual`)."""
    return isinstance(control, StateControl) and control.adds_residual


def needs_fit(control: Any) -> bool:
    """Whether an engine backend fits `control`'s vector on the Hugging Face model first (`fit`): a control the
    engine runs that fits from hidden states (CAA with `data=`, ActAdd with a prompt pair)."""
    return is_lowerable(control) and Capability.HIDDEN_CAPTURE in control.requirements()


def lowered_requirements(control: Any) -> frozenset[Capability]:
    """A lowerable control needs no in-process torch; fitting its vector still needs hidden-state capture."""
    needs = control.requirements()
    return needs - {Capability.IN_PROCESS_TORCH} if is_lowerable(control) else needs


def meta_skeleton(model_path: str, trust_remote_code: bool) -> torch.nn.Module:
    """The checkpoint's architecture on the meta device (no weights, no memory): a layout for binding controls."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def bind(control: Any, skeleton: torch.nn.Module, tokenizer: Any, backend_kind: str, **steer_kwargs: Any) -> None:
    """Bind a lowerable control (layer, vector, scaling) on the skeleton; a vector still to fit must come fitted
    (`fitted_vector=`, see `fit`), else it is refused naming why."""
    name = type(control).__name__
    if Capability.HIDDEN_CAPTURE in control.requirements() and steer_kwargs.get("fitted_vector") is None:
        raise ValueError(
            f"{name} fits its vector from hidden states, which backend={backend_kind} cannot capture. Fix: use "
            f"backend=vllm (it fits on the Hugging Face model of the same checkpoint first), or fit it on "
            f"backend=huggingface, save it (SteeringVector.save) and pass {name}(steering_vector=PATH)."
        )
    control.steer(skeleton, tokenizer=tokenizer, backend=backend_kind, **steer_kwargs)


def lower(control: StateControl) -> tuple[ResidualAddition, ...]:
    """The edits a bound control makes on every request, in order (none when it changes nothing, e.g. CAA at
    multiplier 0)."""
    return tuple(control.residual_edits())


def encoded(additions: Sequence[ResidualAddition]) -> tuple[str, str]:
    """The additions' JSON payload and its sha256, built once per distinct additions: every row of a call and every
    call of a job carry the same ones (CAA at every layer of a small model writes ~0.3 MB of JSON)."""
    key = hashlib.sha256()
    for a in additions:
        rows = a.rows.detach().cpu().contiguous()
        key.update(f"{a.layer}|{a.site}|{a.mode}|{a.preserve_norm}|{rows.dtype}|{tuple(rows.shape)}|".encode())
        key.update(f"{float(a.angle)!r}|{a.gate}|{float(a.threshold)!r}|{a.comparison}|".encode())
        key.update(rows.view(torch.uint8).numpy().tobytes())
    digest = key.digest()
    with _ENCODED_LOCK:
        found = _ENCODED.get(digest)
    if found is None:
        payload = json.dumps([wire(a) for a in additions], separators=(",", ":"))
        found = payload, hashlib.sha256(payload.encode()).hexdigest()
        with _ENCODED_LOCK:
            if len(_ENCODED) >= 64:
                _ENCODED.clear()
            _ENCODED[digest] = found
    return found


def steering_fields(additions: Sequence[ResidualAddition], prompt_length: int) -> dict[str, Any]:
    """Request fields for one prompt row: `vllm_xargs` (the additions and their starts) and a `cache_salt`; with a
    condition among them, a fresh nonce in both (no prefix-cache block is shared with another request, so the
    worker computes, and reads, every prompt position)."""
    if not additions:
        return {}
    payload, payload_digest = encoded(additions)
    starts = [a.start(prompt_length) for a in additions]
    xargs: dict[str, Any] = {XARGS_KEY: payload, XARGS_START: starts}
    nonce = ""
    if any(a.mode == "condition" for a in additions):
        nonce = xargs[XARGS_NONCE] = secrets.token_hex(12)
    salt = hashlib.sha256(f"{payload_digest}{json.dumps(starts)}{nonce}".encode()).hexdigest()[:32]
    return {"vllm_xargs": xargs, "cache_salt": f"steer_hydra-{salt}"}


def current_additions() -> tuple[ResidualAddition, ...]:
    """The additions applied to the calls running in this context (set by `applied()`)."""
    return _CURRENT.get()


@contextlib.contextmanager
def applying(additions: Sequence[ResidualAddition]) -> Iterator[None]:
    """Make `additions` the current ones for the body (a context variable: concurrent calls do not mix)."""
    token = _CURRENT.set(tuple(additions))
    try:
        yield
    finally:
        _CURRENT.reset(token)


class EngineSteering:
    """Mixin of the engine backends: lowers layer-vector controls to per-request additions inside vLLM."""

    kind: str
    model_path: str | None
    tokenizer: Any
    # whether a vector to fit is fitted on the Hugging Face model of the engine's checkpoint (`fit`): the
    # in-process engine has that checkpoint locally; a server's may live elsewhere (`fits_vectors_with`)
    fits_vectors: ClassVar[bool] = False

    @classmethod
    def fits_vectors_with(cls, options: Mapping[str, Any] | None) -> bool:
        """Whether vectors to fit are fitted on the checkpoint's Hugging Face model with these options."""
        return cls.fits_vectors

    @classmethod
    def requirements_of(cls, control: Any, options: Mapping[str, Any] | None = None) -> frozenset[Capability]:
        needs = lowered_requirements(control)
        fits = cls.fits_vectors_with(options) and is_lowerable(control)
        return needs - {Capability.HIDDEN_CAPTURE} if fits else needs

    def steer_control(self, control: Any, tokenizer: Any, **steer_kwargs: Any) -> Any:
        if not is_lowerable(control):
            return control.steer(None, tokenizer=tokenizer, backend=self.kind, **steer_kwargs)
        if self.model_path is None:
            raise ValueError(f"backend={self.kind} lowers {type(control).__name__} from model_name_or_path=; none.")
        trust_remote_code = getattr(self, "_trust_remote_code", False)
        from steer_hydra.backends.vllm.fit import fitted_for_engine

        if needs_fit(control) and self.fits_vectors_with(self.options):
            steer_kwargs["fitted_vector"] = fitted_for_engine(
                control,
                self.model_path,
                tokenizer,
                trust_remote_code=trust_remote_code,
                dtype=getattr(self, "_model_dtype", None),
            )
        skeleton = getattr(self, "_skeleton", None)
        if skeleton is None:
            skeleton = self._skeleton = meta_skeleton(self.model_path, trust_remote_code)
        bind(control, skeleton, tokenizer, self.kind, **steer_kwargs)
        return None

    def state_hooks(self, control: Any, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any):
        if not is_lowerable(control):
            return control.get_hooks(input_ids, runtime_kwargs, **kwargs)
        edits = lower(control)
        return {ENGINE_HOOK_KEY: list(edits)} if edits else {}

    @contextlib.contextmanager
    def applied(self, hooks: Sequence[Mapping[str, Any]]) -> Iterator[None]:
        if any(any(h.get(k) for k in ("pre", "forward", "backward", "context")) for h in hooks):
            raise RuntimeError(f"Backend {self.kind!r} cannot apply in-process hooks; use backend=huggingface.")
        additions = [a for h in hooks for a in h.get(ENGINE_HOOK_KEY, ())]
        with applying(additions):
            yield

    def _steering_fields(self, prompts: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        """Per-row steering fields for the additions current in this context (empty dicts when none)."""
        additions = current_additions()
        if additions and prompts and not getattr(self, "_steering_verified", False):
            self._verify_steering(list(prompts[0]), int(additions[0].rows.shape[-1]))
        return [steering_fields(additions, len(p)) for p in prompts]

    def _verify_steering(self, prompt: list[int], hidden_size: int) -> None:
        """Once per backend: two large random additions must change a greedy decode, else the engine ignores them.

        An engine without the worker plugin (steer_hydra not installed where the server runs, the env flag unset,
        or a compiled model) would otherwise return unsteered text for steered arms, silently.
        """
        base = {"max_tokens": 4, "n": 1, "temperature": 0.0, "include_stop_str_in_output": True}
        fields = [dict(base)]
        for seed in (1, 2):
            rows = torch.randn(1, hidden_size, generator=torch.Generator().manual_seed(seed)) * PROBE_SCALE
            probe = ResidualAddition(0, "output", "from", rows, "all")
            fields.append(base | steering_fields([probe], len(prompt)))
        plain, *probed = self._complete([prompt] * len(fields), fields)
        if all(p == plain for p in probed):
            raise RuntimeError(
                f"backend={self.kind}: the engine ignored steering (a probe addition of norm ~{PROBE_SCALE:g}*sqrt(d) "
                f"left a greedy decode unchanged). Fix: install steer_hydra in the engine's environment and start it "
                f"with {ENV_FLAG}=1, vLLM's V1 model runner and eager mode "
                f"(e.g. `{ENV_FLAG}=1 {RUNNER_ENV}=0 vllm serve MODEL --enforce-eager`)."
            )
        self._steering_verified = True
