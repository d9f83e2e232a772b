"""The neutral instructions the concept-steering task asks (44 everyday subjects x 3 templates, ids `cs-001`...),
the keywords that show an answer is about its subject, and the fixed dev/test split of their ids."""

from __future__ import annotations

import random

# subject phrase, keywords that show the answer is about it
SUBJECTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bicycles", ("bicycle", "bike", "cycling", "pedal")),
    ("the ocean", ("ocean", "sea", "marine", "wave")),
    ("coffee", ("coffee", "caffeine", "espresso", "bean")),
    ("volcanoes", ("volcano", "lava", "magma", "erupt")),
    ("libraries", ("librar", "book", "reading")),
    ("honeybees", ("bee", "honey", "hive", "pollen")),
    ("trains", ("train", "rail", "locomotive", "station")),
    ("the moon", ("moon", "lunar", "crater")),
    ("chess", ("chess", "pawn", "king", "board")),
    ("rain", ("rain", "water", "cloud", "storm")),
    ("bread", ("bread", "flour", "dough", "bak")),
    ("computers", ("computer", "software", "hardware", "processor")),
    ("forests", ("forest", "tree", "wood")),
    ("the desert", ("desert", "sand", "dune", "arid")),
    ("bridges", ("bridge", "span", "river")),
    ("cats", ("cat", "kitten", "feline")),
    ("mountains", ("mountain", "peak", "summit", "climb")),
    ("the piano", ("piano", "keys", "music")),
    ("gardening", ("garden", "plant", "soil", "seed")),
    ("the postal service", ("post", "mail", "letter", "parcel")),
    ("electric cars", ("electric", "car", "batter", "vehicle")),
    ("photography", ("photo", "camera", "lens", "picture")),
    ("recycling", ("recycl", "waste", "plastic", "bin")),
    ("the human heart", ("heart", "blood", "cardi")),
    ("maps", ("map", "navigat", "direction")),
    ("snow", ("snow", "winter", "cold", "ice")),
    ("football", ("football", "soccer", "ball", "goal")),
    ("clocks", ("clock", "time", "hour", "minute")),
    ("the internet", ("internet", "online", "web", "network")),
    ("tea", ("tea", "leaves", "brew", "cup")),
    ("airplanes", ("airplane", "plane", "aircraft", "fly", "flight")),
    ("dinosaurs", ("dinosaur", "fossil", "extinct")),
    ("rivers", ("river", "water", "stream", "flow")),
    ("swimming", ("swim", "pool", "water", "stroke")),
    ("the night sky", ("sky", "star", "night", "planet")),
    ("farming", ("farm", "crop", "harvest", "field")),
    ("the kitchen", ("kitchen", "cook", "stove", "food")),
    ("umbrellas", ("umbrella", "rain")),
    ("elephants", ("elephant", "trunk", "tusk")),
    ("newspapers", ("newspaper", "news", "article", "journalis")),
    ("running shoes", ("shoe", "running", "sole", "foot")),
    ("hospitals", ("hospital", "doctor", "nurse", "patient")),
    ("birds", ("bird", "feather", "wing", "nest")),
    ("the weather forecast", ("weather", "forecast", "rain", "temperature")),
)

TEMPLATES = (
    "Write two sentences about {subject}.",
    "Give me one interesting fact about {subject}.",
    "Explain briefly why {subject} matter to people.",
)


DEV_SIZE = 60
SPLITS = ("dev", "test", "all")


def _ordered_items() -> list[tuple[str, str, tuple[str, ...]]]:
    """`(id, instruction, subject keywords)` in id order."""
    items = []
    for t, template in enumerate(TEMPLATES):
        for s, (subject, keywords) in enumerate(SUBJECTS):
            number = t * len(SUBJECTS) + s + 1
            items.append((f"cs-{number:03d}", template.format(subject=subject), keywords))
    return items


def instructions() -> dict[str, str]:
    """Every instruction of the task by sample id (`cs-001`...)."""
    return {sample_id: text for sample_id, text, _ in _ordered_items()}


def split_ids(split: str) -> list[str]:
    """Sample ids of a split: a fixed seeded shuffle of every id, the first `DEV_SIZE` are dev, the rest test."""
    if split not in SPLITS:
        raise ValueError(f"concept_steering: split must be one of {SPLITS}; got {split!r}.")
    ids = [item[0] for item in _ordered_items()]
    if split == "all":
        return ids
    shuffled = ids[:]
    random.Random(14).shuffle(shuffled)
    chosen = set(shuffled[:DEV_SIZE] if split == "dev" else shuffled[DEV_SIZE:])
    return [i for i in ids if i in chosen]
