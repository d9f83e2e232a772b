"""Built-in tasks: registry names, datasets, the instruction checker, and per-sample runtime kwargs delivery."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import eval as inspect_eval
from inspect_ai.util import registry_info

from steer_hydra.core import InputControl
from steer_hydra.evaluation.provider import as_inspect_model
from steer_hydra.tasks import (
    INSTRUCTION_CHECKS,
    SMOKE_TASKS,
    arithmetic,
    concept_steering,
    instruction_following,
    mcqa,
    short_answer,
)
from steer_hydra.tasks.arithmetic import arithmetic_samples
from steer_hydra.tasks.concept_steering import concept_samples
from steer_hydra.tasks.instruction_following import instruction_following_samples
from steer_hydra.tasks.mcqa import mcqa_samples
from steer_hydra.tasks.short_answer import short_answer_samples


class SubstringRecorder(InputControl):
    """Declares PASTA's row-scoped `substrings` and records what each dispatch delivers."""

    RUNTIME_KWARGS_SCHEMA = [{"name": "substrings", "type": "list[str]", "scope": "row"}]
    supports_batching = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, Any]] = []

    def adapt_messages(self, messages_batch: list, runtime_kwargs: Mapping[str, Any]) -> list:
        rows = runtime_kwargs.get("substrings")
        for i, chat in enumerate(messages_batch):
            self.seen.append((chat[-1]["content"], rows[i] if rows is not None else None))
        return messages_batch


def _eval(task, pipeline, **kwargs):
    model = as_inspect_model(pipeline)
    kwargs.setdefault("max_connections", model.api.batch_ceiling)
    return inspect_eval(task, model=model, display="none", temperature=0, max_tokens=6, **kwargs)[0]


def test_tasks_are_registered_under_the_package_name():
    assert [registry_info(t).name for t in (short_answer, mcqa, instruction_following)] == list(SMOKE_TASKS)
    assert registry_info(arithmetic).name == "steer_hydra/arithmetic"
    assert registry_info(concept_steering).name == "steer_hydra/concept_steering"


@pytest.mark.parametrize(
    ("samples", "prefix"),
    [
        (short_answer_samples, "sa-"),
        (mcqa_samples, "mc-"),
        (instruction_following_samples, "if-"),
        (arithmetic_samples, "ar-"),
        (concept_samples, "cs-"),
    ],
)
def test_datasets_are_sized_for_statistics_with_fixed_ids(samples, prefix):
    first, again = samples(), samples()
    ids = [s.id for s in first]
    assert len(ids) >= 60 and len(set(ids)) == len(ids) and ids == sorted(ids)
    assert all(i.startswith(prefix) for i in ids)
    assert [(s.id, s.input, s.target) for s in again] == [(s.id, s.input, s.target) for s in first]
    assert len({s.input for s in first}) == len(first)  # no duplicated prompt


def test_the_first_hand_written_samples_keep_their_ids():
    assert short_answer_samples()[0].input == "Answer with one word only. What is the capital of France?"
    assert mcqa_samples()[0].input == "Which city is the capital of France?" and mcqa_samples()[0].target == "B"
    assert instruction_following_samples()[0].metadata["instruction"] == "Answer in lowercase letters only."


def test_mcqa_targets_are_valid_letters_and_spread():
    samples = mcqa_samples()
    for sample in samples:
        assert len(sample.choices) == 4 and sample.target in "ABCD" and len(set(sample.choices)) == 4
    assert {s.target for s in samples} == set("ABCD")


def test_arithmetic_targets_are_right():
    for sample in arithmetic_samples():
        expression = sample.input.removeprefix("What is ").split("?")[0].replace("times", "*")
        assert str(eval(expression)) == sample.target  # noqa: S307 - our own generated digits


def test_instruction_samples_carry_their_instruction_line_as_substrings():
    for sample in instruction_following_samples():
        line = sample.metadata["instruction"]
        assert sample.metadata["runtime_kwargs"] == {"substrings": [line]}
        assert sample.input.startswith(line + "\n")
        assert sample.metadata["check"] in INSTRUCTION_CHECKS


@pytest.mark.parametrize(
    ("check", "arg", "good", "bad"),
    [
        ("lowercase", "", "paris is the one", "Paris"),
        ("uppercase", "", "BLUE SKY", "Blue sky"),
        ("max_words", "3", "the wide sea", "the sea is very wide"),
        ("starts_with", "yes", "Yes, it is.", "It is, yes."),
        ("include_word", "blue", "The sky is Blue.", "The sky is bluer."),
        ("no_commas", "", "cat dog bird", "cat, dog"),
        ("ends_with", "done", "All of it is done.", "Done, all of it."),
    ],
)
def test_instruction_checks(check, arg, good, bad):
    rule = INSTRUCTION_CHECKS[check]
    assert rule(good, arg) and not rule(bad, arg)
    assert not rule("", arg)


def test_short_answer_scorer_choice():
    assert short_answer(scorer="match").scorer is not None
    with pytest.raises(ValueError, match="scorer"):
        short_answer(scorer="exact")


def test_tasks_run_by_registry_name_on_the_tiny_model(make_pipeline, tmp_path):
    pipeline = make_pipeline()
    logs = [_eval(name, pipeline, limit=2, log_dir=str(tmp_path)) for name in SMOKE_TASKS]
    assert [log.status for log in logs] == ["success"] * 3
    assert [log.eval.task for log in logs] == list(SMOKE_TASKS)
    assert [s.name for s in logs[1].results.scores] == ["letter_or_option"]
    assert all(s.scores["instruction_checker"].value in ("C", "I") for s in logs[2].samples)


def test_runtime_kwargs_reach_the_arm_row_by_row(make_pipeline, tmp_path):
    recorder = SubstringRecorder()
    log = _eval(instruction_following(), make_pipeline([recorder]), limit=4, log_dir=str(tmp_path))
    assert log.status == "success"
    expected = {s.input: [s.metadata["instruction"]] for s in instruction_following_samples()[:4]}
    assert dict(recorder.seen) == expected


def test_an_arm_without_the_kwarg_ignores_it(make_pipeline, tmp_path):
    log = _eval(instruction_following(), make_pipeline(), limit=2, log_dir=str(tmp_path))
    assert log.status == "success" and len(log.samples) == 2


def test_pasta_finds_every_instruction_line(make_pipeline, tmp_path):
    from steer_hydra.controls.state.pasta import PASTA

    pasta = PASTA(head_config=[0, 1], alpha=0.01, scale_position="exclude")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steered = _eval(instruction_following(), make_pipeline([pasta]), log_dir=str(tmp_path / "p"))
    not_found = [str(w.message) for w in caught if "substring" in str(w.message).lower()]
    assert not_found == []  # PASTA warns about a substring it cannot find in the templated prompt
    baseline = _eval(instruction_following(), make_pipeline(), log_dir=str(tmp_path / "b"))
    assert steered.status == baseline.status == "success", steered.error
    pairs = zip(steered.samples, baseline.samples, strict=True)
    assert any(a.output.completion != b.output.completion for a, b in pairs)  # the highlighted lines matter


def test_smoke_suite_is_the_smoke_option_of_the_suite_group():
    from omegaconf import OmegaConf

    from steer_hydra.tasks import smoke_suite

    suite = smoke_suite(limit=2)
    assert suite.name == "smoke" and suite.limit == 2 and suite.tasks == SMOKE_TASKS
    assert suite.generate_overrides == {"temperature": 0.0, "max_tokens": 24}
    conf = OmegaConf.load(Path(__file__).parents[2] / "steer_hydra" / "conf" / "suite" / "smoke.yaml")
    assert tuple(conf.tasks) == SMOKE_TASKS and conf.limit == smoke_suite().limit


def test_inspect_finds_the_builtin_tasks_through_the_entry_point():
    """A fresh interpreter that never imports steer_hydra.tasks still resolves `steer_hydra/<task>` by name:
    Inspect loads the package's `inspect_ai` entry point (app/inspect_entry.py), which registers them."""
    script = (
        "import sys\n"
        "from inspect_ai import eval\n"
        "from steer_hydra.core import SteeringPipeline\n"
        "from steer_hydra.evaluation import as_inspect_model\n"
        "model = as_inspect_model(SteeringPipeline('steer_hydra:tiny').steer())\n"
        "log = eval('steer_hydra/short_answer', model=model, limit=1, max_tokens=2, display='none',\n"
        "           log_dir=sys.argv[1])[0]\n"
        "loaded = [name in sys.modules for name in ('steer_hydra.tasks', 'steer_hydra.app.inspect_entry')]\n"
        "print(log.status, log.eval.task, *loaded)\n"
    )
    with tempfile.TemporaryDirectory() as logs:
        proc = subprocess.run([sys.executable, "-c", script, logs], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-4:] == ["success", "steer_hydra/short_answer", "True", "True"]
