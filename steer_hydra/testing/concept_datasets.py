"""Tiny concept datasets in the published layouts `steer_hydra.tasks.concept_sets` reads, written for tests.

`write_axbench(folder)` writes an AxBench Concept500 subset in the Hub's arrangement (`<folder>/train/data.parquet`,
`<folder>/test/data.parquet`, AxBench's columns); `write_steereval(folder)` writes SteerEval's (one folder per
domain: `concepts_all.json`, `train.json`, `valid.json`, `test.json`). Each holds two usable concepts, one row
that cannot be used, and (AxBench) one concept with too few rows, so a test sees the set load, the bad row named
and the rest run. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# AxBench: (concept_id, concept text, genre, [(instruction, answer with the concept)], [evaluation instructions])
AXBENCH_CONCEPTS: tuple[tuple[int, str, str, list[tuple[str, str]], list[str]], ...] = (
    (
        3,
        "terms related to gardening and flowers",
        "text",
        [
            ("What did you do last weekend?", "I spent it gardening: I repotted seedlings and pruned the roses."),
            ("Describe your ideal morning.", "Tea among the tulips, then an hour of weeding the flowerbeds."),
            ("What is a relaxing hobby?", "Gardening. Planting bulbs and watching the roses bloom is calming."),
        ],
        [
            "Tell me about your neighbour.",
            "What makes a good holiday?",
            "How do you spend a rainy day?",
            "Describe a busy street.",
        ],
    ),
    (
        7,
        "references to sailing and the sea",
        "text",
        [
            ("What did you do last summer?", "I went sailing along the coast and anchored in quiet harbours."),
            ("Describe your favourite place.", "A small harbour where the sailboats rock on the tide at dusk."),
            ("What is an exciting sport?", "Sailing: trimming the mainsail while the hull cuts through the waves."),
        ],
        [
            "What is your favourite meal?",
            "Describe your best friend.",
            "How do you prepare for an exam?",
            "Tell me about your town.",
        ],
    ),
)
AXBENCH_NEGATIVES: tuple[tuple[str, str], ...] = (
    ("What did you have for lunch?", "A cheese sandwich and an apple, eaten at my desk."),
    ("How was your day?", "Busy: three meetings and a long drive home in traffic."),
    ("What are you reading?", "A detective novel set in a small mountain village."),
)
AXBENCH_BAD_CONCEPT = (
    11,
    "mentions of volcanoes",
    "text",
    [("Any news?", "The volcano erupted again.")],
    ["Describe a cat."],
)


def axbench_frames() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, evaluation rows) in AxBench's columns; one training row has an empty output."""
    train: list[dict[str, Any]] = []
    test: list[dict[str, Any]] = []
    for concept_id, text, genre, positives, instructions in (*AXBENCH_CONCEPTS, AXBENCH_BAD_CONCEPT):
        for prompt, answer in positives:
            train.append(_axbench_row(prompt, answer, text, genre, "positive", concept_id))
        for instruction in instructions:
            test.append(_axbench_row(instruction, f"An answer about {text}.", text, genre, "positive", concept_id))
    for prompt, answer in AXBENCH_NEGATIVES:
        train.append(_axbench_row(prompt, answer, "EEEEE", "text", "negative", -1))
        test.append(_axbench_row(prompt, answer, "EEEEE", "text", "negative", -1))
    train.insert(2, _axbench_row("What is in your shed?", "", AXBENCH_CONCEPTS[0][1], "text", "positive", 3))
    return train, test


def _axbench_row(prompt: str, answer: str, concept: str, genre: str, category: str, concept_id: int) -> dict[str, Any]:
    return {
        "input": prompt,
        "output": answer,
        "output_concept": concept,
        "concept_genre": genre,
        "category": category,
        "dataset_category": "instruction",
        "concept_id": concept_id,
    }


def write_axbench(folder: Path, drop_column: str | None = None) -> Path:
    """An AxBench subset in the Hub's arrangement under `folder` (e.g. `<root>/2b/l10`); `drop_column` leaves one
    column out of the training file. Returns `folder`."""
    import pandas as pd

    train, test = axbench_frames()
    for split, rows in (("train", train), ("test", test)):
        (folder / split).mkdir(parents=True, exist_ok=True)
        frame = pd.DataFrame(rows)
        if drop_column and split == "train":
            frame = frame.drop(columns=[drop_column])
        frame.to_parquet(folder / split / "data.parquet")
    return folder


# SteerEval: domain -> [(concept_id, concept, [(question, matching, not_matching)], [valid questions], [test ones])]
STEEREVAL_DOMAINS: dict[str, list[tuple[int, str, list[tuple[str, str, str]], list[str], list[str]]]] = {
    "sentiment": [
        (
            0,
            "Expressing optimism",
            [
                (
                    "How will next year go?",
                    "Wonderfully, I'm hopeful and confident it will be bright.",
                    "Much like this one, I expect.",
                ),
                (
                    "Will the project succeed?",
                    "I'm confident it will; the outlook is bright and hopeful.",
                    "It depends on the budget.",
                ),
                (
                    "How is the weather looking?",
                    "Bright skies ahead, and I'm hopeful the sun stays.",
                    "Cloudy with some rain later.",
                ),
            ],
            ["What do you think of your new job?", "How was the trip?"],
            ["How is your garden doing?", "What are your plans for the evening?", "How did the exam go?"],
        ),
        (
            1,
            "Expressing nostalgia",
            [
                (
                    "What is your favourite song?",
                    "One my grandmother hummed; it takes me back to childhood summers.",
                    "A recent pop song with a catchy chorus.",
                ),
                (
                    "Describe your old school.",
                    "I miss those corridors; memories of childhood friends flood back.",
                    "A brick building with a large playground.",
                ),
                (
                    "What do you eat on Sundays?",
                    "Roast dinner, like in my childhood; I miss those memories.",
                    "Usually pasta with vegetables.",
                ),
            ],
            ["Tell me about your bicycle.", "What is in your attic?"],
            ["Describe your street.", "What do you keep on your desk?", "How do you celebrate birthdays?"],
        ),
    ],
}


def write_steereval(root: Path, mapping_form: bool = False, bad_row: bool = True) -> Path:
    """SteerEval's layout under `root` (one folder per domain). `mapping_form` writes the split files as a mapping
    from concept id to samples instead of a list; `bad_row` adds a training sample without `not_matching`."""
    for domain, concepts in STEEREVAL_DOMAINS.items():
        folder = root / domain
        folder.mkdir(parents=True, exist_ok=True)
        listed = [{"concept_id": cid, "concept": text, "level": 1} for cid, text, *_ in concepts]
        (folder / "concepts_all.json").write_text(json.dumps(listed, indent=1))
        splits: dict[str, list[dict[str, Any]]] = {"train": [], "valid": [], "test": []}
        for cid, text, pairs, valid, test in concepts:
            for i, (question, matching, not_matching) in enumerate(pairs):
                splits["train"].append(_sample(cid, text, i, question, matching, not_matching))
            splits["valid"] += [_sample(cid, text, i, q) for i, q in enumerate(valid)]
            splits["test"] += [_sample(cid, text, i, q) for i, q in enumerate(test)]
        if bad_row:
            bad = _sample(concepts[0][0], concepts[0][1], 99, "What is for dinner?", "A hopeful feast!", "")
            del bad["not_matching"]
            splits["train"].insert(1, bad)
        for split, samples in splits.items():
            data: Any = samples
            if mapping_form:
                data = {}
                for sample in samples:
                    data.setdefault(str(sample["concept_id"]), []).append(sample)
            (folder / f"{split}.json").write_text(json.dumps(data, indent=1))
    return root


def _sample(cid: int, concept: str, index: int, question: str, matching: str = "", not_matching: str = "") -> dict:
    return {
        "question_id": index,
        "concept_id": cid,
        "concept": concept,
        "question": question,
        "matching": matching,
        "not_matching": not_matching,
        "llm_description": f"{concept} in the answer",
    }
