"""PhasedDecoding: a response made of forced and generated phases (a forced prefix, a generated part, a forced suffix).

How it runs: a decoding driver. Every row of the call walks the same plan, phase by phase, in lockstep. A forced
phase appends its text's tokens (encoded without special tokens; a named phase may take a per-row text from the
`forced_texts` runtime kwarg) to every row still running, cut to what is left of `max_new_tokens`. A generated
phase rolls out every running row in one call through the pipeline's `rollout` (rows re-packed with left padding,
each row's prompt followed by its continuation so far, so the other controls' hooks, processors and criteria apply)
to the largest budget among them, with the phase's stop strings added to the call's, and cuts each row at its own
budget; greedy or sampled, the first k tokens of a longer rollout are what a k-token rollout gives, so a row decodes
the same alone or in a batch.

A generated phase ends at its token budget, at one of its stop strings (the stop text stays in the response), or
when the rollout stops the row early for any other reason (an eos id, a stop string of the call, another control's
criterion). In the last case a trailing eos id is dropped when a later phase follows, so forced text is never placed
after an end of sequence; in every case the next phase follows. The response never exceeds `max_new_tokens`: a row
that reaches it skips the remaining phases. The pipeline's rolled-out total (`Output.generated_tokens`) counts the
tokens generated, those cut off a shared rollout included; forced tokens are not rolled out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, DecodingDriver, DriverResult, row_values
from steer_hydra.core.params import DEFAULT_MAX_NEW_TOKENS
from steer_hydra.core.tensors import eos_ids, pad_left, pad_right, strip_trailing

logger = logging.getLogger(__name__)

FORCED_TEXTS = "forced_texts"
_FORCE_KEYS = frozenset({"force", "name"})
_GENERATE_KEYS = frozenset({"generate", "stop"})
# generation kwargs the driver sets itself per phase
_OWNED_KWARGS = ("max_new_tokens", "min_new_tokens", "num_return_sequences", "num_beams", "n")


@dataclass(frozen=True, slots=True)
class Forced:
    """A forced phase: `text` appended verbatim (a `name` lets a row replace it through `forced_texts`)."""

    text: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Generated:
    """A generated phase: at most `budget` tokens (None: what is left), ended early by any of `stop`."""

    budget: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    """Where one phase of one row lies in its continuation (token offsets) and how it ended.

    `ended`: `forced` (a forced phase), `budget` (a generated phase reached its budget), `stop` (one of its stop
    strings), `early` (the rollout ended it: eos, a call's stop string, another control's criterion) or `skipped`
    (`max_new_tokens` was reached before the phase).
    """

    phase: int
    start: int
    end: int
    ended: str


@dataclass(slots=True)
class _Row:
    prompt: list[int]
    texts: Mapping[str, str]
    cont: list[int] = field(default_factory=list)
    spans: list[PhaseSpan] = field(default_factory=list)


def parse_phases(phases: Sequence[Mapping[str, Any]], owner: str = "PhasedDecoding") -> tuple[Forced | Generated, ...]:
    """The plan of `phases` (`{force: text, name?}` or `{generate: budget | None, stop?: [...]}`), validated."""
    if not phases:
        raise ValueError(f"{owner}.phases is empty. Fix: e.g. phases=[{{force: 'Answer:'}}, {{generate: null}}].")
    plan: list[Forced | Generated] = []
    names: set[str] = set()
    for i, phase in enumerate(phases):
        where = f"{owner}.phases[{i}]"
        if not isinstance(phase, Mapping) or ("force" in phase) == ("generate" in phase):
            raise ValueError(
                f"{where} must be a mapping with exactly one of 'force' (text) and 'generate' (a token budget or "
                f"null); got {phase!r}. Fix: e.g. {{force: 'Answer:'}} or {{generate: 32, stop: ['\\n']}}."
            )
        if "force" in phase:
            unknown = sorted(set(phase) - _FORCE_KEYS)
            text, name = phase["force"], phase.get("name")
            if unknown or not isinstance(text, str) or (name is not None and not isinstance(name, str)):
                raise ValueError(
                    f"{where}: a forced phase is {{force: <text>, name: <optional name>}}; got {dict(phase)!r}. "
                    "Fix: give the text as a string (and only the keys force and name)."
                )
            if not text and name is None:
                raise ValueError(f"{where} forces no text. Fix: give the text, or a name to fill it per row.")
            if name is not None:
                if name in names:
                    raise ValueError(f"{where}: the phase name {name!r} is used twice. Fix: give each a unique name.")
                names.add(name)
            plan.append(Forced(text, name))
            continue
        unknown = sorted(set(phase) - _GENERATE_KEYS)
        budget, stop = phase["generate"], phase.get("stop") or []
        if unknown:
            raise ValueError(f"{where} has unknown key(s) {unknown}. Fix: a generated phase takes generate and stop.")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(
                f"{where}.generate must be a positive number of tokens or null (what is left); got {budget!r}. "
                "Fix: e.g. generate: 32."
            )
        if isinstance(stop, str) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"{where}.stop must be a list of non-empty strings; got {stop!r}. Fix: e.g. ['\\n'].")
        plan.append(Generated(budget, tuple(stop)))
    return tuple(plan)


class PhasedDecoding(DecodingDriver):
    """Phased decoding: the response is a plan of forced and generated phases spliced into one stream.

    Forced text steers what follows it (response prefilling: "Sure, here is"; a scaffold: "Answer:" then a
    generated line, then "Confidence:"), and a forced suffix ends a response in a fixed way. Test-time methods are
    plans of this kind, e.g. budget forcing (Muennighoff et al., 2025, "s1", arXiv 2501.19393: a bounded thinking
    phase, a forced closing tag, then the answer; `ThinkingBudget` adds its conditional rules) and thinking
    intervention (Wu et al., 2025, arXiv 2503.24370: forced instructions at the start of the reasoning).

    Args:
        phases: the plan, in order: `{force: <text>}` (optionally `name: <name>`, to give the text per row through
            the `forced_texts` runtime kwarg) or `{generate: <tokens or null>, stop: [<strings>]}` (null: what is
            left of `max_new_tokens`).

    Runtime kwarg `forced_texts` (row scope): `{name: text}` replacing the named forced phases' text for that row
    (one mapping for every row, or one per row).

    A decoding driver (at most one per pipeline): runs wherever rollouts do (Hugging Face, vLLM, vllm_serve);
    rows batch; no slot refill (a driver owns the decode loop).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        phases: list[dict]

        def validate(self) -> None:
            parse_phases(self.phases)

    RUNTIME_KWARGS_SCHEMA = [
        {
            "name": FORCED_TEXTS,
            "type": "dict",
            "required": False,
            "scope": "row",
            "help": "Per-row text of named forced phases ({name: text}), replacing the phase's own text.",
        }
    ]
    supports_batching = True
    supports_refill = False

    phases: list[dict]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.last_spans: tuple[tuple[PhaseSpan, ...], ...] = ()
        super().__init__(*args, **kwargs)

    def _configure(self) -> None:
        self.plan = parse_phases(self.phases)
        self._checked: set[str] = set()

    # ------------------------------------------------------------------ declarations
    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.SAMPLED_ROLLOUTS})

    def max_rollouts_per_query(self) -> int:
        """One rollout per generated phase."""
        return sum(isinstance(p, Generated) for p in self.plan)

    # ------------------------------------------------------------------ decode
    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        rollout: Callable[..., torch.Tensor],
        runtime_kwargs: Mapping[str, Any],
        tokenizer: Any,
        max_new_tokens: int | None = None,
        **gen_kwargs: Any,
    ) -> DriverResult:
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is None:
            raise ValueError("PhasedDecoding needs the model's tokenizer to encode forced text; pass tokenizer=.")
        budget = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        if budget < 1:
            raise ValueError(f"PhasedDecoding: max_new_tokens must be >= 1; got {max_new_tokens}.")
        passthrough = rollout_passthrough(gen_kwargs, "PhasedDecoding", "the plan's phases set their own budgets")
        eos = set(eos_ids(getattr(tokenizer, "eos_token_id", None), gen_kwargs.get("eos_token_id")))
        pad = tokenizer.pad_token_id
        texts = per_row_texts(runtime_kwargs, input_ids.shape[0], self.plan)
        rows = [
            _Row(prompt=[t for t, m in zip(ids, mask, strict=True) if m], texts=row_texts)
            for ids, mask, row_texts in zip(input_ids.tolist(), attention_mask.tolist(), texts, strict=True)
        ]
        for index, phase in enumerate(self.plan):
            later = index < len(self.plan) - 1
            running = [r for r in rows if len(r.cont) < budget]
            for row in rows:
                if len(row.cont) >= budget:
                    row.spans.append(PhaseSpan(index, len(row.cont), len(row.cont), "skipped"))
            if not running:
                continue
            if isinstance(phase, Forced):
                for row in running:
                    start = len(row.cont)
                    text = row.texts.get(phase.name, phase.text) if phase.name else phase.text
                    row.cont += self._encode(tokenizer, text)[: budget - start]
                    row.spans.append(PhaseSpan(index, start, len(row.cont), "forced"))
                continue
            caps = [
                budget - len(r.cont) if phase.budget is None else min(phase.budget, budget - len(r.cont))
                for r in running
            ]
            outs = roll_rows(
                rollout,
                [r.prompt + r.cont for r in running],
                caps,
                phase.stop,
                passthrough,
                pad,
                input_ids,
                attention_mask,
            )
            for row, tokens, cap in zip(running, outs, caps, strict=True):
                start = len(row.cont)
                ended = phase_end(tokenizer, tokens, cap, phase.stop)
                if ended == "early" and later and tokens and tokens[-1] in eos:
                    tokens = tokens[:-1]  # the model's end of sequence ends this phase only
                row.cont += tokens
                row.spans.append(PhaseSpan(index, start, len(row.cont), ended))
            logger.debug("PhasedDecoding phase %d: %d rows rolled out, caps %s", index, len(running), caps)
        self.last_spans = tuple(tuple(r.spans) for r in rows)
        continuation = pad_right([torch.tensor([r.cont], dtype=torch.long) for r in rows], pad).to(input_ids)
        return DriverResult(torch.cat([input_ids, continuation], dim=1))

    def _encode(self, tokenizer: Any, text: str) -> list[int]:
        if not text:
            return []
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if text not in self._checked:
            self._checked.add(text)
            if tokenizer.decode(ids, skip_special_tokens=True) != text:
                logger.warning(
                    "PhasedDecoding: the forced text %r does not decode back to itself with this tokenizer (special "
                    "tokens or normalization); the response holds its tokens, the decoded text may differ.",
                    text,
                )
        return ids


# ---------------------------------------------------------------------- shared by phased drivers
def rollout_passthrough(gen_kwargs: Mapping[str, Any], owner: str, why: str) -> dict[str, Any]:
    """The call's generation kwargs a phased driver passes to every rollout: sampling settings and eos ids; refuses
    the ones it sets itself, and decodes greedily unless the call samples (`temperature` set and not 0)."""
    owned = sorted(set(_OWNED_KWARGS) & set(gen_kwargs))
    if owned:
        raise ValueError(f"{owner} sets {owned} itself ({why}). Fix: remove them from the generate() call.")
    passthrough = dict(gen_kwargs)
    if "do_sample" not in passthrough:
        # the pipeline passes sampling settings only to a sampling call; decode greedily otherwise, on every backend
        passthrough["do_sample"] = passthrough.get("temperature") not in (None, 0, 0.0)
    return passthrough


def roll_rows(
    rollout: Callable[..., torch.Tensor],
    rows: Sequence[Sequence[int]],
    caps: Sequence[int],
    stops: Sequence[str],
    passthrough: Mapping[str, Any],
    pad: int | None,
    like_ids: torch.Tensor,
    like_mask: torch.Tensor,
    **extra: Any,
) -> list[list[int]]:
    """Roll out token rows (each a prompt followed by its continuation so far) in one call, up to the largest cap,
    and return each row's new tokens without trailing pads, cut at its own cap. `extra` reaches the rollout (e.g.
    `logits_processors` of the driver's own)."""
    ids, mask = pad_left(list(rows), pad)
    device = like_ids.device
    sequences = rollout(
        ids.to(device),
        mask.to(device=device, dtype=like_mask.dtype),
        max_new_tokens=max(caps),
        stop_strings=tuple(stops),
        **passthrough,
        **extra,
    )
    if sequences.shape[0] != len(rows):
        raise RuntimeError(f"The rollout returned {sequences.shape[0]} rows for {len(rows)} prompts.")
    new = sequences[:, ids.shape[1] :].tolist()
    return [strip_trailing(row, pad)[0][:cap] for row, cap in zip(new, caps, strict=True)]


def phase_end(tokenizer: Any, tokens: Sequence[int], cap: int, stops: Sequence[str]) -> str:
    """How a generated phase's tokens ended: `budget`, `stop` (one of `stops` in their text) or `early`."""
    if stops and any(s in tokenizer.decode(list(tokens), skip_special_tokens=True) for s in stops):
        return "stop"
    return "budget" if len(tokens) >= cap else "early"


def per_row_texts(runtime_kwargs: Mapping[str, Any], batch: int, plan: Sequence[Any]) -> list[Mapping[str, str]]:
    """Each row's `{name: text}` for the named forced phases, from the `forced_texts` runtime kwarg (a mapping for
    every row, or one mapping per row); names the plan does not have are refused."""
    value = runtime_kwargs.get(FORCED_TEXTS)
    if value is None:
        return [{}] * batch
    values = row_values(value, batch)
    if values is None and isinstance(value, (list, tuple)) and len(value) == 1:
        values = list(value) * batch
    if values is None:
        if not isinstance(value, Mapping):
            raise TypeError(
                f"PhasedDecoding: runtime kwarg {FORCED_TEXTS!r} must be a mapping {{name: text}} or one per row; "
                f"got {value!r}. Fix: e.g. {{'lead': 'Sure,'}} for a phase named lead."
            )
        values = [value] * batch
    names = {p.name for p in plan if isinstance(p, Forced) and p.name}
    out = []
    for i, texts in enumerate(values):
        texts = dict(texts or {})
        unknown = sorted(set(texts) - names)
        if unknown or not all(isinstance(t, str) for t in texts.values()):
            raise ValueError(
                f"PhasedDecoding: {FORCED_TEXTS} of row {i} is {texts!r}; it maps the names of forced phases "
                f"({sorted(names)}) to strings. Fix: name the phase (name: ...) or drop the key."
            )
        out.append(texts)
    return out
