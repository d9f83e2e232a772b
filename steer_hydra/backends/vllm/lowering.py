"""Lowering shared by the vLLM backends: `GenerationParams` to sampling fields, per-row seeds, token-id rows.

Everything here is pure (no vLLM, no network), so the mapping is unit-tested on a CPU. The same field dict
becomes `vllm.SamplingParams(**fields)` offline and the sampling part of a `/v1/completions` request body.

The table (strict: a generation kwarg without a row here raises, naming it):

| GenerationParams | vLLM field | note |
| --- | --- | --- |
| `max_new_tokens` | `max_tokens` | |
| `min_new_tokens` | `min_tokens` | only when set |
| `greedy` | `temperature: 0.0` | top-p/top-k are not sent; `n` candidates are one greedy decode, copied |
| `temperature` | `temperature` | sampling without a temperature samples at 1.0 (as on Hugging Face) |
| `top_p`, `top_k` | `top_p`, `top_k` | only when sampling and set (`top_k=0` means "off" and is not sent) |
| `repetition_penalty` | `repetition_penalty` | only when set |
| `n` | `n` | one request per prompt row; candidates come back grouped by prompt |
| `stop_strings` | `stop` + `include_stop_str_in_output: true` | ids keep the stop text, as on Hugging Face |
| `stop_token_ids` | `stop_token_ids` | |
| `seed` (+ `seed_scope`) | `seed` per row | the item seeds of the pipeline; `seed_scope` is inert |
| `extra` | (none) | refused: name the key, use backend=huggingface |

State controls lowered to the engine (CAA, ActAdd with a given vector) add `vllm_xargs` (offline: the
`SamplingParams.extra_args`) and a `cache_salt` per row: see `steer_hydra.backends.vllm.steering`.

Output controls add per-row request fields (`RequestFields`, merged by `TokenEngineBackend._run`):

| output control | request field | offline (`SamplingParams`) | server body |
| --- | --- | --- | --- |
| `ConstrainedDecoding` | `structured_outputs`: `regex`, `choice` or `json` | `StructuredOutputsParams(**it)` | as is |
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from steer_hydra.core.identity import derive_item_seed
from steer_hydra.core.params import GenerationParams
from steer_hydra.core.tensors import eos_ids

# The op name the pipeline uses for per-row seeds of a `generate()` call (`derive_item_seed(seed, op, row)`);
# engine backends derive the same seeds, so `seed_scope="dispatch"` and `"item"` give identical rows there.
ROLLOUT_SEED_OP = "rollout"
BEAM_FIX = (
    "Beam proposals (num_beams > 1, as DeAL's beam search uses) run only in process: use backend=huggingface, "
    "or a sampled proposer (do_sample=True) on this backend."
)


def refuse_extra(params: GenerationParams, backend_kind: str) -> None:
    """Raise ValueError naming every generation kwarg that has no vLLM mapping."""
    if params.extra:
        names = ", ".join(sorted(params.extra))
        raise ValueError(
            f"Generation kwarg(s) {names} have no mapping on backend {backend_kind!r} (it takes max_new_tokens, "
            "min_new_tokens, do_sample, temperature, top_p, top_k, repetition_penalty, n, seed, stop_strings, "
            "stop_token_ids). Fix: drop them, or use backend=huggingface, which passes them to model.generate."
        )


def candidates_per_request(params: GenerationParams) -> int:
    """How many candidates one request asks the engine for: `n` when sampling, 1 when greedy (then copied)."""
    return 1 if params.greedy else params.n


def sampling_fields(params: GenerationParams, *, seed: int | None = None) -> dict[str, Any]:
    """vLLM sampling fields for one prompt row (`SamplingParams(**fields)`, or a completions request body)."""
    fields: dict[str, Any] = {
        "max_tokens": params.max_new_tokens,
        "n": candidates_per_request(params),
        "include_stop_str_in_output": True,
    }
    if params.greedy:
        fields["temperature"] = 0.0
    else:
        fields["temperature"] = params.temperature if params.temperature else 1.0
        if params.top_p is not None:
            fields["top_p"] = params.top_p
        if params.top_k:
            fields["top_k"] = params.top_k
        if seed is not None:
            fields["seed"] = int(seed)
    if params.min_new_tokens:
        fields["min_tokens"] = params.min_new_tokens
    if params.repetition_penalty is not None:
        fields["repetition_penalty"] = params.repetition_penalty
    if params.stop_strings:
        fields["stop"] = list(params.stop_strings)
    if params.stop_token_ids:
        fields["stop_token_ids"] = list(params.stop_token_ids)
    return fields


def row_seeds(params: GenerationParams, seeds: Sequence[int | None], rows: int) -> list[int | None]:
    """One seed per prompt row, as the pipeline derived them (None for greedy calls).

    Engine backends set `batches_distinct_seeds`, so the pipeline derives one item seed per row whatever
    `seed_scope` says: every request carries its own seed and requests batch together anyway.
    """
    if params.greedy:
        return [None] * rows
    seeds = list(seeds) if seeds else [None] * rows
    if len(seeds) != rows:
        raise ValueError(f"Got {len(seeds)} seeds for {rows} prompt rows; pass one seed per row.")
    return seeds


def rollout_seeds(seed: int | None, call_index: int, rows: int) -> list[int | None]:
    """Per-row seeds of a driver's `call_index`-th rollout under `seed` (None: unseeded)."""
    if seed is None:
        return [None] * rows
    return [derive_item_seed(seed, f"{ROLLOUT_SEED_OP}-{call_index}", i) for i in range(rows)]


def prompt_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Each row's real tokens (the mask applied, pads dropped), as plain lists for the engine."""
    if input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ in shape."
        )
    rows = []
    for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
        row = [t for t, m in zip(ids, mask, strict=True) if m]
        if not row:
            raise ValueError("A prompt row has no real tokens (its attention mask is all zeros).")
        rows.append(row)
    return rows


def expand_candidates(per_row: Sequence[Sequence[Sequence[int]]], n: int) -> list[list[int]]:
    """Flatten per-row candidates to `rows * n` lists grouped by prompt; a single (greedy) candidate is copied."""
    flat: list[list[int]] = []
    for row, candidates in enumerate(per_row):
        if len(candidates) == 1 and n > 1:
            candidates = list(candidates) * n
        if len(candidates) != n:
            raise RuntimeError(f"The engine returned {len(candidates)} candidates for prompt row {row}; expected {n}.")
        flat.extend(list(c) for c in candidates)
    return flat


def pad_continuations(rows: Sequence[Sequence[int]], pad_token_id: int | None) -> torch.Tensor:
    """Right-pad continuation rows into one `[rows, max_len]` long tensor (width at least 1)."""
    width = max([len(r) for r in rows] + [1])
    pad = 0 if pad_token_id is None else int(pad_token_id)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
    return out


def rollout_params(
    gen_kwargs: Mapping[str, Any], *, stop_strings: Sequence[str], stop_token_ids: Sequence[int], backend_kind: str
) -> GenerationParams:
    """`GenerationParams` of a driver rollout (`model.generate`-style kwargs); beam proposals are refused.

    `eos_token_id` (an id or a list, as `model.generate` takes it) joins the stop token ids, so a proposal ends
    at any of them with the id kept, as on Hugging Face.
    """
    kwargs = dict(gen_kwargs)
    beams = kwargs.pop("num_beams", 1)
    if beams is not None and int(beams) > 1:
        raise ValueError(f"num_beams={beams} rollouts are not available on backend {backend_kind!r}. {BEAM_FIX}")
    for name in ("stop_strings", "stop_token_ids"):
        if name in kwargs:
            raise TypeError(f"Pass {name} to rollout() as its own argument, not among gen kwargs.")
    # model.generate's eos set: the engine stops on the checkpoint's eos already; extra ids become stop ids
    stops = list(stop_token_ids) + [t for t in eos_ids(kwargs.pop("eos_token_id", None)) if t not in stop_token_ids]
    params = GenerationParams.from_kwargs(
        **kwargs, stop_strings=list(stop_strings) or None, stop_token_ids=stops or None
    )
    refuse_extra(params, backend_kind)
    return params
