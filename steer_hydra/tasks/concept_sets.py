"""Concept sets from published datasets: AxBench's Concept500 and SteerEval, read into `Concept`s.

This module owns reading those two published layouts (from a local folder, or from the Hugging Face Hub into its
cache), turning each dataset concept into a `Concept`, and listing a set's concepts for a study's concept list
(`tasks.concepts.expand_concepts`).

References (the value of `concept=` / `concepts=`; `load_concept` accepts the one-concept forms):

    axbench:<folder or hub id>                    the set: every usable concept
    axbench:<folder or hub id>@<concept_id>       one concept
    steereval:<folder or hub id>                  the set
    steereval:<folder or hub id>@<domain>/<concept_id>

A local folder is used when it exists (relative paths start at the launch directory; the study records them
absolute). Otherwise `owner/name[/subfolder]` is a Hub dataset: it is read from the Hugging Face cache, downloaded
into it when not there (bounded by `HUB_TIMEOUT_S`), and refused in one line when downloads are off
(`HF_HUB_OFFLINE=1`) or fail.

**AxBench Concept500** (stanfordnlp/axbench; the Hub dataset pyvene/axbench-concept500, whose card and the
repository's released-artifact checks give this layout). A subset is a folder holding a training file and an
evaluation file, in either arrangement:

- the Hub's: `<model>/<layer>/train/data.parquet` and `<model>/<layer>/test/data.parquet` (e.g. `2b/l10`);
- the repository's: `<subset>/generate/train_data.parquet`, `<subset>/inference/latent_eval_data.parquet` and
  `<subset>/generate/metadata.jsonl` (one `{"concept_id", "concept", "ref", "concept_genres_map"}` per line).

Each parquet row has `input` (an instruction), `output` (an answer), `output_concept` (the concept the output
contains; `EEEEE` for none), `concept_genre` (`text`, `code` or `math`), `category` (`positive`: the output
contains the concept; `negative`: it does not), `dataset_category` (`instruction`) and `concept_id` (the concept's
id; -1 on the negatives, which are shared by every concept: 72 per genre). Required here: `input`, `output`,
`output_concept`, `category`, `concept_id` in the training file; `input`, `category`, `concept_id` in the
evaluation file (`concept_genre` is used when present).

**SteerEval** (zjunlp/SteerEval; its dataset card and generation script): a folder per behavioural domain
(`language_features`, `sentiment`, `personality`, `reasoning_patterns`), each holding `concepts_all.json` (a list of
`{"concept_id", "concept", ...}`) and the splits `train.json` (70 samples per concept), `valid.json` (5) and
`test.json` (30). A split file is a list of samples, or a mapping from concept id to its samples; a sample has
`question`, `matching` (an answer showing the concept), `not_matching` (one without it) and `concept_id` (plus
`concept`, `llm_description`, `question_id`, which are not needed). The reader takes the root (every domain) or
one domain's folder.

**What a dataset concept is** (`load_dataset_concept`):

- `pairs`: from the training rows only. SteerEval: `(question, matching, not_matching)`. AxBench: each positive
  row `(input, output)` with a negative answer: a negative row with the same `input` when there is one, else the
  concept's own negatives, else the shared negatives of the same `concept_genre`, taken in turn (Concept500's
  negatives answer other instructions, so the pair's prompt is the positive's instruction);
- `description`: the dataset's concept text (AxBench's `output_concept` or metadata `concept`; SteerEval's
  `concept`); `system_prompt` and ActAdd's prompts are built from it;
- `instructions` (`Instruction`): SteerEval's `valid` questions are the `dev` split and its `test` questions the
  `test` split. AxBench's steering protocol asks AlpacaEval instructions, which Concept500 does not ship; here the
  concept's instructions are the distinct `input`s of its positive rows in the evaluation file (instructions never
  used in training), split in halves into `dev` and `test` by a seeded shuffle. Sample ids are `dev-001`...,
  `test-001`... in the dataset's order. Each instruction's `keywords` (for the rule scorer `instruction_score`) are
  its own content words (at most 6, a plural's final s dropped);
- `lexicon`: neither dataset gives keywords for its concepts, so the rule scorer `concept_score` counts stems
  derived from the training pairs: words of 4 letters or more found in at least a tenth of the positive answers
  (and not in that pair's prompt) and at most a quarter as often in the negatives, none matching a word of the
  concept's evaluation instructions, the most distinctive 16. It is a proxy for the concept (a model judge,
  `judge=`, rates the concept itself);
- `name`: `axbench_<id>_<words>` / `steereval_<domain>_<id>_<words>` (a plain identifier); `kind`: `topic` for
  AxBench, `sentiment` for SteerEval's sentiment domain and `style` for its others.

**Unusable rows and concepts.** A row that cannot be used (an empty text, an unknown `category`, a positive equal
to its negative, a prompt given twice, a training prompt that is also an evaluation instruction) is left out and
named with its file, row (counted from 0) and column. A concept left with fewer than 2 pairs, without dev or test
instructions, or without a derivable lexicon is left out with the reason. The set runs with the rest;
`tasks.concepts.expand_concepts` lists what it left out in one warning and refuses an empty set. A missing file or
column is the whole file's problem and refuses the set, naming the file, the column and the fix.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from steer_hydra.tasks.concept_types import (
    DATASET_LAYOUTS,
    MIN_PAIRS,
    Concept,
    ConceptFileError,
    ContrastPair,
    Instruction,
)

logger = logging.getLogger(__name__)

LAYOUTS = DATASET_LAYOUTS
HUB_TIMEOUT_S = 300.0  # a Hub download that takes longer is refused (the files stay in the cache if they came)
EMPTY_CONCEPT = "EEEEE"  # AxBench's output_concept of a negative row
SPLIT_SEED = 14  # the seeded shuffle that halves an AxBench concept's instructions into dev and test
MAX_LEXICON = 16
MAX_KEYWORDS = 6
MIN_WORD = 4  # shorter words would have to equal a word exactly (the rule scorer's rule); derived stems avoid them

AXBENCH_TRAIN_COLUMNS = ("input", "output", "output_concept", "category", "concept_id")
AXBENCH_TEST_COLUMNS = ("input", "category", "concept_id")
AXBENCH_TRAIN_FILES = ("train/data.parquet", "generate/train_data.parquet", "train_data.parquet")
AXBENCH_TEST_FILES = ("test/data.parquet", "inference/latent_eval_data.parquet", "latent_eval_data.parquet")
AXBENCH_METADATA_FILES = ("generate/metadata.jsonl", "metadata.jsonl")
STEEREVAL_CONCEPTS = "concepts_all.json"
STEEREVAL_SPLITS = (("train", "train.json"), ("dev", "valid.json"), ("test", "test.json"))
STEEREVAL_KINDS = {"sentiment": "sentiment", "language_features": "style", "personality": "style"}

_WORD = re.compile(r"[a-z']+")
# Words that say nothing of a concept or of an instruction's subject: function words, and the words instructions
# and concept descriptions are phrased with.
_STOPWORDS = frozenset(
    """about above after again against also among another answer anything around away back because been before
    being below between both brief briefly bring could describe described description detail details does doing done
    down during each else even every example examples explain explaining few first following from further give given
    good great have having help here into just know like list make many might more most much must need never
    next only other others over please provide question really related relating same should show shows since some
    something such tell than that their them then there these they thing things this those though through time
    under until upon using very want well were what when where whether which while will with within without would
    write writing your yours instance instances reference references term terms phrase phrases word words mention
    mentions specific particularly various context contexts concept concepts expression expressions element elements
    content contents sentence sentences paragraph short include including includes how why who whom the and for you
    are was not but can any all its our out get got use has had did may own too via yes one two""".split()
)


# ---------------------------------------------------------------------------------------------- references
@dataclass(frozen=True, slots=True)
class Reference:
    """A parsed reference: the layout, the source (a folder or a hub id with an optional subfolder) and the key of
    one concept (None for the whole set)."""

    layout: str
    source: str
    key: str | None = None

    @property
    def set_text(self) -> str:
        return f"{self.layout}:{self.source}"

    def concept(self, key: str) -> str:
        return f"{self.layout}:{self.source}@{key}"


def parse_reference(text: str) -> Reference:
    """`axbench:<source>[@<id>]` / `steereval:<source>[@<domain>/<id>]` parsed; refused naming the form."""
    layout, _, rest = text.strip().partition(":")
    layout = layout.lower()
    source, at, key = rest.rpartition("@") if "@" in rest else (rest, "", "")
    if layout not in LAYOUTS or not source.strip() or (at and not key.strip()):
        example = "axbench:<folder>@<concept_id>" if layout == "axbench" else "steereval:<folder>@<domain>/<id>"
        raise ConceptFileError(
            None,
            f"{text!r} is not a dataset concept reference",
            f"write {LAYOUTS[0]}:<folder or hub id> for a set, or {example} for one concept",
        )
    return Reference(layout, source.strip(), key.strip() if at else None)


# ---------------------------------------------------------------------------------------------- public API
@dataclass(frozen=True)
class ConceptSet:
    """The usable concepts of one dataset reference, in the dataset's order, and one line per row or concept that
    was left out (each naming its file, row and column, or its concept, and the fix)."""

    reference: Reference
    folder: Path
    concepts: tuple[Concept, ...]
    keys: tuple[str, ...]
    skipped: tuple[str, ...] = field(default=())

    def references(self) -> list[str]:
        """One `load_concept` reference per usable concept."""
        return [self.reference.concept(key) for key in self.keys]


def load_concept_set(reference: str, timeout_s: float = HUB_TIMEOUT_S, limit: int | None = None) -> ConceptSet:
    """Every usable concept of `reference` (`axbench:<folder or hub id>`, `steereval:...`; see the module), or its
    first `limit` usable ones (the concepts after them are not built, nor their rows checked).

    Raises `ConceptFileError` when the folder, a file or a required column is missing, or the Hub cannot be read.
    """
    ref = parse_reference(reference)
    ref = Reference(ref.layout, ref.source)
    folder = dataset_folder(ref, timeout_s)
    data = _read(ref.layout, str(folder), _stamp(ref.layout, folder))
    concepts, keys, skipped = [], [], list(data.problems)
    for key in data.keys:
        if limit is not None and len(concepts) >= limit:
            break
        built, problems = _build(ref.layout, str(folder), _stamp(ref.layout, folder), key)
        skipped.extend(problems)
        if isinstance(built, Concept):
            concepts.append(_sourced(built, ref.concept(key)))
            keys.append(key)
        else:
            skipped.append(built)
    return ConceptSet(_portable(ref, folder), folder, tuple(concepts), tuple(keys), tuple(skipped))


def load_dataset_concept(reference: str, timeout_s: float = HUB_TIMEOUT_S) -> Concept:
    """The one concept `reference` names (`...@<key>`); refused naming the reason and the fix when it is unknown or
    cannot be used."""
    ref = parse_reference(reference)
    if ref.key is None:
        raise ConceptFileError(
            None,
            f"{reference!r} names a whole set of concepts, not one",
            f"give the set as concepts={reference} (the study runs each concept), or name one concept: "
            f"{reference}@<{'concept_id' if ref.layout == 'axbench' else 'domain/concept_id'}>",
        )
    folder = dataset_folder(ref, timeout_s)
    stamp = _stamp(ref.layout, folder)
    # a job reads one AxBench concept's rows (and the shared negatives), not all 36k
    only = ref.key if ref.layout == "axbench" and _concept_id(ref.key) == ref.key else None
    if ref.key not in _read(ref.layout, str(folder), stamp, only).keys:
        data = _read(ref.layout, str(folder), stamp)
        shown = ", ".join(data.keys[:8]) + (", ..." if len(data.keys) > 8 else "")
        raise ConceptFileError(
            None,
            f"{reference}: no concept {ref.key!r} in {folder} (its concepts: {shown or 'none'})",
            "name a concept the dataset has",
        )
    built, _ = _build(ref.layout, str(folder), stamp, ref.key, only)
    if not isinstance(built, Concept):
        raise ConceptFileError(None, f"{reference}: {built.removesuffix('.')}", "name another concept of the set")
    return _sourced(built, reference)


# ---------------------------------------------------------------------------------------------- folders and the Hub
def _portable(ref: Reference, folder: Path) -> Reference:
    """A local folder's reference made absolute (jobs may run elsewhere); a hub id stays as given."""
    local = Path(ref.source).expanduser()
    return Reference(ref.layout, str(folder) if local.exists() else ref.source, ref.key)


def portable_reference(ref: Reference) -> Reference:
    """`ref` with a local folder made absolute (a study's jobs may start elsewhere); a hub id stays as given."""
    local = Path(ref.source).expanduser()
    return Reference(ref.layout, str(local.resolve()) if local.exists() else ref.source, ref.key)


def dataset_folder(ref: Reference, timeout_s: float = HUB_TIMEOUT_S) -> Path:
    """The local folder holding `ref`'s files: the folder itself, or the Hub dataset's copy in the HF cache."""
    local = Path(ref.source).expanduser()
    if local.exists():
        folder = local.resolve()
    elif re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w./-]+)?", ref.source) and not ref.source.startswith("."):
        folder = _hub_folder(ref, timeout_s)
    else:
        raise ConceptFileError(
            local,
            "no such dataset folder",
            "give a folder holding the dataset (relative paths start at the launch directory) or a Hugging Face "
            f"dataset id ({ref.layout}:owner/name)",
        )
    _check_layout(ref, folder)
    return folder


def _check_layout(ref: Reference, folder: Path) -> None:
    """Refuses a folder that does not hold the layout, listing the subsets it holds when it is their parent."""
    if ref.layout == "axbench":
        if _first(folder, AXBENCH_TRAIN_FILES):
            return
        subsets = sorted(
            str(path.parent.parent.relative_to(folder))
            for name in ("train/data.parquet", "generate/train_data.parquet")
            for path in folder.rglob(name)
        )
        expected = " or ".join(AXBENCH_TRAIN_FILES)
    else:
        if (folder / STEEREVAL_CONCEPTS).is_file() or any(folder.glob(f"*/{STEEREVAL_CONCEPTS}")):
            return
        subsets, expected = [], f"{STEEREVAL_CONCEPTS} (in the folder or in one folder per domain)"
    if subsets:
        raise ConceptFileError(
            folder,
            f"holds several AxBench subsets ({', '.join(subsets)})",
            f"name one: concepts={ref.layout}:{ref.source.rstrip('/')}/{subsets[0]}",
        )
    raise ConceptFileError(
        folder,
        f"is not in the {ref.layout} layout (no {expected})",
        f"give the folder that holds {expected} (see steer_hydra/tasks/concept_sets.py)",
    )


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _hub_folder(ref: Reference, timeout_s: float) -> Path:
    """The Hub dataset's folder in the HF cache: read from the cache, else downloaded within `timeout_s`."""
    import huggingface_hub

    parts = ref.source.strip("/").split("/")
    repo_id, sub = "/".join(parts[:2]), "/".join(parts[2:])
    patterns = [f"{sub}/**"] if sub else None
    fix = (
        f"download it where there is a network (huggingface-cli download {repo_id} --repo-type dataset "
        f"--local-dir <folder>) and give the folder: {ref.layout}:<folder>{'/' + sub if sub else ''}"
    )

    def located(root: str) -> Path | None:
        folder = Path(root) / sub if sub else Path(root)
        try:
            _check_layout(ref, folder)
        except ConceptFileError:
            return None
        return folder

    try:
        cached = huggingface_hub.snapshot_download(
            repo_id, repo_type="dataset", allow_patterns=patterns, local_files_only=True
        )
        folder = located(cached)
        if folder is not None:
            return folder
    except Exception:  # noqa: BLE001 - not in the cache (the hub library's errors vary by version)
        pass
    if _offline():
        raise ConceptFileError(
            None,
            f"{ref.set_text}: the dataset {repo_id} is not in the Hugging Face cache and downloads are off "
            "(HF_HUB_OFFLINE)",
            fix,
        )
    result: dict[str, Any] = {}

    def download() -> None:
        try:
            result["path"] = huggingface_hub.snapshot_download(repo_id, repo_type="dataset", allow_patterns=patterns)
        except Exception as error:  # noqa: BLE001 - reported below in one line
            result["error"] = error

    worker = threading.Thread(target=download, name=f"hub-download-{repo_id}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive() or "error" in result:
        why = (
            f"took over {timeout_s:g} s"
            if worker.is_alive()
            else f"{type(result['error']).__name__}: {result['error']}"
        )
        why = " ".join(str(why).split())[:200]
        raise ConceptFileError(None, f"{ref.set_text}: the dataset {repo_id} could not be downloaded ({why})", fix)
    folder = located(result["path"])
    if folder is None:
        _check_layout(ref, Path(result["path"]) / sub if sub else Path(result["path"]))
    assert folder is not None
    return folder


def _first(folder: Path, names: Sequence[str]) -> Path | None:
    return next((folder / name for name in names if (folder / name).is_file()), None)


def _stamp(layout: str, folder: Path) -> tuple[tuple[str, int, int], ...]:
    """What the cached reads are keyed by: each file's path, size and modification time."""
    if layout == "axbench":
        files = [_first(folder, names) for names in (AXBENCH_TRAIN_FILES, AXBENCH_TEST_FILES, AXBENCH_METADATA_FILES)]
    else:
        files = sorted(folder.glob("*.json")) + sorted(folder.glob("*/*.json"))
    return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f is not None)


# ---------------------------------------------------------------------------------------------- reading
@dataclass
class _Rows:
    """One dataset concept's raw material: its text, candidate pairs and instructions, each with where it came from."""

    key: str
    name: str
    description: str
    kind: str
    pairs: list[tuple[str, ContrastPair]] = field(default_factory=list)  # (where, pair)
    instructions: list[tuple[str, str, str]] = field(default_factory=list)  # (where, split, text)
    problems: list[str] = field(default_factory=list)


@dataclass
class _Dataset:
    keys: list[str]
    rows: dict[str, _Rows]
    problems: list[str]  # rows that belong to no concept


@lru_cache(maxsize=16)
def _read(layout: str, folder: str, stamp: tuple, only: str | None = None) -> _Dataset:
    """The dataset's rows by concept; `only` (AxBench): just that concept's rows and the shared negatives, which
    give the same concept as the full read."""
    return _read_axbench(Path(folder), only) if layout == "axbench" else _read_steereval(Path(folder))


@lru_cache(maxsize=4096)
def _build(
    layout: str, folder: str, stamp: tuple, key: str, only: str | None = None
) -> tuple[Concept | str, tuple[str, ...]]:
    """The concept `key` of the dataset (or the one line saying why it cannot be used), and the lines naming the
    rows of it that were left out."""
    return _concept(_read(layout, folder, stamp, only).rows[key])


def _sourced(concept: Concept, reference: str) -> Concept:
    return Concept(
        concept.name,
        concept.description,
        concept.kind,
        concept.pairs,
        concept.lexicon,
        concept.actadd,
        concept.system_prompt,
        concept.instructions,
        source=reference,
    )


def _text(value: Any) -> str:
    """A cell as one line of text ('' for a missing value)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return " ".join(str(value).split())


def _parquet(path: Path, required: Sequence[str]) -> Any:
    try:
        import pandas as pd

        frame = pd.read_parquet(path)
    except ImportError as error:
        raise ImportError(
            f"Reading AxBench's parquet files ({path}) needs pyarrow. Fix: pip install pyarrow."
        ) from error
    except Exception as error:  # noqa: BLE001 - any unreadable file is named in one line
        raise ConceptFileError(
            path, f"cannot be read as parquet ({type(error).__name__}: {error})", "give AxBench's parquet file"
        ) from error
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise ConceptFileError(
            path,
            f"has no column {', '.join(repr(c) for c in missing)} (its columns: {', '.join(map(str, frame.columns))})",
            f"give AxBench's layout: the columns {', '.join(required)} (see steer_hydra/tasks/concept_sets.py)",
        )
    return frame


def _only(frame: Any, key: str | None) -> Any:
    """The rows of concept `key` and those of no concept (-1 or missing: the shared negatives); all for None.
    The frame's index keeps each row's number in its file."""
    if key is None:
        return frame
    import pandas as pd

    ids = pd.to_numeric(frame["concept_id"], errors="coerce")
    return frame[(ids == int(key)) | (ids == -1) | ids.isna()]


def _concept_id(value: Any) -> str | None:
    """AxBench's concept_id as text ('12'), or None when it is not an integer."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return str(int(number)) if number == int(number) else None


def _read_axbench(folder: Path, only: str | None = None) -> _Dataset:
    train_path = _first(folder, AXBENCH_TRAIN_FILES)
    test_path = _first(folder, AXBENCH_TEST_FILES)
    assert train_path is not None  # _check_layout
    if test_path is None:
        raise ConceptFileError(
            folder,
            f"has no evaluation file ({' or '.join(AXBENCH_TEST_FILES)})",
            "give the subset's test split too: the study asks each concept's evaluation instructions from it",
        )
    train = _only(_parquet(train_path, AXBENCH_TRAIN_COLUMNS), only)
    test = _only(_parquet(test_path, AXBENCH_TEST_COLUMNS), only)
    described: dict[str, str] = {}
    metadata = _first(folder, AXBENCH_METADATA_FILES)
    if metadata is not None:
        for line in metadata.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                entry = None
            if isinstance(entry, dict) and _concept_id(entry.get("concept_id")) and _text(entry.get("concept")):
                described[str(_concept_id(entry["concept_id"]))] = _text(entry["concept"])

    problems: list[str] = []
    rows: dict[str, _Rows] = {}
    positives: dict[str, list[tuple[int, dict]]] = {}
    negatives: list[tuple[int, dict]] = []
    for index, row in zip(train.index, train.to_dict("records"), strict=True):
        where = f"{train_path} row {index}"
        category = _text(row.get("category")).lower()
        if category not in ("positive", "negative"):
            problems.append(
                f"{where} (column 'category'): {row.get('category')!r} is neither positive nor negative. "
                "Fix: write positive or negative"
            )
            continue
        empty = [c for c in ("input", "output") if not _text(row.get(c))]
        if empty:
            problems.append(f"{where} (column {empty[0]!r}): empty. Fix: write the {empty[0]} text or drop the row")
            continue
        if category == "negative":
            negatives.append((index, row))
            continue
        key = _concept_id(row.get("concept_id"))
        if key is None or key == "-1":
            problems.append(
                f"{where} (column 'concept_id'): {row.get('concept_id')!r} is not a concept's id on a positive row. "
                "Fix: give the concept's integer id"
            )
            continue
        positives.setdefault(key, []).append((index, row))

    for key in sorted(positives, key=int):
        text = described.get(key) or _text(positives[key][0][1].get("output_concept"))
        rows[key] = _Rows(key, _name("axbench", key, text), text, "topic")
    _pair_axbench(train_path, positives, negatives, rows)
    for index, row in zip(test.index, test.to_dict("records"), strict=True):
        key = _concept_id(row.get("concept_id"))
        if key not in rows or _text(row.get("category")).lower() != "positive":
            continue
        if not _text(row.get("input")):
            rows[key].problems.append(f"{test_path} row {index} (column 'input'): empty. Fix: write the instruction")
            continue
        rows[key].instructions.append((f"{test_path} row {index}", "", _text(row["input"])))
    for key, concept_rows in rows.items():
        _halve(concept_rows, random.Random(f"{SPLIT_SEED}:{key}"))
    return _Dataset(list(rows), rows, problems)


def _pair_axbench(
    path: Path, positives: dict[str, list[tuple[int, dict]]], negatives: list[tuple[int, dict]], rows: dict[str, _Rows]
) -> None:
    """Each positive with a negative answer: same input first, then the concept's own negatives, then the shared
    negatives of the same genre (then any), taken in turn."""
    by_input: dict[str, list[dict]] = {}
    by_concept: dict[str, list[dict]] = {}
    by_genre: dict[str, list[dict]] = {}
    for _, row in negatives:
        by_input.setdefault(_text(row["input"]).lower(), []).append(row)
        key = _concept_id(row.get("concept_id"))
        if key is not None and key != "-1":
            by_concept.setdefault(key, []).append(row)
        else:
            by_genre.setdefault(_text(row.get("concept_genre")).lower(), []).append(row)
    shared = [row for group in by_genre.values() for row in group]
    for key, items in positives.items():
        turns: Counter[str] = Counter()
        for index, row in items:
            where = f"{path} row {index}"
            same = [
                n
                for n in by_input.get(_text(row["input"]).lower(), [])
                if _concept_id(n.get("concept_id")) in (key, "-1", None)
            ]
            genre = _text(row.get("concept_genre")).lower()
            pool_name, pool = next(
                ((name, pool) for name, pool in (("input", same), ("concept", by_concept.get(key, [])),
                                                 (f"genre:{genre}", by_genre.get(genre, [])), ("any", shared)) if pool),
                ("", []),
            )  # fmt: skip
            if not pool:
                rows[key].problems.append(
                    f"{where}: no negative row to pair it with. Fix: give the training file AxBench's negative rows"
                )
                continue
            negative = pool[turns[pool_name] % len(pool)]
            turns[pool_name] += 1
            rows[key].pairs.append(
                (where, ContrastPair(_text(row["input"]), _text(row["output"]), _text(negative["output"])))
            )


def _halve(rows: _Rows, rng: random.Random) -> None:
    """AxBench's instructions (distinct, in file order) split in halves, dev and test, by a seeded shuffle."""
    seen: set[str] = set()
    distinct = []
    for where, _, text in rows.instructions:
        if text.lower() not in seen:
            seen.add(text.lower())
            distinct.append((where, text))
    order = list(range(len(distinct)))
    rng.shuffle(order)
    dev = set(order[: len(distinct) // 2])
    rows.instructions = [(where, "dev" if i in dev else "test", text) for i, (where, text) in enumerate(distinct)]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConceptFileError(path, f"cannot be read as JSON ({error})", "give SteerEval's JSON file") from error


def _read_steereval(folder: Path) -> _Dataset:
    domains = (
        [folder]
        if (folder / STEEREVAL_CONCEPTS).is_file()
        else sorted(path.parent for path in folder.glob(f"*/{STEEREVAL_CONCEPTS}"))
    )
    rows: dict[str, _Rows] = {}
    problems: list[str] = []
    for domain_dir in domains:
        domain = domain_dir.name
        path = domain_dir / STEEREVAL_CONCEPTS
        listed = _json(path)
        entries = list(listed.values()) if isinstance(listed, dict) else listed
        if not isinstance(entries, list):
            raise ConceptFileError(
                path, "is not a list of concepts", 'write [{"concept_id": ..., "concept": ...}, ...]'
            )
        for index, entry in enumerate(entries):
            concept_id = _text(entry.get("concept_id")) if isinstance(entry, dict) else ""
            text = _text(entry.get("concept")) if isinstance(entry, dict) else ""
            if not concept_id or not text:
                missing = "concept_id" if not concept_id else "concept"
                problems.append(
                    f"{path}[{index}] (key {missing!r}): missing or empty. Fix: give each concept its {missing}"
                )
                continue
            key = f"{domain}/{concept_id}"
            rows[key] = _Rows(
                key, _name(f"steereval_{domain}", concept_id, text), text, STEEREVAL_KINDS.get(domain, "style")
            )
        for split, filename in STEEREVAL_SPLITS:
            split_path = domain_dir / filename
            if not split_path.is_file():
                raise ConceptFileError(
                    split_path,
                    "no such file",
                    f"give the domain's {filename} ({', '.join(n for _, n in STEEREVAL_SPLITS)})",
                )
            for where, record in _steereval_records(split_path):
                _steereval_row(rows, problems, domain, split, where, record)
    return _Dataset(list(rows), rows, problems)


def _steereval_records(path: Path) -> list[tuple[str, dict]]:
    """`(where, record)` of a split file: a list of samples, or a mapping from concept id to its samples."""
    data = _json(path)
    if isinstance(data, list):
        return [(f"{path}[{i}]", r if isinstance(r, dict) else {"_bad": r}) for i, r in enumerate(data)]
    if isinstance(data, dict):
        out = []
        for concept_id, samples in data.items():
            for i, r in enumerate(samples if isinstance(samples, list) else [samples]):
                record = {"concept_id": concept_id, **r} if isinstance(r, dict) else {"_bad": r}
                out.append((f"{path}[{concept_id!r}][{i}]", record))
        return out
    raise ConceptFileError(
        path, "is neither a list of samples nor a mapping from concept id to samples", "give SteerEval's split file"
    )


def _steereval_row(
    rows: dict[str, _Rows], problems: list[str], domain: str, split: str, where: str, record: dict
) -> None:
    if "_bad" in record:
        problems.append(f"{where}: not a mapping of question, matching, not_matching. Fix: write the sample as one")
        return
    key = f"{domain}/{_text(record.get('concept_id'))}"
    if key not in rows:
        problems.append(
            f"{where} (key 'concept_id'): {record.get('concept_id')!r} is not in {domain}/{STEEREVAL_CONCEPTS}. "
            "Fix: give the id of a listed concept"
        )
        return
    needed = ("question", "matching", "not_matching") if split == "train" else ("question",)
    empty = [k for k in needed if not _text(record.get(k))]
    if empty:
        rows[key].problems.append(f"{where} (key {empty[0]!r}): missing or empty. Fix: write the sample's {empty[0]}")
        return
    if split == "train":
        pair = ContrastPair(_text(record["question"]), _text(record["matching"]), _text(record["not_matching"]))
        rows[key].pairs.append((where, pair))
    else:
        rows[key].instructions.append((where, split, _text(record["question"])))


# ---------------------------------------------------------------------------------------------- building a concept
def _words(text: str) -> list[str]:
    return [w.strip("'") for w in _WORD.findall(text.lower())]


def content_words(text: str, shortest: int = MIN_WORD) -> list[str]:
    """The words of `text` that can carry its subject: `shortest` letters or more, not a function or instruction
    word."""
    return [w for w in _words(text) if len(w) >= shortest and w not in _STOPWORDS]


def instruction_keywords(text: str) -> tuple[str, ...]:
    """The stems `instruction_score` looks for in an answer to `text`: its content words (a plural's final s
    dropped), distinct, at most `MAX_KEYWORDS`, in order."""
    words = content_words(text, shortest=3)  # a subject may be short (cat, sea, tea), as built-in keywords are
    stems = [w[:-1] if w.endswith("s") and not w.endswith("ss") and len(w) > MIN_WORD else w for w in words]
    return tuple(dict.fromkeys(stems))[:MAX_KEYWORDS]


def derive_lexicon(pairs: Sequence[ContrastPair], avoid: Iterable[str] = ()) -> tuple[str, ...]:
    """Stems that show the concept in the training pairs (see the module): frequent in the positives (outside their
    prompt), rare in the negatives, matching no word of `avoid` (the evaluation instructions)."""
    if not pairs:
        return ()
    avoid_words = {w for text in avoid for w in _words(text)}
    positive: Counter[str] = Counter()
    for pair in pairs:
        positive.update(set(content_words(pair.positive)) - set(_words(pair.prompt)))
    negative_docs = [set(_words(pair.negative)) for pair in pairs]
    need = max(1, math.ceil(0.1 * len(pairs)))
    scored = []
    for word, count in positive.items():
        if count < need or any(other.startswith(word) for other in avoid_words):
            continue
        in_negatives = sum(1 for doc in negative_docs if any(w.startswith(word) for w in doc))
        if in_negatives * 4 > count:
            continue
        scored.append(((count - in_negatives) / len(pairs), word))
    chosen: list[str] = []
    for _, word in sorted(scored, key=lambda item: (-item[0], len(item[1]), item[1])):
        if not any(word.startswith(stem) or stem.startswith(word) for stem in chosen):
            chosen.append(word)
        if len(chosen) == MAX_LEXICON:
            break
    return tuple(chosen)


def _name(prefix: str, key: str, text: str) -> str:
    words = [w for w in content_words(text) if w.isalpha()][:3]
    name = re.sub(r"[^a-z0-9]+", "_", "_".join([prefix, key, *words]).lower()).strip("_")
    return name


def _concept(rows: _Rows) -> tuple[Concept | str, tuple[str, ...]]:
    """The `Concept` of one dataset concept's rows (or one line saying why it cannot be used), and the lines naming
    its rows that were left out."""
    problems = list(rows.problems)
    instructions: list[Instruction] = []
    counters: Counter[str] = Counter()
    asked: set[str] = set()
    for where, split, text in rows.instructions:
        if text.lower() in asked:
            continue
        keywords = instruction_keywords(text)
        if not keywords:
            problems.append(
                f"{where}: the instruction has no content word the rule scorer instruction_score could look for "
                "(left out). Fix: name its subject in the instruction"
            )
            continue
        asked.add(text.lower())
        counters[split] += 1
        instructions.append(Instruction(f"{split}-{counters[split]:03d}", text, split, keywords))
    instructions.sort(key=lambda item: item.id)  # dev-001..., then test-001...
    pairs: list[ContrastPair] = []
    prompts: set[str] = set()
    for where, pair in rows.pairs:
        prompt = pair.prompt.lower()
        if pair.positive == pair.negative:
            problems.append(
                f"{where}: its positive equals its negative (left out). Fix: write a negative without the concept"
            )
        elif prompt in prompts:
            problems.append(f"{where}: its prompt is given twice for {rows.name} (left out). Fix: keep one")
        elif prompt in asked:
            problems.append(
                f"{where}: its prompt is an evaluation instruction of {rows.name} (left out of training). "
                "Fix: none needed"
            )
        else:
            prompts.add(prompt)
            pairs.append(pair)
    label = f"concept {rows.key} ({rows.name})"
    lexicon = derive_lexicon(pairs, (item.text for item in instructions))
    missing = [split for split in ("dev", "test") if not counters[split]]
    if not rows.description:
        reason = f"{label}: no concept text. Fix: give its rows the concept's text"
    elif len(pairs) < MIN_PAIRS:
        reason = f"{label}: only {len(pairs)} usable training pair(s), fewer than {MIN_PAIRS}. Fix: give it more rows"
    elif missing:
        reason = f"{label}: no {' or '.join(missing)} instruction. Fix: give it evaluation rows"
    elif not lexicon:
        reason = (
            f"{label}: no word sets its positives apart from its negatives, so the rule scorer concept_score has no "
            "lexicon. Fix: leave it out, or write it as a concept file with a lexicon"
        )
    else:
        reason = ""
    if reason:
        return reason, tuple(problems)
    description = rows.description
    subject = description[:1].lower() + description[1:]
    concept = Concept(
        rows.name,
        description,
        rows.kind,
        tuple(pairs),
        lexicon,
        (f"I talk about {subject} constantly", f"I do not talk about {subject} constantly"),
        None,
        tuple(instructions),
    )
    return concept, tuple(problems)
