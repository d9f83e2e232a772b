"""Concept sets from published datasets: AxBench's Concept500 and SteerEval layouts (tiny fixtures written in the
published columns, never a download), what a dataset concept takes from its dataset, the rows and concepts left
out with their file/row/column and fix, `concepts_limit`, the Hub path (cache, offline, timeout) and the task asking
a dataset concept's own instructions while the built-in concepts keep theirs."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pandas as pd
import pytest

from steer_hydra.study.plan import StudyPlan
from steer_hydra.tasks import concept_sets
from steer_hydra.tasks.concept_sets import derive_lexicon, instruction_keywords, load_concept_set
from steer_hydra.tasks.concept_steering import concept_samples, concept_steering, concept_value, split_ids
from steer_hydra.tasks.concepts import (
    ConceptFileError,
    ConceptSetError,
    ContrastPair,
    concept_digest,
    concept_name,
    concept_pairs,
    concept_system_prompt,
    expand_concepts,
    load_concept,
)
from steer_hydra.testing.concept_datasets import (
    AXBENCH_CONCEPTS,
    STEEREVAL_DOMAINS,
    axbench_frames,
    write_axbench,
    write_steereval,
)


@pytest.fixture
def axbench(tmp_path) -> str:
    """The AxBench fixture in the Hub's arrangement (`<root>/2b/l10/{train,test}/data.parquet`)."""
    write_axbench(tmp_path / "concept500" / "2b" / "l10")
    return f"axbench:{tmp_path / 'concept500' / '2b' / 'l10'}"


@pytest.fixture
def steereval(tmp_path) -> str:
    write_steereval(tmp_path / "SteerEval")
    return f"steereval:{tmp_path / 'SteerEval'}"


# ---------------------------------------------------------------------------------------------- AxBench
def test_an_axbench_subset_loads_its_concepts_from_the_training_rows_and_the_evaluation_file(axbench):
    loaded = load_concept_set(axbench)
    assert loaded.keys == ("3", "7")  # concept 11 has one positive row: left out
    train, test = axbench_frames()
    train_outputs = {row["output"] for row in train}
    test_inputs = {row["input"] for row in test}
    for (concept_id, text, _, positives, instructions), concept in zip(AXBENCH_CONCEPTS, loaded.concepts, strict=True):
        assert concept.name.startswith(f"axbench_{concept_id}_") and concept.description == text
        assert concept.kind == "topic" and text in concept.system_prompt and text in concept.actadd[0]
        # pairs: the concept's positive rows (the one with an empty output left out), each with a negative answer
        assert [(p.prompt, p.positive) for p in concept.pairs] == positives
        assert all(p.negative in train_outputs and p.negative not in dict(positives).values() for p in concept.pairs)
        assert not {p.prompt for p in concept.pairs} & test_inputs  # nothing of evaluation reaches training
        # instructions: the concept's positive evaluation inputs, halved into dev and test
        asked = [item.text for item in concept.instructions]
        assert sorted(asked) == sorted(instructions)
        splits = [item.split for item in concept.instructions]
        assert splits.count("dev") == splits.count("test") == len(instructions) // 2
        assert [item.id for item in concept.instructions] == ["dev-001", "dev-002", "test-001", "test-002"]
        assert all(item.keywords for item in concept.instructions)
        # the derived lexicon sees the concept in every positive and in no negative
        assert concept.lexicon and all(concept_value(p.positive, concept.lexicon) > 0 for p in concept.pairs)
        assert not any(concept_value(p.negative, concept.lexicon) for p in concept.pairs)
        assert not any(concept_value(text, concept.lexicon) for text in asked)
    assert load_concept_set(axbench).concepts == loaded.concepts  # the same split every time


def test_an_unusable_row_and_concept_are_named_with_the_file_row_column_and_fix(axbench, caplog):
    loaded = load_concept_set(axbench)
    train_file = axbench.removeprefix("axbench:") + "/train/data.parquet"
    assert f"{train_file} row 2 (column 'output'): empty. Fix: write the output text or drop the row" in loaded.skipped
    (few,) = [line for line in loaded.skipped if line.startswith("concept 11 ")]
    assert "only 1 usable training pair(s), fewer than 2. Fix:" in few
    with caplog.at_level(logging.WARNING):
        references = expand_concepts([axbench])
    assert len(references) == 2  # the rest of the set runs
    (warning,) = [r.message for r in caplog.records if "left out" in r.message]
    assert "left out 2 unusable" in warning and f"{train_file} row 2 (column 'output')" in warning
    with pytest.raises(ConceptFileError, match=r"@11: concept 11 .* fewer than 2"):
        load_concept(f"{axbench}@11")


def test_a_missing_column_refuses_the_file_naming_the_column_and_the_layout(tmp_path):
    folder = write_axbench(tmp_path / "subset", drop_column="category")
    with pytest.raises(ConceptFileError) as refused:
        load_concept_set(f"axbench:{folder}")
    message = str(refused.value)
    assert str(folder / "train" / "data.parquet") in message and "no column 'category'" in message
    assert "Fix: give AxBench's layout: the columns input, output, output_concept, category, concept_id" in message
    assert "\n" not in message


def test_the_repository_arrangement_reads_the_metadata_concept_text(tmp_path):
    """axbench/concept500/prod_2b_l10_v1/{generate/train_data.parquet, inference/latent_eval_data.parquet,
    generate/metadata.jsonl}: the metadata's concept text is the description."""
    subset = tmp_path / "prod_2b_l10_v1"
    (subset / "generate").mkdir(parents=True)
    (subset / "inference").mkdir()
    train, test = axbench_frames()
    pd.DataFrame(train).to_parquet(subset / "generate" / "train_data.parquet")
    pd.DataFrame(test).to_parquet(subset / "inference" / "latent_eval_data.parquet")
    lines = [
        {"concept_id": 3, "concept": "gardening, flowers and flowerbeds", "ref": "-", "concept_genres_map": {}},
        {"concept_id": 7, "concept": "sailing and harbours", "ref": "-", "concept_genres_map": {}},
    ]
    (subset / "generate" / "metadata.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    loaded = load_concept_set(f"axbench:{subset}")
    assert [c.description for c in loaded.concepts] == ["gardening, flowers and flowerbeds", "sailing and harbours"]
    assert [len(c.pairs) for c in loaded.concepts] == [3, 3]


def test_a_folder_of_several_subsets_is_refused_listing_them(tmp_path):
    write_axbench(tmp_path / "c500" / "2b" / "l10")
    write_axbench(tmp_path / "c500" / "9b" / "l20")
    with pytest.raises(ConceptFileError, match=r"several AxBench subsets \(2b/l10, 9b/l20\)\. Fix: name one: "):
        load_concept_set(f"axbench:{tmp_path / 'c500'}")


def test_a_dataset_concept_reaches_the_controls_and_the_digest_through_its_reference(axbench, tmp_path):
    reference = f"{axbench}@7"
    concept = load_concept(reference)
    assert concept_name(reference) == concept.name and concept.source == reference
    assert concept == load_concept_set(axbench).concepts[1]  # a job's read of one concept gives the same concept
    assert concept_pairs(reference) == [p.as_dict() for p in concept.pairs]
    assert concept_pairs(reference)[0] == {
        "prompt": "What did you do last summer?",
        "positive": AXBENCH_CONCEPTS[1][3][0][1],
        "negative": concept.pairs[0].negative,
    }
    assert concept_system_prompt(reference) == concept.system_prompt
    before = concept_digest(reference)
    folder = Path(axbench.removeprefix("axbench:"))
    train, test = axbench_frames()
    train[0]["output"] = "I spent it gardening among the roses and the tulips."
    time.sleep(0.01)
    pd.DataFrame(train).to_parquet(folder / "train" / "data.parquet")
    assert concept_digest(reference) == before  # concept 3's row changed, not 7's
    assert load_concept(f"{axbench}@3").pairs[0].positive == "I spent it gardening among the roses and the tulips."


def test_an_unknown_concept_or_a_set_given_as_one_concept_is_refused_with_the_fix(axbench):
    with pytest.raises(ConceptFileError, match=r"no concept '42' .* \(its concepts: 3, 7, 11\)\. Fix: name a concept"):
        load_concept(f"{axbench}@42")
    with pytest.raises(ConceptFileError, match=r"no concept 'gardening' .* \(its concepts: 3, 7, 11\)"):
        load_concept(f"{axbench}@gardening")
    with pytest.raises(ConceptFileError, match=r"names a whole set of concepts, not one\. Fix: give the set as"):
        load_concept(axbench)


# ---------------------------------------------------------------------------------------------- SteerEval
@pytest.mark.parametrize("mapping_form", [False, True])
def test_steereval_loads_pairs_from_train_and_dev_test_from_valid_and_test(tmp_path, mapping_form):
    root = write_steereval(tmp_path / "SteerEval", mapping_form=mapping_form)
    loaded = load_concept_set(f"steereval:{root}")
    assert loaded.keys == ("sentiment/0", "sentiment/1")
    for (cid, text, pairs, valid, test), concept in zip(STEEREVAL_DOMAINS["sentiment"], loaded.concepts, strict=True):
        assert concept.name.startswith(f"steereval_sentiment_{cid}_") and concept.description == text
        assert concept.kind == "sentiment"
        assert [(p.prompt, p.positive, p.negative) for p in concept.pairs] == pairs
        assert [(i.id, i.split, i.text) for i in concept.instructions] == [
            *((f"dev-{n:03d}", "dev", q) for n, q in enumerate(valid, 1)),
            *((f"test-{n:03d}", "test", q) for n, q in enumerate(test, 1)),
        ]
    (bad,) = loaded.skipped
    assert "train.json" in bad and "(key 'not_matching'): missing or empty. Fix: write the sample's not_matching" in bad


def test_steereval_one_concept_by_domain_and_id_and_a_domain_folder_alone(steereval, tmp_path):
    concept = load_concept(f"{steereval}@sentiment/1")
    assert concept.description == "Expressing nostalgia" and "childhood" in concept.lexicon
    domain = load_concept_set(f"{steereval}/sentiment")  # one domain's folder
    assert [c.name for c in domain.concepts] == [c.name for c in load_concept_set(steereval).concepts]
    missing = tmp_path / "SteerEval" / "sentiment" / "valid.json"
    missing.unlink()
    with pytest.raises(ConceptFileError, match=r"valid\.json: no such file\. Fix: give the domain's valid\.json"):
        load_concept_set(steereval)


# ---------------------------------------------------------------------------------------------- the study's list
def test_concepts_limit_keeps_the_first_usable_concepts_across_sets_and_names(axbench, steereval):
    everything = expand_concepts([axbench, "weddings", steereval])
    assert [concept_name(r) for r in everything][2] == "weddings" and len(everything) == 5
    assert expand_concepts([axbench, "weddings", steereval], limit=3) == everything[:3]
    assert expand_concepts([steereval], limit=1) == [f"{steereval}@sentiment/0"]
    assert expand_concepts(["joy", "joy", f"{axbench}@3"]) == ["joy", f"{axbench}@3"]  # one name, once
    with pytest.raises(ValueError, match="concepts_limit must be a positive"):
        expand_concepts(["joy"], limit=0)


def test_the_study_takes_a_dataset_set_and_its_limit_from_the_command_line(axbench):
    plan = StudyPlan(arms=["baseline", "caa_concept"], vector_methods=["caa_concept"], strengths=[0.5])
    passthrough = plan.take_arguments(["model=tiny", f"concepts={axbench}", "concepts_limit=1"])
    assert passthrough == ["model=tiny", "plots=false"]
    assert plan.concepts == [f"{axbench}@3"] and plan.concepts_limit == 1
    (job,) = [j for j in plan.dev_jobs(passthrough) if j.arm_name == "baseline"]
    assert f"concept={axbench}@3" in job.overrides


def test_a_relative_folder_becomes_absolute_for_the_jobs(tmp_path, monkeypatch):
    write_axbench(tmp_path / "data" / "l10")
    monkeypatch.chdir(tmp_path)
    assert expand_concepts(["axbench:data/l10"], limit=1) == [f"axbench:{tmp_path / 'data' / 'l10'}@3"]


def test_a_list_of_which_nothing_can_be_used_is_refused_in_one_line_with_each_fix(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\n")
    with pytest.raises(ConceptSetError) as refused:
        expand_concepts([str(broken), f"axbench:{tmp_path / 'nowhere'}"])
    message = str(refused.value)
    assert message.startswith("no concept of [") and "\n" not in message
    assert f"{broken}: " in message and "no 'description', 'kind', 'pairs' given" in message
    assert "no such dataset folder. Fix: give a folder holding the dataset" in message


# ---------------------------------------------------------------------------------------------- the Hub
def _fake_hub(monkeypatch, cached: Path | None, download):
    """snapshot_download answering from `cached` (local_files_only) or calling `download`."""
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, repo_type=None, allow_patterns=None, local_files_only=False, **_):
        calls.append((repo_id, repo_type, allow_patterns, local_files_only))
        if local_files_only:
            if cached is None:
                raise FileNotFoundError("not cached")
            return str(cached)
        return download()

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_a_hub_dataset_in_the_cache_is_read_without_a_download(tmp_path, monkeypatch):
    write_axbench(tmp_path / "snapshot" / "2b" / "l10")
    calls = _fake_hub(monkeypatch, tmp_path / "snapshot", lambda: pytest.fail("no download when cached"))
    loaded = load_concept_set("axbench:pyvene/axbench-concept500/2b/l10")
    assert loaded.keys == ("3", "7") and calls == [("pyvene/axbench-concept500", "dataset", ["2b/l10/**"], True)]
    assert loaded.references()[0] == "axbench:pyvene/axbench-concept500/2b/l10@3"  # the hub id, not the cache path


def test_a_hub_dataset_not_cached_is_downloaded_then_read(tmp_path, monkeypatch):
    write_steereval(tmp_path / "snapshot")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    calls = _fake_hub(monkeypatch, None, lambda: str(tmp_path / "snapshot"))
    assert load_concept_set("steereval:zjunlp/SteerEval").keys == ("sentiment/0", "sentiment/1")
    assert [call[3] for call in calls] == [True, False]


def test_offline_a_hub_dataset_not_cached_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _fake_hub(monkeypatch, None, lambda: pytest.fail("no download offline"))
    with pytest.raises(ConceptFileError) as refused:
        load_concept_set("axbench:pyvene/axbench-concept500/2b/l10")
    message = str(refused.value)
    assert "not in the Hugging Face cache and downloads are off (HF_HUB_OFFLINE)" in message and "\n" not in message
    assert "Fix: download it where there is a network" in message and "axbench:<folder>/2b/l10" in message


def test_a_hub_download_is_bounded_by_a_timeout_and_its_failure_named(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    _fake_hub(monkeypatch, None, lambda: time.sleep(5))
    started = time.monotonic()
    with pytest.raises(ConceptFileError, match=r"could not be downloaded \(took over 0\.2 s\)\. Fix: download it"):
        concept_sets.load_concept_set("steereval:zjunlp/SteerEval", timeout_s=0.2)
    assert time.monotonic() - started < 3

    def fail():
        raise ConnectionError("name resolution failed")

    _fake_hub(monkeypatch, None, fail)
    with pytest.raises(ConceptFileError, match=r"\(ConnectionError: name resolution failed\)\. Fix:"):
        load_concept_set("steereval:zjunlp/SteerEval")


# ---------------------------------------------------------------------------------------------- the task
def test_the_task_asks_a_dataset_concepts_own_instructions_in_its_splits(steereval):
    reference = f"{steereval}@sentiment/0"
    concept = load_concept(reference)
    dev = concept_samples(reference, "dev")
    assert [(s.id, s.input) for s in dev] == [(i.id, i.text) for i in concept.instructions if i.split == "dev"]
    assert {s.metadata["split"] for s in dev} == {"dev"} and dev[0].metadata["concept"] == concept.name
    assert dev[0].metadata["keywords"] == list(concept.instructions[0].keywords)
    assert dev[0].metadata["runtime_kwargs"] == {"substrings": [dev[0].input]}
    task = concept_steering(concept=reference, split="all")
    assert [s.id for s in task.dataset] == [i.id for i in concept.instructions]


def test_the_built_in_concepts_keep_the_neutral_instructions_ids_splits_and_digest():
    samples = concept_samples("weddings", "dev")
    assert [s.id for s in samples] == split_ids("dev") and samples[0].id.startswith("cs-")
    concept = load_concept("weddings")
    assert concept.instructions == ()
    legacy = {k: getattr(concept, k) for k in ("name", "description", "kind", "pairs", "lexicon", "actadd")}
    legacy["system_prompt"] = concept.system_prompt
    import hashlib

    digest = hashlib.sha256(json.dumps(legacy, default=lambda v: v.as_dict()).encode()).hexdigest()[:16]
    assert concept_digest("weddings") == digest  # the digest a save_dir recorded before instructions existed


# ---------------------------------------------------------------------------------------------- derivations
def test_instruction_keywords_are_the_content_words():
    assert instruction_keywords("Describe how bicycles changed cities.") == ("bicycle", "changed", "citie")
    assert instruction_keywords("Give me one fact about the sea.") == ("fact", "sea")
    assert instruction_keywords("Write about it.") == ()


def test_the_derived_lexicon_keeps_words_of_the_positives_not_of_the_negatives_prompts_or_instructions():
    pairs = [
        ContrastPair("Where did you go?", "To the harbour, sailing past the lighthouse.", "To the shop for bread."),
        ContrastPair("Any news?", "The sailboat race starts at the harbour at noon.", "The shop opens at noon."),
        ContrastPair("What about the harbour?", "Sailing boats fill the harbour.", "It is quiet today."),
    ]
    lexicon = derive_lexicon(pairs, avoid=["Tell me about the lighthouse."])
    assert "sail" not in lexicon and "sailing" in lexicon and "harbour" in lexicon and "sailboat" in lexicon
    assert "noon" not in lexicon and "lighthouse" not in lexicon  # in a negative; in an instruction
    assert derive_lexicon([ContrastPair("a?", "same words", "same words")]) == ()
