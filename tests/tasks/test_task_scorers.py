"""Rule scorers of the built-in tasks: concept lexicon, relevance, fluency, harmonic mean; choices and numbers."""

from __future__ import annotations

import pytest
from inspect_ai import eval as inspect_eval

from steer_hydra.evaluation.provider import as_inspect_model
from steer_hydra.tasks import mcqa
from steer_hydra.tasks.arithmetic import answer_number, first_number
from steer_hydra.tasks.concept_steering import (
    DEV_SIZE,
    concept_samples,
    concept_value,
    fluency_value,
    harmonic_value,
    instruction_value,
    split_ids,
)
from steer_hydra.tasks.concepts import load_concept
from steer_hydra.tasks.mcqa import read_choice


def test_concept_score_counts_distinct_lexicon_terms():
    weddings, pirate = load_concept("weddings").lexicon, load_concept("pirate").lexicon
    assert concept_value("Bicycles have two wheels.", weddings) == 0.0
    assert concept_value("Bicycles were ridden at the wedding.", weddings) == 0.5
    assert concept_value("The bride rode a bicycle to her weddings.", weddings) == 1.0
    assert concept_value("Arr, matey, the sea is wide.", pirate) == 1.0
    assert concept_value("Yesterday was fine.", pirate) == 0.0  # short stems match whole words only


def test_instruction_relevance_needs_the_subject():
    assert instruction_value("Cycling is healthy.", ["bicycle", "cycling"]) == 1.0
    assert instruction_value("The bride wore white.", ["bicycle", "cycling"]) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Coffee is a drink made from roasted beans, enjoyed around the world.", 1.0),
        ("", 0.0),
        ("wedding wedding wedding wedding wedding wedding wedding wedding", None),
        ("Coffee \ufffd\ufffd is good", 0.0),
        ("12 34 56 78 !! ?? ## 90", None),
    ],
)
def test_fluency_catches_degenerate_text(text, expected):
    value = fluency_value(text)
    if expected is None:
        assert value < 0.5
    else:
        assert value == expected


def test_harmonic_mean_is_zero_when_any_part_is():
    assert harmonic_value([1.0, 1.0, 1.0]) == 1.0
    assert harmonic_value([0.5, 1.0, 0.0]) == 0.0
    assert harmonic_value([0.5, 1.0, 1.0]) == pytest.approx(3 / (2 + 1 + 1))


def test_concept_splits_are_disjoint_and_fixed():
    dev, test, every = split_ids("dev"), split_ids("test"), split_ids("all")
    assert len(dev) == DEV_SIZE and len(test) >= 60 and not set(dev) & set(test)
    assert sorted(dev + test) == every
    assert [s.metadata["split"] for s in concept_samples("weddings", "dev")] == ["dev"] * DEV_SIZE
    assert all(s.metadata["runtime_kwargs"] == {"substrings": [s.input]} for s in concept_samples())
    with pytest.raises(ValueError, match="'cooking' is neither a built-in concept"):
        concept_samples("cooking")


@pytest.mark.parametrize(
    ("text", "letter"),
    [("B) Paris", "B"), ("Paris", "B"), ("The answer is C.", "C"), ("(D)", "D"), ("A", "A"), ("Rome or Paris", None)],
)
def test_read_choice_takes_a_letter_or_one_option_text(text, letter):
    assert read_choice(text, ["Rome", "Paris", "Berlin", "Madrid"]) == letter


def test_a_sentence_starting_with_the_article_a_is_not_option_a():
    assert read_choice("A bird can fly.", ["fish", "cat", "dog", "bird"]) == "D"


@pytest.mark.parametrize(("text", "value"), [("19", 19), ("It is 7.", 7), ("twelve", 12), ("no idea", None)])
def test_first_number(text, value):
    assert first_number(text) == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("14 - 3 = 11", 11),  # SmolLM2 restates the problem: the operands are not the answer
        ("3 times 3 is 9.", 9),
        ("2 * 3 = 6", 6),
        ("18 - 8 = 1.", 1),  # a wrong answer stays wrong
        ("The sum: 12 + 6 equals eighteen", 18),
        ("19", 19),
        ("It is 7, since 3 + 4 = 7", 7),  # no restatement first: the first number
        ("12 + 6 = ", None),
    ],
)
def test_answer_number_skips_a_restated_expression(text, value):
    assert answer_number(text) == value


def test_strict_choice_scoring_is_still_available(make_pipeline, tmp_path):
    model = as_inspect_model(make_pipeline())
    log = inspect_eval(
        mcqa(scorer="choice"),
        model=model,
        display="none",
        limit=2,
        max_tokens=4,
        log_dir=str(tmp_path),
        max_connections=model.api.batch_ceiling,
    )[0]
    assert log.status == "success" and [s.name for s in log.results.scores] == ["choice"]
    with pytest.raises(ValueError, match="lenient"):
        mcqa(scorer="exact")
