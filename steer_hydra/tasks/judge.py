"""`concept_judge`: AxBench's model judge for the concept-steering task, as an Inspect scorer.

What is rated: three questions about each answer, each asked of the judge in a prompt of its own and rated 0, 1
or 2 after the judge's reasoning:

- `judge_concept`: is the concept (the sample's `concept_description`) incorporated in the answer?
- `judge_instruction`: is the answer relevant to the instruction (`instruction`, else the sample's input)?
- `judge_fluency`: is the answer fluent?

`judge_harmonic` is AxBench's aggregate: the harmonic mean of the three ratings divided by 2 (so in [0, 1]), 0 when
any rating is 0.

Answer format: every prompt ends by asking for a last line `Rating: X` with X one of 0, 1, 2 (`RATING_LINE`). The
last non-empty line of the reply must be exactly that (spaces around it aside); anything else is unparseable. An
unparseable reply is followed up once in the same conversation asking for that line alone; a second unparseable
reply leaves the rating unscored.

Unscored: an unscored rating is NaN in the score's value (Inspect's sentinel for "no value": dict metrics skip it
and count it as unscored, and the project's log readers turn it into a NaN column cell), and so is the harmonic
mean of a sample with any unscored rating. It never enters a mean as 0. The `unscored` metric counts the samples
whose harmonic mean is unscored.

The judge: the model bound to Inspect's model role "judge" (`eval(..., model_roles={"judge": ...})`,
`score(..., model_roles=...)`). Without that role the scorer raises `JudgeNotBoundError`: it never falls back to
the model under test.

Cache: every judge call goes through Inspect's generate cache (`CachePolicy`, no expiry, not per epoch) with the
judge's identity (its model name, base URL and model args) as a cache scope, so judging an unchanged answer again
makes no judge call. The name must identify the judge's weights: `steer_hydra/<model option>` judges are named by
their model option and a digest of its config.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from inspect_ai.model import (
    CachePolicy,
    ChatMessage,
    ChatMessageAssistant,
    ChatMessageUser,
    GenerateConfig,
    Model,
    model_roles,
)
from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, mean, metric, scorer, stderr
from inspect_ai.solver import TaskState
from inspect_ai.util import registry_info

PACKAGE = "steer_hydra"
JUDGE_ROLE = "judge"
SCORER_NAME = "concept_judge"
JUDGED_TASKS = ("steer_hydra/concept_steering",)  # tasks whose samples carry the metadata the judge reads
CRITERIA = ("concept", "instruction", "fluency")
RATING_KEYS = tuple(f"judge_{criterion}" for criterion in CRITERIA)
HARMONIC_KEY = "judge_harmonic"
SCORE_KEYS = (*RATING_KEYS, HARMONIC_KEY)
RATINGS = (0, 1, 2)
# criterion -> (the concept task's rule score, the judge's score of the same criterion): what agreement compares
RULE_PAIRS = {
    "concept": ("concept_score", "judge_concept"),
    "instruction": ("instruction_score", "judge_instruction"),
    "fluency": ("fluency_score", "judge_fluency"),
    "harmonic": ("concept_harmonic", HARMONIC_KEY),
}
RATING_LINE = re.compile(r"Rating:\s*([012])")

_FORMAT = (
    "First explain your reasoning in a few sentences. Then end your reply with one last line of exactly this "
    "form, with nothing after it:\nRating: X\nwhere X is 0, 1 or 2."
)

PROMPTS = {
    "concept": (
        "You are an impartial judge. Read the text below and decide how strongly it brings in this concept:\n"
        "{concept_description}\n\n"
        "[TEXT]\n{answer}\n[END OF TEXT]\n\n"
        "Ratings:\n"
        "0 - the concept does not appear in the text.\n"
        "1 - the concept appears only briefly, vaguely or in passing.\n"
        "2 - the concept is clearly present and plays a real part in the text.\n\n"
        "Rate the concept only, not the quality of the text or what else it is about. " + _FORMAT
    ),
    "instruction": (
        "You are an impartial judge. Read the instruction and the response below and decide whether the response "
        "answers the instruction.\n\n"
        "[INSTRUCTION]\n{instruction}\n[END OF INSTRUCTION]\n\n"
        "[RESPONSE]\n{answer}\n[END OF RESPONSE]\n\n"
        "Ratings:\n"
        "0 - the response ignores the instruction or is unrelated to it.\n"
        "1 - the response is loosely related to the instruction or answers only part of it.\n"
        "2 - the response clearly answers the instruction.\n\n"
        "Rate relevance only: a response may also talk about other things, which lowers the rating only when it "
        "stops answering the instruction. " + _FORMAT
    ),
    "fluency": (
        "You are an impartial judge. Read the text below and decide how fluent it is.\n\n"
        "[TEXT]\n{answer}\n[END OF TEXT]\n\n"
        "Ratings:\n"
        "0 - not fluent: broken sentences, gibberish or heavy repetition.\n"
        "1 - somewhat fluent: understandable, with awkward wording or some repetition.\n"
        "2 - fluent: natural, well-formed language.\n\n"
        "Rate fluency only, not the content or whether it is on topic. " + _FORMAT
    ),
}
FOLLOW_UP = (
    "Your reply did not end with a line of the form `Rating: X` (X is 0, 1 or 2). Reply with that one line only."
)


class JudgeNotBoundError(RuntimeError):
    """The judge scorer ran without a model bound to the "judge" role."""


def parse_rating(reply: str) -> int | None:
    """The rating on the reply's last non-empty line when that line is exactly `Rating: X` (X in 0, 1, 2), else
    None."""
    lines = [line.strip() for line in reply.strip().splitlines() if line.strip()]
    if not lines:
        return None
    found = RATING_LINE.fullmatch(lines[-1])
    return int(found.group(1)) if found else None


def judge_harmonic(ratings: Sequence[float]) -> float:
    """AxBench's aggregate of three 0/1/2 ratings: the harmonic mean of the ratings / 2, 0 when any is 0, NaN when
    any is unscored (NaN)."""
    values = [float(r) for r in ratings]
    if any(math.isnan(v) for v in values):
        return math.nan
    if any(v <= 0 for v in values):
        return 0.0
    return len(values) / sum(2.0 / v for v in values)


def is_unscored(value: Any) -> bool:
    """Whether a judge score's value (or a bare NaN) lacks its harmonic mean."""
    if isinstance(value, Mapping):
        value = value.get(HARMONIC_KEY, math.nan)
    return isinstance(value, float) and math.isnan(value)


def _pinned(decorate: Any, func: Any, name: str) -> Any:
    """`decorate(name=...)(func)` registered as `steer_hydra/<name>` whether or not Inspect detects the installed
    package (from a checkout's root it registers bare names; see `registry.builtin_task`)."""
    registered = decorate(name=name)(func)
    qualified = f"{PACKAGE}/{name}"
    if registry_info(registered).name != qualified:
        registered = decorate(name=qualified)(func)
    return registered


def _unscored() -> Metric:
    """How many samples the judge left unscored (a rating it never gave in the answer format)."""

    def compute(scores: list[SampleScore]) -> float:
        return float(sum(1 for sample_score in scores if is_unscored(sample_score.score.value)))

    return compute


unscored = _pinned(metric, _unscored, "unscored")


def judge_model() -> Model:
    """The model bound to the "judge" role (the first one when a list is bound); `JudgeNotBoundError` when none is."""
    bound = model_roles().get(JUDGE_ROLE)
    if isinstance(bound, list):
        bound = bound[0] if bound else None
    if bound is None:
        raise JudgeNotBoundError(
            f"{SCORER_NAME} needs a judge model, and no model is bound to Inspect's model role {JUDGE_ROLE!r}; it "
            "never falls back to the model under test. Fix: judge=<model> (e.g. python -m steer_hydra "
            "suite=concept_steering judge=openai/gpt-4o-mini, or python -m steer_hydra.rescore <dir> "
            "judge=<model>); from Python pass model_roles={'judge': <model>} to eval(), eval_set() or score()."
        )
    return bound


def judge_identity(model: Model) -> str:
    """What identifies a judge in its cache key: its name, base URL and model args (a digest of their JSON form;
    a value JSON cannot hold, e.g. a function, counts by its type)."""
    args = json.dumps(getattr(model, "model_args", None) or {}, sort_keys=True, default=lambda v: type(v).__name__)
    base_url = getattr(getattr(model, "api", None), "base_url", None)
    return f"{model}|{base_url or ''}|{hashlib.sha256(args.encode()).hexdigest()[:16]}"


def _sample_fields(state: TaskState) -> dict[str, str]:
    metadata = state.metadata or {}
    description = metadata.get("concept_description")
    if not isinstance(description, str) or not description.strip():
        raise ValueError(
            f"{SCORER_NAME}: sample {state.sample_id!r} has no 'concept_description' in its metadata (one line "
            "describing the concept, which the judge is shown). Fix: run the concept-steering task of this version, "
            "which records it in every sample (re-run the job into a new save_dir), or add the key to your task's "
            "sample metadata."
        )
    instruction = metadata.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        instruction = state.input_text
    return {"concept_description": description.strip(), "instruction": instruction}


async def _rate(
    judge: Model, prompt: str, config: GenerateConfig, cache: CachePolicy | bool
) -> tuple[float, list[str]]:
    """`(rating or NaN, the judge's replies)`: one call, and one follow-up when the reply is unparseable."""
    messages: list[ChatMessage] = [ChatMessageUser(content=prompt)]
    replies: list[str] = []
    for attempt in range(2):
        output = await judge.generate(messages, config=config, cache=cache)
        reply = output.completion
        replies.append(reply)
        rating = parse_rating(reply)
        if rating is not None:
            return float(rating), replies
        if attempt == 0:
            messages = [*messages, ChatMessageAssistant(content=reply), ChatMessageUser(content=FOLLOW_UP)]
    return math.nan, replies


def _concept_judge(
    max_tokens: int = 512,
    temperature: float = 0.0,
    cache: bool = True,
    timeout: int | None = None,
    attempt_timeout: int | None = None,
    max_retries: int | None = None,
) -> Scorer:
    """AxBench's model judge (see the module): `judge_concept`, `judge_instruction`, `judge_fluency` (0/1/2, NaN
    when unscored) and `judge_harmonic`, from the model bound to the "judge" role.

    Args:
        max_tokens: the judge's token budget per reply (its reasoning and the rating line).
        temperature: the judge's sampling temperature (0: greedy).
        cache: keep judge replies in Inspect's generate cache (keyed by the judge's identity), so judging the same
            answer again makes no call.
        timeout: seconds one judge call may take over all its attempts (Inspect's `GenerateConfig.timeout`); None
            leaves Inspect's default, which for a provider that never answers is no limit.
        attempt_timeout: seconds one attempt may take before it is abandoned and retried.
        max_retries: retries of a failed or abandoned attempt (None: Inspect's default, unlimited for some
            providers).
    """
    config = GenerateConfig(
        max_tokens=max_tokens,
        temperature=temperature,
        timeout=timeout,
        attempt_timeout=attempt_timeout,
        max_retries=max_retries,
    )

    async def score(state: TaskState, target: Target) -> Score:
        judge = judge_model()
        fields = _sample_fields(state)
        answer = state.output.completion if state.output is not None else ""
        policy: CachePolicy | bool = (
            CachePolicy(expiry=None, per_epoch=False, scopes={JUDGE_ROLE: judge_identity(judge)}) if cache else False
        )
        values: dict[str, float] = {}
        replies: dict[str, list[str]] = {}
        for criterion, key in zip(CRITERIA, RATING_KEYS, strict=True):
            prompt = PROMPTS[criterion].format(answer=answer, **fields)
            values[key], replies[criterion] = await _rate(judge, prompt, config, policy)
        values[HARMONIC_KEY] = judge_harmonic([values[key] for key in RATING_KEYS])
        ratings = {key: (int(v) if not math.isnan(v) else v) for key, v in values.items() if key in RATING_KEYS}
        unscored_criteria = [c for c, key in zip(CRITERIA, RATING_KEYS, strict=True) if math.isnan(values[key])]
        explanation = "\n\n".join(f"{criterion}: {replies[criterion][-1]}" for criterion in CRITERIA)
        return Score(
            value={**ratings, HARMONIC_KEY: values[HARMONIC_KEY]},
            answer=answer,
            explanation=explanation,
            metadata={"judge": str(judge), "replies": replies, "unscored": unscored_criteria},
        )

    return score


concept_judge = _pinned(
    lambda name: scorer(metrics=[unscored(), {key: [mean(), stderr()] for key in SCORE_KEYS}], name=name),
    _concept_judge,
    SCORER_NAME,
)
