"""Concepts as data: the built-in concept files, the loader's round trip, its refusals (file, line, fix), and the
concept-steering task reading a concept file's lexicon."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from steer_hydra.tasks.concept_steering import SUBJECTS, _words, concept_steering, concept_value, instructions
from steer_hydra.tasks.concepts import (
    KINDS,
    Concept,
    ConceptFileError,
    ContrastPair,
    builtin_concepts,
    concept_actadd_prompt,
    concept_actadd_prompts,
    concept_pairs,
    concept_system_prompt,
    concept_yaml,
    load_concept,
)

BUILTIN = builtin_concepts()


def _matches(stem: str, word: str) -> bool:
    """The rule scorer's matching: a stem of 3 characters or fewer equals a word, a longer one starts it."""
    return stem == word if len(stem) <= 3 else word.startswith(stem)


# ---------------------------------------------------------------------------------------------- built-in concepts
def test_there_are_at_least_eight_built_in_concepts_of_every_kind():
    assert len(BUILTIN) >= 8 and {"weddings", "joy", "pirate"} <= set(BUILTIN)
    kinds = {load_concept(name).kind for name in BUILTIN}
    assert kinds == set(KINDS) == {"topic", "sentiment", "style", "language"}


@pytest.mark.parametrize("name", BUILTIN)
def test_a_built_in_concept_has_varied_pairs_a_lexicon_and_a_description(name):
    concept = load_concept(name)
    assert concept.name == name and concept.kind in KINDS and concept.source.endswith(f"{name}.yaml")
    assert concept.description.startswith(f"{name}: ") and "\n" not in concept.description
    pairs = concept.pairs
    assert len(pairs) >= 16
    assert len({p.positive for p in pairs}) == len(pairs) and len({p.negative for p in pairs}) == len(pairs)
    openings = {" ".join(p.positive.split()[:3]) for p in pairs}
    assert len(openings) >= len(pairs) - 2, "positives from one template teach the template, not the concept"
    assert 16 <= len(concept.lexicon) <= 30 and len(set(concept.lexicon)) == len(concept.lexicon)
    # the positives show the concept to the rule scorer, the negatives are neutral answers of similar length
    assert all(concept_value(p.positive, concept.lexicon) > 0 for p in pairs)
    assert not any(concept_value(p.negative, concept.lexicon) for p in pairs)
    ratio = sum(len(p.positive) for p in pairs) / sum(len(p.negative) for p in pairs)
    assert 0.7 < ratio < 1.6, ratio
    positive, negative = concept_actadd_prompts(name)
    assert positive != negative and concept_actadd_prompt(name, "negative") == negative
    assert concept_system_prompt(name) == concept.system_prompt and concept.system_prompt


@pytest.mark.parametrize("name", BUILTIN)
def test_a_built_in_lexicon_does_not_match_the_task_instructions_or_subjects(name):
    """A stem that matches an instruction or its subject would score the baseline's answers as steered."""
    words = {w for text in instructions().values() for w in _words(text)}
    words |= {w for subject, keywords in SUBJECTS for w in (*_words(subject), *keywords)}
    overlap = sorted((stem, word) for stem in load_concept(name).lexicon for word in words if _matches(stem, word))
    assert not overlap


def test_the_built_in_prompts_are_not_the_task_instructions():
    asked = {text.lower() for text in instructions().values()}
    assert not [p.prompt for name in BUILTIN for p in load_concept(name).pairs if p.prompt.lower() in asked]


def test_concept_pairs_are_the_dicts_caa_fits_from():
    pairs = concept_pairs("weddings")
    assert len(pairs) == 24 and set(pairs[0]) == {"prompt", "positive", "negative"}
    assert concept_pairs("weddings", limit=4) == pairs[:4]
    assert concept_pairs(load_concept("joy")) == concept_pairs("joy")  # a loaded concept passes through
    assert concept_actadd_prompts("weddings") == (
        "I talk about weddings constantly",
        "I do not talk about weddings constantly",
    )
    with pytest.raises(ValueError, match="side must be one of"):
        concept_actadd_prompt("weddings", "both")


def test_an_unknown_name_lists_the_built_in_concepts():
    with pytest.raises(ConceptFileError) as info:
        load_concept("cooking")
    assert "'cooking' is neither a built-in concept" in str(info.value) and "weddings" in str(info.value)
    assert "Fix:" in str(info.value)
    with pytest.raises(ConceptFileError, match="no such concept file"):
        load_concept("nowhere/cooking.yaml")
    with pytest.raises(ConceptFileError, match="not a YAML file"):
        load_concept(Path("cooking.json"))


# ---------------------------------------------------------------------------------------------- files of one's own
MINIMAL = """\
name: mushrooms
description: "mushrooms: fungi, foraging, caps and spores"
kind: topic
pairs:
  - prompt: What did you do this morning?
    positive: I went foraging in the woods and found a basket of chanterelle mushrooms.
    negative: I went shopping in town and found a new pair of gloves on sale.
  - prompt: What is for dinner?
    positive: A risotto with porcini mushrooms and a little thyme.
    negative: A risotto with peas and a little lemon zest.
"""


def _write(tmp_path: Path, text: str, name: str = "concept.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_concept_file_round_trips(tmp_path):
    concept = Concept(
        name="space_travel",
        description="space travel: rockets, astronauts, launches and life aboard a spacecraft",
        kind="topic",
        pairs=(
            ContrastPair(
                "How was your trip?", "Long: six months aboard the station, then re-entry.", "Long: six hours."
            ),
            ContrastPair("What's new?", "I passed the astronaut medical at last!", "I passed my driving test at last!"),
            ContrastPair(
                "Any plans?", 'A launch at dawn: "T minus ten", then orbit.', "A walk at dawn, then breakfast."
            ),
        ),
        lexicon=("rocket", "astronaut", "spacecraft", "launch", "orbit"),
        actadd=("I dream of rockets", "I dream of nothing"),
        system_prompt="Talk about space travel: rockets, astronauts, orbits.",
    )
    path = _write(tmp_path, concept_yaml(concept))
    loaded = load_concept(path)
    assert loaded == concept and loaded.source == str(path)
    assert dataclasses.asdict(loaded) == {**dataclasses.asdict(concept), "source": str(path)}
    assert load_concept(str(path)) == concept  # a path given as text


def test_optional_fields_default_from_the_name_and_description(tmp_path):
    concept = load_concept(_write(tmp_path, MINIMAL, "mushrooms.yml"))
    assert concept.name == "mushrooms" and len(concept.pairs) == 2 and concept.lexicon == ()
    assert concept.actadd == ("I talk about mushrooms constantly", "I do not talk about mushrooms constantly")
    assert "mushrooms: fungi, foraging, caps and spores" in concept.system_prompt
    assert (
        concept_pairs(str(tmp_path / "mushrooms.yml"))[1]["negative"] == "A risotto with peas and a little lemon zest."
    )


# (what to change in MINIMAL, the line the message must name, words the message must hold)
MALFORMED = [
    ("name: mushrooms\n", "name: Mush rooms\n", 1, ["name 'Mush rooms' is not a plain identifier", "lowercase"]),
    ("kind: topic\n", "kind: colour\n", 3, ["kind 'colour'", "topic, sentiment, style, language"]),
    ("kind: topic\n", "kind: topic\nlexicon: [fung]\nsource: the woods\n", 5, ["unknown key 'source'", "lexicon"]),
    ("kind: topic\n", "kind: topic\nkind: style\n", 4, ["'kind' is given twice (lines 3 and 4)"]),
    (
        "    negative: A risotto with peas and a little lemon zest.\n",
        "",
        8,
        ["pairs[1] has no 'negative'", "give each pair prompt, positive and negative"],
    ),
    (
        "    negative: A risotto with peas and a little lemon zest.\n",
        "    negative: A risotto with porcini mushrooms and a little thyme.\n",
        8,
        ["pairs[1]'s positive equals its negative", "without the concept"],
    ),
    (
        "  - prompt: What is for dinner?\n",
        "  - prompt: What did you do this morning?\n",
        8,
        ["pairs[1] repeats the prompt of pairs[0] (line 5)", "its own prompt"],
    ),
    (
        "  - prompt: What is for dinner?\n",
        "  - prompt: Write two sentences about bicycles.\n",
        8,
        ["pairs[1]'s prompt is an instruction of the concept_steering task"],
    ),
    (
        "    positive: A risotto with porcini",
        "    oops: 1\n    positive: A risotto with porcini",
        9,
        ["unknown key 'oops'"],
    ),
    ("kind: topic\n", "kind: topic\nlexicon: [fung, très]\n", 4, ["lexicon[1] 'très' can never match"]),
    (
        'description: "mushrooms: fungi, foraging, caps and spores"\n',
        "description: 42\n",
        2,
        ["description is not text"],
    ),
]


@pytest.mark.parametrize(("old", "new", "line", "expected"), MALFORMED, ids=[m[3][0] for m in MALFORMED])
def test_a_malformed_concept_is_refused_naming_the_file_the_line_and_the_fix(tmp_path, old, new, line, expected):
    assert old in MINIMAL
    path = _write(tmp_path, MINIMAL.replace(old, new, 1))
    with pytest.raises(ConceptFileError) as info:
        load_concept(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and f"(line {line})" in message and "Fix: " in message, message
    assert info.value.line == line and info.value.path == str(path)
    for text in expected:
        assert text in message, (text, message)


def _pairs_block(count: int) -> str:
    return "".join(
        f"  - prompt: Question {i}?\n    positive: About mushrooms {i}.\n    negative: About nothing {i}.\n"
        for i in range(count)
    )


@pytest.mark.parametrize(
    ("text", "line", "expected"),
    [
        ('name: x\ndescription: "x: y"\nkind: topic\npairs: []\n', 4, "pairs is empty"),
        (f'name: x\ndescription: "x: y"\nkind: topic\npairs:\n{_pairs_block(1)}', 4, "pairs has only 1 pair"),
        ('name: x\ndescription: "x: y"\nkind: topic\npairs: some\n', 4, "pairs is not a list"),
        ("- name: x\n- kind: topic\n", 1, "not a mapping of concept keys (the document is a list)"),
        ("just some words\n", 1, "not a mapping of concept keys (the document is a str)"),
        ("name: x\ndescription: [unclosed\nkind: topic\n", 3, "not valid YAML"),
        ("name: x\n  kind: topic\n", 2, "not valid YAML"),
        ('name: x\ndescription: "x: y"\npairs: []\n', 1, "no 'kind' given"),
    ],
    ids=["empty pairs", "one pair", "pairs not a list", "a list", "a string", "unclosed", "indentation", "missing"],
)
def test_structural_mistakes_are_refused_with_the_line(tmp_path, text, line, expected):
    path = _write(tmp_path, text)
    with pytest.raises(ConceptFileError) as info:
        load_concept(path)
    message = str(info.value)
    assert expected in message and f"(line {line})" in message and "Fix: " in message, message


def test_an_empty_file_is_refused(tmp_path):
    with pytest.raises(ConceptFileError, match=r"not a mapping of concept keys \(the document is empty\)"):
        load_concept(_write(tmp_path, ""))


# ---------------------------------------------------------------------------------------------- the task
def test_the_task_reads_a_concept_files_lexicon_and_description(tmp_path):
    lexicon = "lexicon: [mushroom, fung, spore, forag, cap]\n"
    path = _write(tmp_path, MINIMAL.replace("kind: topic\n", "kind: topic\n" + lexicon), "mushrooms.yaml")
    task = concept_steering(concept=str(path), split="dev")
    sample = task.dataset[0]
    assert sample.metadata["concept"] == "mushrooms"
    assert sample.metadata["concept_description"] == "mushrooms: fungi, foraging, caps and spores"
    assert sample.metadata["instruction"] == sample.input and sample.metadata["split"] == "dev"
    assert {"keywords", "runtime_kwargs"} <= set(sample.metadata)
    assert task.dataset.name == "concept_steering_mushrooms_dev"
    lexicon_stems = load_concept(path).lexicon
    text = "We went foraging for mushrooms; one cap was huge."
    assert concept_value(text, lexicon_stems) == 1.0
    assert concept_value("We went foraging for mushrooms.", load_concept("weddings").lexicon) == 0.0


def test_the_task_scores_with_the_files_lexicon(tmp_path):
    import asyncio

    from inspect_ai.model import ModelOutput
    from inspect_ai.scorer import Target
    from inspect_ai.solver import TaskState

    path = _write(tmp_path, MINIMAL.replace("kind: topic\n", "kind: topic\nlexicon: [mushroom, spore]\n"))
    task = concept_steering(concept=str(path))
    sample = task.dataset[0]
    state = TaskState(
        model="mockllm/model", sample_id=sample.id, epoch=1, input=sample.input, messages=[],
        metadata=sample.metadata, output=ModelOutput.from_content("mockllm/model", "Mushrooms release spores."),
    )  # fmt: skip
    concept_scorer = task.scorer[0]
    assert asyncio.run(concept_scorer(state, Target(""))).value == 1.0


def test_a_concept_without_a_lexicon_cannot_build_the_rule_scored_task(tmp_path):
    path = _write(tmp_path, MINIMAL)
    with pytest.raises(ConceptFileError) as info:
        concept_steering(concept=str(path))
    message = str(info.value)
    assert str(path) in message and "has no lexicon" in message and "concept_score" in message
    assert re.search(r"Fix: add `lexicon: \[stem, \.\.\.\]`.* or score the task with a model judge", message)


def test_the_study_reads_the_score_names_the_task_registers():
    from inspect_ai._util.registry import registry_info

    from steer_hydra.tasks.concept_steering import FLUENCY, OBJECTIVE, SCORES, concept_steering

    names = tuple(registry_info(s).name for s in concept_steering(split="dev").scorer)
    assert names == SCORES and OBJECTIVE in SCORES and FLUENCY in SCORES


def test_a_concept_file_is_parsed_once_while_unchanged_however_many_readers(tmp_path, monkeypatch):
    from steer_hydra.tasks import concepts as concepts_module
    from steer_hydra.tasks.concepts import concept_digest, concept_name

    path = _write(tmp_path, concept_yaml(load_concept("weddings")).replace("name: weddings", "name: my_weddings"))
    parsed = []
    read = concepts_module._read_mapping
    monkeypatch.setattr(concepts_module, "_read_mapping", lambda p: parsed.append(p) or read(p))
    for reader in (load_concept, concept_pairs, concept_digest, concept_name, concept_system_prompt, load_concept):
        reader(str(path))
    assert len(parsed) == 1
    path.write_text(path.read_text().replace("name: my_weddings", "name: other_weddings"))
    assert load_concept(str(path)).name == "other_weddings" and len(parsed) == 2  # an edited file is read again


def test_an_oversized_concept_file_is_refused_before_it_is_parsed(tmp_path, monkeypatch):
    from steer_hydra.tasks import concepts as concepts_module

    path = _write(tmp_path, concept_yaml(load_concept("weddings")))
    monkeypatch.setattr(concepts_module, "MAX_FILE_BYTES", 1024)
    monkeypatch.setattr(concepts_module, "_read_mapping", lambda p: pytest.fail("parsed an oversized file"))
    with pytest.raises(ConceptFileError, match=r"a concept file may hold at most .* Fix: keep the pairs"):
        load_concept(path)
    assert concepts_module.MAX_FILE_BYTES == 1024 and path.stat().st_size > 1024
