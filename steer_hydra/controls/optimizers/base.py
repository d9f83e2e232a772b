"""The shared half of the prompt optimizers (PRewrite, CPO, GEPA): an input control whose instruction (a system
prompt or a prefix of the user's message) is chosen at `steer()` against a `SampleScorer` on training rows.

How it runs: `steer()` reads the training rows (a file or rows; rows of another split than `split` are dropped
before anything else sees them: `steer_hydra.controls.rows`), computes the optimization's key (a digest of the
optimizer, its settings, the scorer, the proposer, the rows, the base model's weights and the tokenizer), and
runs the optimizer only when the artifact cache (`<cache>/prompts/<key>/`) has no entry for it. Rollouts use the
live model directly (batched greedy `generate`, the instruction applied exactly as the control applies it at
evaluation), scores come from `scorer(response, row)` (e.g. `sample_scorer_from_inspect(includes())`), and
new instructions come from the proposer: the pipeline's own model (sampled), an Inspect model
(`InspectProposer`, or a model name), or any `(prompt) -> str` callable. The chosen instruction, its training score
and every candidate's are written to the entry's `result.json`; `optimization` holds them after `steer()`, and
`vector_hash` (the digest of what was chosen) goes to provenance.

The evaluation never reaches the optimizer: it sees only the training rows (`Evaluator.seen_inputs` lists every
input it rolled out or scored), and the chosen instruction is fixed before the first evaluation request.

On the vLLM backends the backend calls `prepare_for_engine(model_path, ...)` first (`artifacts.BuildsForEngine`):
the cache lookup needs no model (the checkpoint's weights digest is memoised), the optimization runs on the Hugging
Face model of the engine's checkpoint before the engine boots (the app runs it ahead of the jobs: `fit_ahead`), and
the control then rewrites prompts like SystemPrompt on every backend.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from steer_hydra.controls.input.retemplate import encode_with_system, merge_system, real_rows
from steer_hydra.controls.rows import PROMPT_KEYS, first, read_rows, rows_digest, split_rows
from steer_hydra.controls.structural.artifacts import (
    BuildsForEngine,
    build_artifact,
    cache_root,
    content_key,
    file_sha256,
    is_complete,
    memoise_digest,
    memoised_digest,
    tokenizer_digest,
    weights_digest,
)
from steer_hydra.core.controls import BaseArgs, InputControl
from steer_hydra.core.files import read_json, write_json
from steer_hydra.core.rendering import has_chat_template
from steer_hydra.core.scoring import as_score

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when rollouts or the record change: cached optimizations are run again
Chat = list[dict[str, str]]


def run_sync(factory: Callable[[], Any]) -> Any:
    """Run `factory()`'s coroutine to completion from synchronous code (plain code, an AnyIO worker thread, or a
    running asyncio loop such as a notebook's, re-entered with nest_asyncio2 as Inspect does)."""
    import sniffio

    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library == "trio":
        raise RuntimeError(
            "An Inspect proposer cannot run inside a running trio task. Fix: call steer() from a thread."
        )
    if library == "asyncio":
        import nest_asyncio2

        nest_asyncio2.apply()
        return asyncio.run(factory())
    import anyio
    import anyio.from_thread

    try:
        anyio.from_thread.check_cancelled()
    except RuntimeError:  # not an AnyIO worker thread
        return anyio.run(factory)
    return anyio.from_thread.run(factory)


class InspectProposer:
    """A proposer (`(prompt) -> str`) backed by an Inspect model: a model name (`openai/gpt-4o-mini`,
    `mockllm/model`, `hf/...`) and/or an Inspect model role (`role=`, resolved by `get_model(role=..., default=
    model)`, so a role bound by the running evaluation wins over the default).

    Args:
        model: the Inspect model name (the default when `role` is unbound), or a built Inspect `Model` (identified by
            its name).
        role: an Inspect model role, e.g. `reflector`.
        temperature: sampling temperature of the proposals.
        max_tokens: the longest proposal.
    """

    def __init__(
        self, model: Any = None, *, role: str | None = None, temperature: float = 1.0, max_tokens: int = 256
    ) -> None:
        if not model and not role:
            raise ValueError("InspectProposer needs model= (an Inspect model name) or role=. Fix: model='openai/...'.")
        self.model, self.role, self.temperature, self.max_tokens = model, role, float(temperature), int(max_tokens)
        self._calls = 0

    def canonical_form(self) -> dict[str, Any]:
        return {
            "__class__": f"{__name__}.InspectProposer",
            "model": self.model if isinstance(self.model, str) or self.model is None else str(self.model),
            "role": self.role,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def __repr__(self) -> str:
        return f"InspectProposer(model={self.model!r}, role={self.role!r})"

    def __call__(self, prompt: str) -> str:
        from inspect_ai.model import GenerateConfig, get_model

        if self.model is not None and not isinstance(self.model, str):
            model = self.model
        else:
            model = get_model(self.model, role=self.role) if self.role else get_model(self.model)
        self._calls += 1
        config = GenerateConfig(temperature=self.temperature, max_tokens=self.max_tokens, seed=self._calls)

        async def ask() -> str:
            output = await model.generate(prompt, config=config)
            return output.completion

        return str(run_sync(ask))


def clean_instruction(text: str) -> str:
    """A proposed instruction without wrapping: the content of a fenced block when there is one, else the text,
    stripped of surrounding quotes and a leading label such as `New instruction:`."""
    fenced = re.search(r"```(?:[a-z]*\n)?(.*?)```", text, flags=re.S)
    text = fenced.group(1) if fenced else text
    text = re.sub(r"^\s*(new |improved |rewritten )?(instruction|prompt)\s*:\s*", "", text.strip(), flags=re.I)
    return text.strip().strip('"').strip("'").strip()


def generate_texts(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[Chat | str],
    *,
    max_new_tokens: int,
    batch_size: int,
    sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
) -> list[str]:
    """Continuations of `prompts` (chats through the chat template, or text), batched, greedy unless `sample`."""
    device = next(model.parameters()).device
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    texts: list[str] = []
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = list(prompts[start : start + batch_size])
            if chunk and not isinstance(chunk[0], str):
                encoded = tokenizer.apply_chat_template(
                    chunk, add_generation_prompt=True, padding=True, return_dict=True, return_tensors="pt"
                )
            else:
                encoded = tokenizer(chunk, padding=True, return_tensors="pt")
            encoded = {k: v.to(device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
            settings: dict[str, Any] = {"max_new_tokens": max_new_tokens, "do_sample": sample}
            settings.update(
                {"temperature": temperature, "top_p": 1.0, "top_k": 0}
                if sample
                else {"temperature": None, "top_p": None, "top_k": None}
            )
            devices = [device.index or 0] if device.type == "cuda" else []
            with torch.no_grad(), torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed + start)
                out = model.generate(**encoded, pad_token_id=tokenizer.pad_token_id, **settings)
            new = out[:, encoded["input_ids"].shape[1] :]
            texts += [t.strip() for t in tokenizer.batch_decode(new, skip_special_tokens=True)]
    finally:
        tokenizer.padding_side = side
    return texts


class Evaluator:
    """Rollouts and scores of instructions on the training rows, memoised per (instruction, row).

    `seen_inputs` is every row input the optimizer rolled out (the training rows only, by construction).
    """

    def __init__(self, control: PromptOptimizer, model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, Any]]):
        self.control, self.model, self.tokenizer, self.rows = control, model, tokenizer, rows
        self._outputs: dict[tuple[str, int], str] = {}
        self._scores: dict[tuple[str, int], float] = {}
        self.seen_inputs: set[str] = set()
        self.rollouts = 0

    def outputs(self, instruction: str, indices: Sequence[int]) -> list[str]:
        missing = [i for i in indices if (instruction, i) not in self._outputs]
        if missing:
            prompts = [self.control.rendered(instruction, self.rows[i]["input"], self.tokenizer) for i in missing]
            self.seen_inputs.update(self.rows[i]["input"] for i in missing)
            texts = generate_texts(
                self.model,
                self.tokenizer,
                prompts,
                max_new_tokens=self.control.max_new_tokens,
                batch_size=self.control.batch_size,
            )
            self.rollouts += len(missing)
            self._outputs.update({(instruction, i): t for i, t in zip(missing, texts, strict=True)})
        return [self._outputs[(instruction, i)] for i in indices]

    def scores(self, instruction: str, indices: Sequence[int] | None = None) -> list[float]:
        indices = list(range(len(self.rows))) if indices is None else list(indices)
        outputs = self.outputs(instruction, indices)
        for i, response in zip(indices, outputs, strict=True):
            if (instruction, i) not in self._scores:
                raw = self.control.scorer(response, self.rows[i])
                self._scores[(instruction, i)] = as_score(raw, scorer=self.control.scorer, what=f"training row {i}")
        return [self._scores[(instruction, i)] for i in indices]

    def mean(self, instruction: str, indices: Sequence[int] | None = None) -> float:
        values = self.scores(instruction, indices)
        return sum(values) / len(values) if values else 0.0


class PromptOptimizer(BuildsForEngine, InputControl):
    """Base of the prompt optimizers: training rows and a scorer in, one chosen instruction out, applied as a system
    prompt (`target: system`, SystemPrompt's modes) or as a prefix of the last user message (`target: prefix`).

    Subclasses set `OPTIMIZER` and implement `optimize(evaluator, proposer, work, out) -> dict` returning at least
    `{"chosen": str, "candidates": [{"text", "train_score"}, ...]}`.
    """

    OPTIMIZER: ClassVar[str] = "optimizer"
    _SERVING_ARGS: ClassVar[frozenset[str]] = frozenset({"cache_dir", "data", "split"})

    @dataclass(frozen=True)
    class Args(BaseArgs):
        initial: str
        data: str | list[dict[str, Any]]
        scorer: Callable[..., Any]
        split: str | None = "train"
        target: Literal["system", "prefix"] = "system"
        mode: Literal["prepend", "append", "replace"] = "prepend"
        separator: str = "\n\n"
        proposer: str | Callable[..., Any] | None = None
        max_new_tokens: int = 48
        proposal_tokens: int = 96
        batch_size: int = 8
        seed: int = 0
        cache_dir: str | None = None

        def validate(self) -> None:
            owner = type(self).__qualname__.rsplit(".", 1)[0]
            if not self.initial.strip():
                raise ValueError(f"{owner}.initial must be a non-empty instruction. Fix: initial='Answer briefly.'.")
            if isinstance(self.data, list) and not self.data:
                raise ValueError(f"{owner}.data holds no rows. Fix: give training rows or a dataset file.")
            for name in ("max_new_tokens", "proposal_tokens", "batch_size"):
                if getattr(self, name) < 1:
                    raise ValueError(f"{owner}.{name} must be >= 1; got {getattr(self, name)}.")

    supports_batching = True
    supports_refill = True

    def _configure(self) -> None:
        self.text: str | None = None
        self.optimization: dict[str, Any] | None = None
        self.evaluator: Evaluator | None = None  # the last optimization's rollouts (None when it came from the cache)
        self.reused = False

    # ------------------------------------------------------------------ identity
    @classmethod
    def content_digests(cls, args: Mapping[str, Any]) -> dict[str, str]:
        """A data file's sha256 (`data_sha256`): new training rows give a new configuration id."""
        data = args.get("data")
        if isinstance(data, (str, Path)) and str(data).strip() and Path(data).expanduser().is_file():
            return {"data_sha256": file_sha256(Path(data).expanduser())}
        return {}

    @property
    def vector_hash(self) -> str | None:
        """The digest of the chosen instruction once steered, recorded in provenance."""
        return None if self.text is None else hashlib.sha256(self.text.encode()).hexdigest()

    def provenance(self) -> dict[str, Any]:
        """The chosen instruction, its training score and the initial's, and the cache entry, once steered."""
        if self.optimization is None:
            return {}
        keys = (
            "optimizer",
            "chosen",
            "initial",
            "train_score_initial",
            "train_score_chosen",
            "train_score_policy",
            "rows",
            "path",
        )
        return {"reused": self.reused, **{k: self.optimization[k] for k in keys if k in self.optimization}}

    def training_rows(self) -> list[dict[str, Any]]:
        """The rows the optimizer may see: the data's rows of `split`, each with its prompt as `input`."""
        where = f"{type(self).__name__}.data"
        rows = split_rows(read_rows(self.data, where=where), self.split, where=where)
        return [{**row, "input": first(row, PROMPT_KEYS, where=where, what="prompt")} for row in rows]

    def settings(self) -> dict[str, Any]:
        return {k: v for k, v in self.arg_values().items() if k not in self._SERVING_ARGS}

    def library_versions(self) -> dict[str, str | None]:
        """Versions of the libraries the optimization runs on (part of the key)."""
        return {}

    def optimization_key(self, rows: list[dict[str, Any]], base_digest: str, tokenizer: Any) -> str:
        return content_key(
            {
                "optimizer": self.OPTIMIZER,
                "format": FORMAT_VERSION,
                "settings": self.settings(),
                "rows": rows_digest(rows),
                "base": base_digest,
                "tokenizer": tokenizer_digest(tokenizer),
                "libraries": self.library_versions(),
            }
        )

    # ------------------------------------------------------------------ the instruction
    def apply_instruction(self, chat: Chat, instruction: str) -> Chat:
        """`chat` with `instruction` applied (a system prompt, or a prefix of the last user message)."""
        if self.target == "system":
            return merge_system(chat, instruction, self.mode, self.separator)
        chat = [dict(m) for m in chat]
        for message in reversed(chat):
            if message.get("role") == "user":
                message["content"] = instruction + self.separator + str(message.get("content", ""))
                return chat
        return [*chat, {"role": "user", "content": instruction}]

    def rendered(self, instruction: str, text: str, tokenizer: Any) -> Chat | str:
        """A training row's prompt as the pipeline would send it under `instruction` (chat or text)."""
        if has_chat_template(tokenizer):
            return self.apply_instruction([{"role": "user", "content": text}], instruction)
        return instruction + self.separator + text

    def instruction_for(self, text: str) -> str:
        """The instruction applied to a prompt (one for all prompts; CPO picks one per prompt)."""
        if self.text is None:
            raise RuntimeError(f"{type(self).__name__} is not steered yet: its instruction is chosen at steer().")
        return self.text

    def adapt_messages(self, messages_batch: list[Chat], runtime_kwargs: Mapping[str, Any]) -> list[Chat]:
        out = []
        for chat in messages_batch:
            user = next((str(m.get("content", "")) for m in reversed(chat) if m.get("role") == "user"), "")
            out.append(self.apply_instruction(chat, self.instruction_for(user)))
        return out

    def adapt(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any]) -> list[list[int]]:
        rows = []
        for text in real_rows(input_ids, self.tokenizer):
            instruction = self.instruction_for(text)
            if self.target == "system":
                rows.append(encode_with_system(self.tokenizer, instruction, text, self.separator))
            elif has_chat_template(self.tokenizer):
                chat = self.apply_instruction([{"role": "user", "content": text}], instruction)
                encoded = self.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
                rows.append(list(encoded["input_ids"]))
            else:
                rows.append(list(self.tokenizer(instruction + self.separator + text)["input_ids"]))
        return rows

    # ------------------------------------------------------------------ proposals
    def proposer_fn(self, model: torch.nn.Module, tokenizer: Any) -> Callable[[str], str]:
        """`(prompt) -> str`: the proposer callable, an Inspect model by name, or the pipeline's own model (sampled,
        seeded per call so a rerun proposes the same texts)."""
        if callable(self.proposer):
            return self.proposer
        if isinstance(self.proposer, str):
            return InspectProposer(self.proposer, max_tokens=self.proposal_tokens)
        calls = [0]

        def own(prompt: str) -> str:
            calls[0] += 1
            chat_or_text: Chat | str = [{"role": "user", "content": prompt}] if has_chat_template(tokenizer) else prompt
            (text,) = generate_texts(
                model,
                tokenizer,
                [chat_or_text],
                max_new_tokens=self.proposal_tokens,
                batch_size=1,
                sample=True,
                seed=self.seed * 1000 + calls[0],
            )
            return text

        return own

    def propose(self, proposer: Callable[[str], str], prompt: str) -> str | None:
        """One cleaned proposal, None when it is empty."""
        text = clean_instruction(str(proposer(prompt)))
        return text or None

    # ------------------------------------------------------------------ optimization
    def optimize(self, evaluator: Evaluator, proposer: Callable[[str], str], work: Path, out: Path) -> dict[str, Any]:
        """Choose the instruction: `work` keeps resumable state across a killed run, `out` receives extra files of the
        cache entry; returns the record (`chosen`, `candidates`, ...)."""
        raise NotImplementedError

    def _run(self, model: torch.nn.Module, tokenizer: Any, base_digest: str | None = None) -> Path:
        """Choose (or find) the instruction on `model`, whose weights digest is `base_digest` when known; returns the
        cache entry. The model is only generated from (PRewrite's RL trains a copy)."""
        rows = self.training_rows()
        key = self.optimization_key(rows, base_digest or weights_digest(model), tokenizer)
        self.evaluator = None

        def build(work: Path, out: Path) -> None:
            evaluator = self.evaluator = Evaluator(self, model, tokenizer, rows)
            was_training = model.training
            model.eval()
            try:
                logger.info("%s: optimizing the instruction on %d training rows", type(self).__name__, len(rows))
                result = self.optimize(evaluator, self.proposer_fn(model, tokenizer), work, out)
            finally:
                model.train(was_training)
            result.setdefault("initial", self.initial)
            result.setdefault("train_score_initial", evaluator.mean(self.initial))
            if "train_score_chosen" not in result and isinstance(result.get("chosen"), str):
                result["train_score_chosen"] = evaluator.mean(result["chosen"])
            result.update(optimizer=self.OPTIMIZER, rows=len(rows), rollouts=evaluator.rollouts)
            write_json(out / "result.json", result)

        entry, built = build_artifact(
            "prompts", key, build, cache_dir=self.cache_dir, record={"optimizer": self.OPTIMIZER}
        )
        self.reused = not built
        self._load(entry)
        return entry

    def _load(self, entry: Path) -> None:
        self.optimization = dict(read_json(entry / "result.json"))
        self.optimization["path"] = str(entry)
        self.text = str(self.optimization["chosen"])
        logger.info(
            "%s: %s instruction %r (training score %.3f, initial %.3f)",
            type(self).__name__,
            "reused" if self.reused else "chose",
            self.text[:200],
            float(self.optimization.get("train_score_chosen", float("nan"))),
            float(self.optimization.get("train_score_initial", float("nan"))),
        )

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        if tokenizer is not None:
            self.tokenizer = tokenizer
        if self.optimization is not None and model is None:
            return None  # prepared for an engine already (prepare_for_engine)
        if model is None:
            raise RuntimeError(
                f"{type(self).__name__} optimizes on the live model (backend=huggingface); a vLLM backend calls "
                "prepare_for_engine() first."
            )
        self._run(model, self.tokenizer)
        return None

    def found_for_engine(self, model_path: str, tokenizer: Any, dtype: Any = None) -> bool:
        self.tokenizer = tokenizer
        digest = memoised_digest(model_path, dtype, self.cache_dir)
        if digest is None:
            return False
        entry = self.cache_folder / self.optimization_key(self.training_rows(), digest, tokenizer)
        if not is_complete(entry):
            return False
        self.reused = True
        self._load(entry)
        return True

    def build_for_engine(self, model: torch.nn.Module, model_path: str, tokenizer: Any, dtype: Any = None) -> Path:
        self.tokenizer = tokenizer
        return self._run(model, tokenizer, memoise_digest(model, model_path, dtype, self.cache_dir))

    def cleanup(self) -> None:
        """Nothing to undo (the instruction stays chosen; the cache keeps it)."""

    @property
    def cache_folder(self) -> Path:
        return cache_root(self.cache_dir) / "prompts"


def best_candidate(candidates: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The candidate with the highest training score; the earliest wins a tie (the initial is listed first)."""
    best = candidates[0]
    for candidate in candidates[1:]:
        if float(candidate["train_score"]) > float(best["train_score"]):
            best = candidate
    return best
