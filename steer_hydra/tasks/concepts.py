"""Concepts as data: one small YAML file per concept, read by the concept-steering task and the concept controls.

A concept file holds:

- `name`: a plain identifier (`[a-z0-9_]+`), the concept's name in sample metadata and results;
- `description`: one line stating the concept, what a judge and the prompting arm are told
  (e.g. "weddings: ceremonies, brides and grooms, vows, receptions");
- `kind`: `topic`, `sentiment`, `style` or `language`;
- `pairs`: at least two `{prompt, positive, negative}` entries: the same everyday prompt answered once with the
  concept and once without it, in varied wording (positives written from one template teach a vector the template,
  not the concept), and never one of the concept-steering task's instructions;
- `lexicon` (optional): word stems for the task's rule scorer `concept_score` (lowercase letters and apostrophes;
  a stem of 3 characters or fewer must equal a word, a longer one matches the start of a word);
- `actadd` (optional): `{positive, negative}`, the prompt pair of ActAdd (default: "I talk about <name>
  constantly" / "I do not talk about <name> constantly");
- `system_prompt` (optional): the prompting baseline's system prompt (default: built from the description).

The built-in concepts are the files of `concept_data/` (`builtin_concepts()`); `load_concept` takes one of their
names, the path of any `.yaml` / `.yml` file, or a dataset concept's reference (`axbench:<folder or hub id>@<id>`,
`steereval:<folder or hub id>@<domain>/<id>`: read by `tasks/concept_sets.py`). Invariant: a file either loads
completely or is refused with one `ConceptFileError` naming the file, the line (or row) of the offending entry and
the fix; nothing is half-read. A file larger than `MAX_FILE_BYTES` is refused before it is parsed, and a file is
parsed once per process while its bytes are unchanged (keyed by its path and a digest of its bytes), however many
readers a job has (pre-flight, the resolvers, the task, the controls, the digests).

A dataset concept also carries `instructions`: the dataset's own evaluation instructions (`Instruction`: sample id,
text, split `dev` or `test`, and the keywords that show an answer addresses it), which the concept-steering task
asks instead of its built-in neutral instructions. A concept file has none (`instructions == ()`), so the built-in
concepts keep the task's instructions, sample ids and splits.

The configs reach the concept through these functions by `_target_` (`concept_pairs`, `concept_actadd_prompt`,
`concept_system_prompt`), with the job's top-level `concept` key as their argument. `expand_concepts` makes a
study's concept list: dataset sets expanded into their concepts, every concept checked before any job launches, the
unusable ones left out with one warning, `concepts_limit` applied. The types (`Concept`, `ContrastPair`,
`Instruction`, `ConceptFileError`) live in `tasks/concept_types.py` and are re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from steer_hydra.tasks.concept_types import (  # noqa: F401 - the concept's types, re-exported
    DATASET_LAYOUTS,
    KINDS,
    MIN_PAIRS,
    Concept,
    ConceptFileError,
    ConceptSetError,
    ContrastPair,
    Instruction,
    default_actadd,
    default_system_prompt,
)

logger = logging.getLogger(__name__)

REQUIRED_KEYS = ("name", "description", "kind", "pairs")
OPTIONAL_KEYS = ("lexicon", "actadd", "system_prompt")
VALID_KEYS = REQUIRED_KEYS + OPTIONAL_KEYS
PAIR_KEYS = ("prompt", "positive", "negative")
ACTADD_KEYS = ("positive", "negative")
FILE_SUFFIXES = (".yaml", ".yml")
LINE_WIDTH = 118  # `concept_yaml` wraps the lexicon at this width
DATA_DIR = Path(__file__).parent / "concept_data"  # the built-in concepts, shipped with the package

# A concept file's size bound (about 2 MB holds 10,000 pairs of everyday sentences; parsing it takes seconds) and how
# many parsed files a process keeps (a concept is immutable; a file is parsed again once its bytes change).
MAX_FILE_BYTES = 4 * 2**20
MAX_CACHED = 64
_LOADED: dict[tuple[str, str], Concept] = {}

_NAME = re.compile(r"[a-z0-9_]+")
_STEM = re.compile(r"[a-z']+")  # what the rule scorer's words are made of


# ---------------------------------------------------------------------------------------------- public API
def builtin_concepts() -> list[str]:
    """The names of the built-in concepts (the files of `concept_data/`), sorted."""
    return sorted(p.stem for p in DATA_DIR.glob("*.yaml"))


def load_concept(name_or_path: str | Path | Concept) -> Concept:
    """The concept a built-in name or a `.yaml` / `.yml` file path names (a `Concept` passes through).

    Raises `ConceptFileError` for an unknown name, a missing file or a malformed one (naming the line and the fix).
    """
    if isinstance(name_or_path, Concept):
        return name_or_path
    if not isinstance(name_or_path, Path) and is_dataset_reference(str(name_or_path)):
        from steer_hydra.tasks.concept_sets import load_dataset_concept

        return load_dataset_concept(str(name_or_path))
    path = concept_file(name_or_path)
    try:
        stat = path.stat()
    except OSError as error:
        raise ConceptFileError(path, f"cannot be read ({error})", "give a readable UTF-8 YAML file") from error
    if stat.st_size > MAX_FILE_BYTES:
        raise ConceptFileError(
            path,
            f"is {stat.st_size / 2**20:.1f} MiB; a concept file may hold at most {MAX_FILE_BYTES // 2**20} MiB (tens "
            "of thousands of pairs), and every job of a study reads it",
            "keep the pairs that define the concept (16 to a few hundred fit a vector well), or give a large set as a "
            "dataset (concepts=axbench:<folder>)",
        )
    try:
        content = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as error:
        raise ConceptFileError(path, f"cannot be read ({error})", "give a readable UTF-8 YAML file") from error
    key = (str(path), content)  # the path as given (the concept records it as its source) and the bytes
    if key in _LOADED:  # the same file unchanged: parsed once per process, however many readers a job has
        return _LOADED[key]
    entries = _read_mapping(path)
    _check_keys(path, entries)
    name, description, kind = _header(path, entries)
    pairs = _pairs(path, entries)
    lexicon = _lexicon(path, entries)
    actadd = _actadd(path, entries)
    system_prompt = _optional_text(path, entries, "system_prompt")
    concept = Concept(name, description, kind, pairs, lexicon, actadd, system_prompt, source=str(path))
    while len(_LOADED) >= MAX_CACHED:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = concept
    return concept


def concept_name(name_or_path: str | Path) -> str:
    """The name of the concept `name_or_path` names; for a file that cannot be read, its stem (pre-flight reports
    the file's problem; a name is needed while the config resolves, before that check runs)."""
    try:
        return load_concept(name_or_path).name
    except ConceptFileError:
        if not isinstance(name_or_path, Path) and is_dataset_reference(str(name_or_path)):
            return re.sub(r"[^a-z0-9]+", "_", str(name_or_path).lower()).strip("_")[-60:]
        return Path(str(name_or_path)).stem


def concept_digest(name_or_path: str | Path | Concept) -> str:
    """A digest of the concept's content (every field but its source), so an edited file is a different concept.
    A concept without instructions (every concept file) leaves that field out, so its digest is what it was before
    concepts could carry instructions."""
    concept = load_concept(name_or_path)
    content = {
        f.name: getattr(concept, f.name)
        for f in fields(concept)
        if f.name != "source" and not (f.name == "instructions" and not concept.instructions)
    }
    return hashlib.sha256(json.dumps(content, default=lambda v: v.as_dict()).encode()).hexdigest()[:16]


def is_dataset_reference(text: str) -> bool:
    """Whether `text` names a concept (or a set of concepts) of a published dataset: `axbench:...`, `steereval:...`."""
    layout, colon, _ = text.strip().partition(":")
    return bool(colon) and layout.lower() in DATASET_LAYOUTS


def expand_concepts(values: Iterable[str], limit: int | None = None) -> list[str]:
    """A study's concept list: dataset set references expanded into one reference per concept (a local folder made
    absolute), every concept checked, the unusable ones left out with one warning listing them (with their fixes),
    duplicates (by name) dropped, then the first `limit` kept. Refuses (`ConceptFileError`) an empty result.
    """
    if limit is not None and int(limit) < 1:
        raise ValueError(f"concepts_limit must be a positive number of concepts; got {limit!r}. Fix: concepts_limit=N.")
    given = [str(v).strip() for v in values]
    chosen: list[str] = []
    names: dict[str, str] = {}
    skipped: list[str] = []
    for value in given:
        if limit is not None and len(chosen) >= int(limit):
            break
        try:
            candidates = _candidates(value, skipped, None if limit is None else int(limit) - len(chosen))
        except ConceptFileError as error:
            skipped.append(f"{value}: {error}")
            continue
        for reference, name in candidates:
            if limit is not None and len(chosen) >= int(limit):
                break
            if name in names:
                skipped.append(
                    f"{reference}: concept {name!r} is already in the list ({names[name]}). Fix: list it once"
                )
                continue
            names[name] = reference
            chosen.append(reference)
    if skipped:
        logger.warning(_skipped_message(skipped, len(chosen)))
    if not chosen:
        more = f" | and {len(skipped) - 3} more (listed above)" if len(skipped) > 3 else ""
        reasons = " | ".join(skipped[:3]) + more if skipped else "the list is empty. Fix: name at least one concept"
        raise ConceptSetError(f"no concept of {given!r} can be used: {reasons}")
    return chosen


def _candidates(value: str, skipped: list[str], wanted: int | None) -> list[tuple[str, str]]:
    """`(reference, name)` of each usable concept `value` holds (one, or a set's first `wanted`); a set's left-out
    lines go to `skipped`. Raises `ConceptFileError` when `value` itself cannot be used."""
    if not is_dataset_reference(value):
        return [(value, load_concept(value).name)]
    from steer_hydra.tasks import concept_sets

    ref = concept_sets.parse_reference(value)
    if ref.key is None:
        concept_set = concept_sets.load_concept_set(value, limit=wanted)
        skipped.extend(concept_set.skipped)
        return [(r, c.name) for r, c in zip(concept_set.references(), concept_set.concepts, strict=True)]
    concept = concept_sets.load_dataset_concept(value)
    return [(concept_sets.portable_reference(ref).concept(str(ref.key)), concept.name)]


def _skipped_message(skipped: Sequence[str], kept: int, shown: int = 30) -> str:
    lines = [f"  - {line}" for line in skipped[:shown]]
    if len(skipped) > shown:
        lines.append(f"  - ... and {len(skipped) - shown} more")
    return f"concepts: left out {len(skipped)} unusable row(s) or concept(s); the other {kept} run:\n" + "\n".join(
        lines
    )


def concept_file(name_or_path: str | Path) -> Path:
    """The file behind a built-in name or a path; a path is anything with a separator or a YAML suffix."""
    text = str(name_or_path).strip()
    is_path = isinstance(name_or_path, Path) or "/" in text or "\\" in text or text.endswith(FILE_SUFFIXES)
    if not is_path:
        path = DATA_DIR / f"{text}.yaml"
        if not path.is_file():
            raise ConceptFileError(
                None,
                f"{text!r} is neither a built-in concept ({', '.join(builtin_concepts())}) nor a concept file path",
                "name a built-in concept, or give the path of a concept file (path/to/concept.yaml)",
            )
        return path
    path = Path(text).expanduser()
    if path.suffix not in FILE_SUFFIXES:
        raise ConceptFileError(path, "not a YAML file", "give a concept file ending in .yaml or .yml")
    if not path.is_file():
        raise ConceptFileError(
            path, "no such concept file", "correct the path (relative paths start at the launch directory)"
        )
    return path


def concept_pairs(concept: str | Path | Concept, limit: int | None = None) -> list[dict[str, str]]:
    """The concept's contrastive pairs for CAA (`{"prompt", "positive", "negative"}`), the first `limit` if given."""
    return [pair.as_dict() for pair in load_concept(concept).pairs[:limit]]


def concept_actadd_prompts(concept: str | Path | Concept) -> tuple[str, str]:
    """`(positive_prompt, negative_prompt)` for ActAdd."""
    positive, negative = load_concept(concept).actadd
    return positive, negative


def concept_actadd_prompt(concept: str | Path | Concept, side: str = "positive") -> str:
    """One prompt of ActAdd's pair (`side`: positive or negative), for a config field that takes one string."""
    if side not in ACTADD_KEYS:
        raise ValueError(f"concept_actadd_prompt: side must be one of {ACTADD_KEYS}; got {side!r}.")
    return concept_actadd_prompts(concept)[ACTADD_KEYS.index(side)]


def concept_system_prompt(concept: str | Path | Concept) -> str:
    """A system prompt that states the concept (the prompting baseline)."""
    return str(load_concept(concept).system_prompt)


# ---------------------------------------------------------------------------------------------- reading
_Entries = dict[str, tuple[int, yaml.Node]]  # key -> (line of the key, value node)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _value(node: yaml.Node) -> Any:
    """The Python value of a node (PyYAML's safe constructors)."""
    return yaml.SafeLoader("").construct_document(node)


def _entries(path: Path, node: yaml.MappingNode, where: str) -> _Entries:
    """A mapping's entries by key; a key given twice is refused (YAML would silently keep the last)."""
    entries: _Entries = {}
    for key_node, value_node in node.value:
        key = _value(key_node)
        if not isinstance(key, str):
            raise ConceptFileError(
                path, f"{where}key {key!r} is not a name", "write keys as plain names", _line(key_node)
            )
        if key in entries:
            raise ConceptFileError(
                path,
                f"{where}{key!r} is given twice (lines {entries[key][0]} and {_line(key_node)})",
                f"keep one {key!r}",
                _line(key_node),
            )
        entries[key] = (_line(key_node), value_node)
    return entries


def _read_mapping(path: Path) -> _Entries:
    """The file's top-level entries; refuses unreadable files, YAML syntax errors and anything but a mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConceptFileError(path, f"cannot be read ({error})", "give a readable UTF-8 YAML file") from error
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        raise ConceptFileError(
            path,
            f"not valid YAML ({error.problem or error.context})",
            "correct the YAML syntax there (quote a text that holds ': ' or starts with a symbol)",
            mark.line + 1 if mark else None,
        ) from error
    if not isinstance(root, yaml.MappingNode):
        got = "empty" if root is None else f"a {type(_value(root)).__name__}"
        raise ConceptFileError(
            path,
            f"not a mapping of concept keys (the document is {got})",
            f"write the keys {', '.join(REQUIRED_KEYS)} (and optionally {', '.join(OPTIONAL_KEYS)}) at the top level",
            _line(root) if root is not None else None,
        )
    return _entries(path, root, "")


# ---------------------------------------------------------------------------------------------- checks
def _check_keys(path: Path, entries: _Entries) -> None:
    """Only the known top-level keys, and every required one."""
    for key, (line, _) in entries.items():
        if key not in VALID_KEYS:
            raise ConceptFileError(
                path, f"unknown key {key!r}", f"use only the keys {', '.join(VALID_KEYS)} (remove or rename it)", line
            )
    missing = [key for key in REQUIRED_KEYS if key not in entries]
    if missing:
        raise ConceptFileError(
            path, f"no {', '.join(repr(k) for k in missing)} given", f"add {', '.join(missing)} at the top level", 1
        )


def _text(path: Path, where: str, line: int, node: yaml.Node) -> str:
    """A non-empty text value."""
    value = _value(node)
    if not isinstance(value, str):
        raise ConceptFileError(
            path,
            f"{where} is not text (got {value!r})",
            f"write {where} as text (quote it if YAML reads it as a {type(value).__name__})",
            line,
        )
    if not value.strip():
        raise ConceptFileError(path, f"{where} is empty", f"write {where}", line)
    return value.strip()


def _header(path: Path, entries: _Entries) -> tuple[str, str, str]:
    """`name` (a plain identifier), `description` (one line) and `kind` (one of `KINDS`)."""
    name = _text(path, "name", *entries["name"])
    if not _NAME.fullmatch(name):
        raise ConceptFileError(
            path,
            f"name {name!r} is not a plain identifier",
            "use lowercase letters, digits and underscores (e.g. name: space_travel)",
            entries["name"][0],
        )
    description = _text(path, "description", *entries["description"])
    if "\n" in description:
        raise ConceptFileError(
            path,
            "description spans several lines",
            "state the concept in one line (e.g. 'weddings: ceremonies, brides and grooms, vows, receptions')",
            entries["description"][0],
        )
    kind = _text(path, "kind", *entries["kind"])
    if kind not in KINDS:
        raise ConceptFileError(
            path, f"kind {kind!r} is not a concept kind", f"kind: one of {', '.join(KINDS)}", entries["kind"][0]
        )
    return name, description, kind


def _pairs(path: Path, entries: _Entries) -> tuple[ContrastPair, ...]:
    """At least `MIN_PAIRS` complete pairs, each positive different from its negative, no prompt twice, no prompt
    taken from the concept-steering task."""
    line, node = entries["pairs"]
    if not isinstance(node, yaml.SequenceNode):
        raise ConceptFileError(
            path, "pairs is not a list", "write pairs as a list of {prompt, positive, negative}", line
        )
    if not node.value:
        raise ConceptFileError(
            path, "pairs is empty", f"give at least {MIN_PAIRS} pairs of prompt, positive and negative", line
        )
    if len(node.value) < MIN_PAIRS:
        raise ConceptFileError(
            path,
            f"pairs has only {len(node.value)} pair",
            f"give at least {MIN_PAIRS} pairs (a vector fitted from one pair is that pair's wording)",
            line,
        )
    pairs = [_pair(path, index, item) for index, item in enumerate(node.value)]
    first_seen: dict[str, int] = {}
    instructions = _task_instructions()
    for index, (pair, item) in enumerate(zip(pairs, node.value, strict=True)):
        where, at = f"pairs[{index}]", _line(item)
        if pair.positive == pair.negative:
            raise ConceptFileError(
                path,
                f"{where}'s positive equals its negative",
                "write the negative as an answer to the same prompt without the concept",
                at,
            )
        key = " ".join(pair.prompt.lower().split())
        if key in first_seen:
            raise ConceptFileError(
                path,
                f"{where} repeats the prompt of pairs[{first_seen[key]}] (line {_line(node.value[first_seen[key]])})",
                "give each pair its own prompt",
                at,
            )
        first_seen[key] = index
        if key in instructions:
            raise ConceptFileError(
                path,
                f"{where}'s prompt is an instruction of the concept_steering task ({instructions[key]}), so the "
                "vector would be fitted on what it is evaluated on",
                "use an everyday prompt the task does not ask",
                at,
            )
    return tuple(pairs)


def _pair(path: Path, index: int, node: yaml.Node) -> ContrastPair:
    where = f"pairs[{index}]"
    if not isinstance(node, yaml.MappingNode):
        raise ConceptFileError(
            path, f"{where} is not a mapping", "give each pair prompt, positive and negative", _line(node)
        )
    entries = _entries(path, node, f"{where}: ")
    for key, (line, _) in entries.items():
        if key not in PAIR_KEYS:
            raise ConceptFileError(
                path, f"{where} has an unknown key {key!r}", "give each pair prompt, positive and negative only", line
            )
    for key in PAIR_KEYS:
        if key not in entries:
            raise ConceptFileError(
                path, f"{where} has no {key!r}", "give each pair prompt, positive and negative", _line(node)
            )
    prompt, positive, negative = (_text(path, f"{where}.{key}", *entries[key]) for key in PAIR_KEYS)
    return ContrastPair(prompt, positive, negative)


def _task_instructions() -> dict[str, str]:
    """The concept-steering task's instructions (normalised) -> their sample ids."""
    from steer_hydra.tasks.instructions import instructions

    return {" ".join(text.lower().split()): sample_id for sample_id, text in instructions().items()}


def _lexicon(path: Path, entries: _Entries) -> tuple[str, ...]:
    """Optional word stems: a list of distinct lowercase stems the rule scorer's words can match."""
    if "lexicon" not in entries:
        return ()
    line, node = entries["lexicon"]
    stems = _value(node)
    if not isinstance(stems, list) or not stems:
        raise ConceptFileError(
            path, "lexicon is not a list of word stems", "write lexicon: [stem, stem, ...] or remove it", line
        )
    seen: set[str] = set()
    for index, stem in enumerate(stems):
        at = _line(node.value[index])
        if not isinstance(stem, str) or not _STEM.fullmatch(stem):
            raise ConceptFileError(
                path,
                f"lexicon[{index}] {stem!r} can never match: the rule scorer's words are lowercase a-z and apostrophes",
                "write stems in lowercase ASCII letters (drop accents: 'tres' for 'très' never matches either, so "
                "prefer words without them)",
                at,
            )
        if stem in seen:
            raise ConceptFileError(path, f"lexicon[{index}] {stem!r} is listed twice", "keep one", at)
        seen.add(stem)
    return tuple(stems)


def _actadd(path: Path, entries: _Entries) -> tuple[str, str] | None:
    """Optional `{positive, negative}` prompts for ActAdd, different from each other."""
    if "actadd" not in entries:
        return None
    line, node = entries["actadd"]
    fix = "write actadd: {positive: <prompt with the concept>, negative: <the same without it>} or remove it"
    if not isinstance(node, yaml.MappingNode):
        raise ConceptFileError(path, "actadd is not a mapping", fix, line)
    pair = _entries(path, node, "actadd: ")
    unknown = [key for key in pair if key not in ACTADD_KEYS]
    missing = [key for key in ACTADD_KEYS if key not in pair]
    if unknown or missing:
        what = f"an unknown key {unknown[0]!r}" if unknown else f"no {missing[0]!r}"
        raise ConceptFileError(path, f"actadd has {what}", fix, pair[unknown[0]][0] if unknown else line)
    positive, negative = (_text(path, f"actadd.{key}", *pair[key]) for key in ACTADD_KEYS)
    if positive == negative:
        raise ConceptFileError(path, "actadd's positive equals its negative", fix, line)
    return positive, negative


def _optional_text(path: Path, entries: _Entries, key: str) -> str | None:
    return _text(path, key, *entries[key]) if key in entries else None


# ---------------------------------------------------------------------------------------------- writing
def concept_yaml(concept: Concept) -> str:
    """The concept as the text of a concept file (`load_concept` reads it back to an equal concept)."""

    def text(value: str) -> str:
        try:
            plain = yaml.safe_load(f"k: {value}") if value == value.strip() else None
        except yaml.YAMLError:
            plain = None
        return value if plain == {"k": value} else json.dumps(value, ensure_ascii=False)

    lines = [
        f"name: {concept.name}",
        f"description: {text(concept.description)}",
        f"kind: {concept.kind}",
        f"system_prompt: {text(str(concept.system_prompt))}",
        "actadd:",
        *(f"  {side}: {text(prompt)}" for side, prompt in zip(ACTADD_KEYS, concept.actadd or (), strict=True)),
    ]
    if concept.lexicon:
        rows, row = [], "lexicon: ["
        for stem in (f"{text(stem)}, " for stem in concept.lexicon):
            if len(row) + len(stem) > LINE_WIDTH:
                rows.append(row.rstrip())
                row = "  "
            row += stem
        lines += [*rows, row.removesuffix(", ") + "]"]
    lines.append("pairs:")
    for pair in concept.pairs:
        lines += [
            f"  - prompt: {text(pair.prompt)}",
            f"    positive: {text(pair.positive)}",
            f"    negative: {text(pair.negative)}",
        ]
    return "\n".join(lines) + "\n"
