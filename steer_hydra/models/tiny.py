"""Build the tiny offline Llama and its in-code BPE tokenizer, deterministically, and cache them on disk by spec.

Nothing here touches the network. `build_tiny_model(TinySpec(...))` returns `(model, tokenizer)`;
`resolve_model_reference("steer_hydra:tiny")` (in `references`) materializes the checkpoint under the cache
directory (`$STEER_HYDRA_CACHE`, default `~/.cache/steer_hydra`) and returns its path, so anything that takes a
`model_name_or_path` (the pipeline, the Hydra `model=tiny` option, Inspect's `hf/` provider) can point at it.

References: `steer_hydra:tiny` (chat template) and `steer_hydra:tiny-base` (no template, the "base model" case),
optionally with overrides as a query string, e.g. `steer_hydra:tiny?hidden_size=256&head_dim=64&seed=1`.
`steer_hydra:tiny-reward` is the same trunk and tokenizer under a sequence-classification head (`num_labels`
classes, default 2): a random reward model for reward-guided decoding tests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import torch

from steer_hydra.models.cache import build_once
from steer_hydra.models.loading import model_construction

if TYPE_CHECKING:  # imported where used: parsing a reference (the pre-flight checks) needs neither library
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification, PreTrainedTokenizerFast

TINY_REF = "steer_hydra:tiny"
TINY_BASE_REF = "steer_hydra:tiny-base"
TINY_REWARD_REF = "steer_hydra:tiny-reward"
HEADS = ("causal_lm", "sequence_classification")
_FORMAT_VERSION = 1  # bump when the construction below changes, so cached checkpoints are rebuilt

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# A small fixed corpus: enough merges that common words are single tokens; byte-level BPE encodes anything.
_CORPUS_WORDS = """
the a an and or not of to in on at by for with from as is are was were be been it this that these those what
which who whom where when why how answer question respond reply only word words one two three four five six
seven eight nine ten zero number numbers add plus minus times equals sum total city country capital river
paris london rome berlin madrid tokyo france england italy germany spain japan europe asia water fire earth
air yes no true false maybe always never please thank you hello goodbye brief short long sentence letter
letters upper lower case lowercase uppercase format list bullet json reply must should would could can will
may system user assistant model prompt response example examples positive negative instruction instructions
follow love hate happy sad good bad kind cruel calm angry helpful harmless honest polite rude safe unsafe
refuse comply choose option options choice choices correct wrong best worst first last next previous before
after end stop red green blue yellow black white cat dog bird fish tree flower sun moon star sky sea
mountain road house eat drink sleep walk run read write speak think know see hear feel make take give find
tell ask work play math code story poem essay summary translate explain describe compare count repeat spell
name names
""".split()


@dataclass(frozen=True, slots=True)
class TinySpec:
    """Shape and seed of a tiny model; every field is part of its cache identity."""

    seed: int = 0
    chat_template: bool = True
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int = 128
    vocab_size: int = 1024
    max_position_embeddings: int = 2048
    initializer_range: float = 0.2
    attn_implementation: str = "sdpa"
    head: str = "causal_lm"  # or "sequence_classification" (a reward model)
    num_labels: int = 2  # classes of a sequence-classification head

    def digest(self) -> str:
        """Stable short hash of the spec (and the construction version); the head fields, added later, count only
        when they differ from their defaults, so existing checkpoints keep their identity."""
        fields = dataclasses.asdict(self)
        defaults = {f.name: f.default for f in dataclasses.fields(TinySpec)}
        for name in ("head", "num_labels"):
            if fields[name] == defaults[name]:
                del fields[name]
        payload = json.dumps({"v": _FORMAT_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def build_tiny_tokenizer(spec: TinySpec = TinySpec()) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on the fixed corpus and wrap it with special tokens, left padding and a template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [" ".join(_CORPUS_WORDS[i : i + 12]) for i in range(0, len(_CORPUS_WORDS), 12)]
    corpus += [w.capitalize() for w in _CORPUS_WORDS] + [f"{i} + {i + 1} = {2 * i + 1}." for i in range(50)]
    tok.train_from_iterator(corpus, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    # Plain text gets a BOS like a Llama tokenizer; chat templates write their own BOS.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        padding_side="left",
        model_max_length=spec.max_position_embeddings,
    )
    if spec.chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    spec: TinySpec = TinySpec(),
) -> tuple[LlamaForCausalLM | LlamaForSequenceClassification, PreTrainedTokenizerFast]:
    """Build `(model, tokenizer)` with weights drawn from `spec.seed`; the global RNG state is left untouched.

    `spec.head="sequence_classification"` builds a `LlamaForSequenceClassification` with `spec.num_labels` classes.
    """
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    if spec.head not in HEADS:
        raise ValueError(f"TinySpec.head must be one of {HEADS}; got {spec.head!r}. Fix: head=causal_lm.")
    classifier = spec.head == "sequence_classification"
    if classifier and spec.num_labels < 1:
        raise ValueError(f"TinySpec.num_labels must be >= 1; got {spec.num_labels}. Fix: num_labels=2.")
    tokenizer = build_tiny_tokenizer(spec)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads or spec.num_attention_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **({"num_labels": spec.num_labels} if classifier else {}),
    )
    config._attn_implementation = spec.attn_implementation
    with model_construction(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = (LlamaForSequenceClassification if classifier else LlamaForCausalLM)(config)
    if not classifier:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.eval()
    return model, tokenizer


FAMILY_DEFAULTS: dict[str, int] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def build_family_model(model_type: str, *, seed: int = 0, attn_implementation: str | None = None, **config: Any):
    """A tiny random model of another decoder family (`qwen2`, `mistral`, `gemma3_text`...), for layout tests.

    Grouped-query attention by default (4 heads, 2 KV heads); `config` overrides `FAMILY_DEFAULTS`.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    family_config = AutoConfig.for_model(model_type, **{**FAMILY_DEFAULTS, **config})
    with model_construction(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(family_config, attn_implementation=attn_implementation)
    return model.eval()


def save_tiny_model(path: str | os.PathLike, spec: TinySpec = TinySpec()) -> Path:
    """Build the tiny model and save model plus tokenizer to `path` (loadable with `from_pretrained`)."""
    path = Path(path)
    model, tokenizer = build_tiny_model(spec)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def is_tiny_reference(ref: object) -> bool:
    """Whether `ref` names a built-in tiny model (`steer_hydra:tiny...`, `steer_hydra:tiny-reward...`)."""
    return isinstance(ref, str) and ref.startswith("steer_hydra:tiny")


def parse_tiny_reference(ref: str) -> TinySpec:
    """Turn `steer_hydra:tiny[-base|-reward][?field=value&...]` into a `TinySpec`, naming any unknown field."""
    name, _, query = ref.removeprefix("steer_hydra:").partition("?")
    if name not in ("tiny", "tiny-base", "tiny-reward"):
        raise ValueError(
            f"Unknown tiny model reference {ref!r}; use {TINY_REF!r}, {TINY_BASE_REF!r} or {TINY_REWARD_REF!r}."
        )
    fields = {f.name: f for f in dataclasses.fields(TinySpec)}
    overrides: dict[str, object] = {"chat_template": name != "tiny-base"}
    if name == "tiny-reward":
        overrides["head"] = "sequence_classification"
    for key, raw in parse_qsl(query):
        if key not in fields:
            raise ValueError(f"Unknown field {key!r} in {ref!r}; valid fields: {sorted(fields)}.")
        default = getattr(TinySpec(), key)
        if isinstance(default, bool):
            overrides[key] = raw.lower() in ("1", "true", "yes")
        elif isinstance(default, str):
            overrides[key] = raw
        elif isinstance(default, float):
            overrides[key] = float(raw)
        else:
            overrides[key] = int(raw)
    return TinySpec(**overrides)


def resolve_tiny_reference(ref: str, cache_root: Path) -> str:
    """A loadable path for a tiny reference under `cache_root` (built once, atomically)."""
    spec = parse_tiny_reference(ref)
    target = cache_root / "models" / f"tiny-{spec.digest()}"
    return build_once(target, lambda staging: save_tiny_model(staging, spec))
