"""Whether two evaluations are comparable: one setting, from which a suite's protocol and a cell's key both derive.

`evaluation_setting` is the one answer to "is this the same evaluation?": everything besides the controls (which
the config_id names) and the seed that determines what a cell generates and how it is scored: the model source
(`ModelSource.identity`), the backend's kind and the options that bear on generation (`Backend.protocol_options`:
a server's address and timeouts are transport, not setting), the provider options, the generation settings, the
suite (without its retry policy, with the content digests of files its tasks read) and any extra scoring (a judge's
model role, extra scorers).

- `protocol(setting, seed=...)`: what a save_dir records per suite (`protocol/<suite>.json`), so a job with
  another setting is refused before it would resume logs made under the old one; once a model is loaded the
  backend's `identity()` joins it (a server's served model rather than its address).
- `cell_key(setting, trial_seed)`: the digest a finished cell's index holds; a cell is reused only under the same
  key. A moved server keeps both.
- `generation_scope(generation_setting, ...)`: the part of the setting that determines generations (no suite, no
  scoring), with the configuration and the trial: the scope of the generations a save_dir keeps
  (`store.generations`), so an arm that reads no concept generates once for every concept suite.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from steer_hydra.core.backend import BackendSpec
from steer_hydra.core.identity import canonical_json, canonical_value
from steer_hydra.core.source import ModelSource


def generation_setting(
    *, source: ModelSource, backend: BackendSpec, provider: Any, generate_defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """What besides the controls, the trial and the request itself determines a generation: the model source, the
    backend's kind and generation options, the provider options and the generation defaults (canonical)."""
    return canonical_value(
        {
            "model": source.identity(),
            "backend": {"kind": backend.kind, "options": backend.protocol_options()},
            "provider": provider,
            "generate_defaults": dict(generate_defaults),
        }
    )


def evaluation_setting(
    generation: Mapping[str, Any], *, suite: Mapping[str, Any], scoring: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The canonical setting of one suite's evaluation (see the module docstring): the `generation_setting`, the
    suite's identity (`InspectSuite.identity`) and extra scoring (`{"model_roles": ..., "scorers": ...}`, absent
    without any so earlier protocols and keys stay valid)."""
    return canonical_value({**generation, "suite": dict(suite), **dict(scoring or {})})


def generation_scope(generation: Mapping[str, Any], *, config_id: str, trial_id: int, trial_seed: int | None) -> str:
    """The scope of a configuration's generations in one trial (`store.generations`): the `generation_setting`,
    the configuration and the trial; no suite, no scoring, so suites that ask the same requests share them."""
    payload = canonical_json(
        {"generation": dict(generation), "config_id": config_id, "trial_id": trial_id, "trial_seed": trial_seed}
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def protocol(setting: Mapping[str, Any], *, seed: int | None, backend_identity: Any = None) -> dict[str, Any]:
    """A suite's protocol: its setting, the launch seed, and the loaded backend's identity when known."""
    record = {**setting, "seed": seed}
    if backend_identity is not None:
        record["backend"] = {**record["backend"], "identity": backend_identity}
    return canonical_value(record)


def cell_key(setting: Mapping[str, Any], trial_seed: int | None) -> str:
    """The digest a cell's index holds: its (canonical) setting and trial seed."""
    payload = canonical_json({"setting": setting, "trial_seed": trial_seed})
    return hashlib.sha256(payload.encode()).hexdigest()


def _leaves(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_leaves(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def changed_leaves(previous: Any, current: Any) -> list[str]:
    """`key.path: old -> new` for every leaf that differs between two protocols (`<absent>` for a missing leaf)."""
    before, after = _leaves(previous), _leaves(current)
    absent = "<absent>"
    return [
        f"{key}: {before.get(key, absent)!r} -> {after.get(key, absent)!r}"
        for key in sorted(set(before) | set(after))
        if before.get(key, absent) != after.get(key, absent)
    ]
