"""LoReFT (Wu et al. 2024, "ReFT: Representation Finetuning for Language Models", arXiv 2404.03592), written from
the paper: a low-rank edit of one decoder layer's residual stream at a few prompt positions, trained at `steer()`.

The intervention at layer `layer` replaces a hidden state `h` by `h + R' (W h + b - R h)`, where `R` (`rank x
hidden`) has orthonormal rows and `W`, `b` are a linear map into the same `rank` dimensions: the states' projection
on a `rank`-dimensional subspace is replaced by a learned function of the state, nothing else changes. It acts on
the first `first` and the last `last` real tokens of the prompt (the paper's prefix and suffix positions), at every
row of a left-padded batch, never on generated tokens: they see the edit through the later layers' keys and values
of the prompt, so the edited layer must not be the last one.

Training (the paper's supervised objective, the model frozen): each training row's response tokens are predicted
after its prompt with the intervention on the prompt positions; `R` is kept orthonormal by an orthogonal
parametrization and trained with `W`, `b` by AdamW over `epochs` (tqdm shows progress). The model's weights never
change (their `requires_grad` flags come back as they were), so the live model is trained against directly. The
parameters are cached (`<cache>/reft/<key>/reft.safetensors`) by a digest of the rows (the split only), the
settings, the base model's weights and the tokenizer: a second job reuses them (zero steps).

Hugging Face only (a position-dependent learned edit has no engine form). AxBench's concept arm `reft_concept`
trains it on the concept's positive answers.
"""

from __future__ import annotations

import copy
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from steer_hydra.controls.rows import PROMPT_KEYS, RESPONSE_KEYS, first, read_rows, rows_digest, split_rows
from steer_hydra.controls.state.residual import output_hidden, past_length, with_output_hidden
from steer_hydra.controls.structural.artifacts import (
    build_artifact,
    content_key,
    file_sha256,
    tokenizer_digest,
    weights_digest,
)
from steer_hydra.core.controls import BaseArgs, HookSet, StateControl
from steer_hydra.core.layout import resolve_layout
from steer_hydra.core.rendering import has_chat_template

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
FILE = "reft.safetensors"


def intervention_mask(starts: torch.Tensor, lengths: torch.Tensor, width: int, first: int, last: int) -> torch.Tensor:
    """`[rows, width]`: the columns of each row's first `first` and last `last` prompt tokens (a row's prompt spans
    columns `starts[i]` to `starts[i] + lengths[i] - 1`)."""
    columns = torch.arange(width)[None, :]
    offset = columns - starts[:, None]
    inside = (offset >= 0) & (offset < lengths[:, None])
    return inside & ((offset < first) | (offset >= lengths[:, None] - last))


def loreft(hidden: torch.Tensor, rotation: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`h + R' (W h + b - R h)` over the last dimension."""
    return hidden + (hidden @ weight.T + bias - hidden @ rotation.T) @ rotation


class _Parameters(torch.nn.Module):
    """The trainable intervention: `R` (orthonormal rows through a parametrization), `W` and `b`."""

    def __init__(self, hidden: int, rank: int, generator: torch.Generator) -> None:
        super().__init__()
        self.rotate = torch.nn.Linear(hidden, rank, bias=False)
        self.learned = torch.nn.Linear(hidden, rank)
        with torch.no_grad():
            self.rotate.weight.copy_(torch.linalg.qr(torch.randn(hidden, rank, generator=generator))[0].T)
            self.learned.weight.normal_(0, hidden**-0.5, generator=generator)
            self.learned.bias.zero_()
        torch.nn.utils.parametrizations.orthogonal(self.rotate)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {
            "rotation": self.rotate.weight.detach().float().cpu().contiguous(),
            "weight": self.learned.weight.detach().float().cpu().contiguous(),
            "bias": self.learned.bias.detach().float().cpu().contiguous(),
        }


class LoReFT(StateControl):
    """A trained low-rank representation edit at a few prompt positions (see the module docstring).

    Args:
        data: the training rows (`{prompt, response}` or a concept's pairs, trained on their positives), a file or
            rows; rows of another split than `split` are never read.
        layer: the decoder layer whose output is edited (default: the middle of the model, never the last: no later
            layer would read the edited prompt states).
        rank: the subspace's dimension (the paper's `r`).
        first, last: the prompt positions edited (the paper's prefix `p` and suffix `s`).
        epochs, learning_rate, batch_size, weight_decay, seed: the training.
        cache_dir: the artifact cache (default `$STEER_HYDRA_CACHE`, else `~/.cache/steer_hydra`).

    Batches (positions come from each row's own prompt); no refill. Hugging Face only.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        data: str | list[dict[str, Any]]
        split: str | None = "train"
        layer: int | None = None
        rank: int = 4
        first: int = 3
        last: int = 3
        epochs: float = 3.0
        learning_rate: float = 2e-3
        batch_size: int = 4
        weight_decay: float = 0.0
        max_length: int = 256
        seed: int = 0
        cache_dir: str | None = None

        def validate(self) -> None:
            if isinstance(self.data, list) and not self.data:
                raise ValueError("LoReFT.data holds no rows. Fix: give training rows or a dataset file.")
            for name in ("rank", "batch_size", "max_length"):
                if getattr(self, name) < 1:
                    raise ValueError(f"LoReFT.{name} must be >= 1; got {getattr(self, name)}.")
            if self.first < 0 or self.last < 0 or self.first + self.last == 0:
                raise ValueError(
                    f"LoReFT edits the first `first` and last `last` prompt positions; got first={self.first}, "
                    f"last={self.last}. Fix: e.g. first=3, last=3."
                )
            if self.epochs <= 0 or self.learning_rate <= 0:
                raise ValueError("LoReFT.epochs and LoReFT.learning_rate must be > 0.")

    supports_batching = True
    _SERVING_ARGS = frozenset({"cache_dir", "data", "split"})

    def _configure(self) -> None:
        self._tensors: dict[str, torch.Tensor] | None = None
        self._path: str | None = None
        self._layer_index: int | None = None
        self.artifact_path: Path | None = None
        self.trained_steps = 0
        self.losses: list[float] = []  # mean training loss per epoch of the last training (empty when reused)

    # ------------------------------------------------------------------ identity
    @classmethod
    def content_digests(cls, args: Mapping[str, Any]) -> dict[str, str]:
        data = args.get("data")
        if isinstance(data, (str, Path)) and str(data).strip() and Path(data).expanduser().is_file():
            return {"data_sha256": file_sha256(Path(data).expanduser())}
        return {}

    @property
    def vector_hash(self) -> str | None:
        return file_sha256(self.artifact_path / FILE) if self.artifact_path is not None else None

    def provenance(self) -> dict[str, Any]:
        if self.artifact_path is None:
            return {}
        return {"artifact": str(self.artifact_path), "trained_steps": self.trained_steps, "layer": self._layer_index}

    def training_rows(self) -> list[tuple[str, str]]:
        """`(prompt, response)` of every training row (the data's rows of `split`)."""
        where = "LoReFT.data"
        rows = split_rows(read_rows(self.data, where=where), self.split, where=where)
        return [
            (first(r, PROMPT_KEYS, where=where, what="prompt"), first(r, RESPONSE_KEYS, where=where, what="response"))
            for r in rows
        ]

    # ------------------------------------------------------------------ training
    def _prompt_ids(self, tokenizer: Any, prompt: str) -> list[int]:
        if has_chat_template(tokenizer):
            chat = [{"role": "user", "content": prompt}]
            return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)["input_ids"])
        return list(tokenizer(prompt)["input_ids"])

    def _examples(self, tokenizer: Any, rows: list[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        out = []
        for prompt, response in rows:
            ids = self._prompt_ids(tokenizer, prompt)
            answer = list(tokenizer(response, add_special_tokens=False)["input_ids"]) + eos
            out.append((ids[-self.max_length :], answer[: self.max_length]))
        return out

    def _hook(self, params: Any, state: dict[str, Any]) -> tuple[Any, Any]:
        """A pre-hook (positions already cached) and a forward hook (the edit at the masked columns of `state`)."""
        layer = self._layer_index

        def before(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            state["past"] = past_length(kwargs, layer)

        def after(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            hidden = output_hidden(output)
            past, window = state["past"], hidden.shape[1]
            mask = state["mask"]
            if past >= mask.shape[1]:
                return None
            columns = mask[:, past : past + window].to(hidden.device)
            if columns.shape[0] != hidden.shape[0]:  # beams or n candidates: rows repeated
                columns = columns.repeat_interleave(hidden.shape[0] // columns.shape[0], dim=0)
            if columns.shape[1] < window:
                columns = torch.nn.functional.pad(columns, (0, window - columns.shape[1]))
            rotation, weight, bias = (t.to(device=hidden.device, dtype=hidden.dtype) for t in params())
            edited = torch.where(columns[..., None], loreft(hidden, rotation, weight, bias), hidden)
            return with_output_hidden(output, edited)

        return before, after

    def _train(self, model: torch.nn.Module, tokenizer: Any, rows: list[tuple[str, str]], out: Path) -> None:
        from safetensors.torch import save_file
        from tqdm.auto import tqdm

        layout = resolve_layout(model)
        device = next(model.parameters()).device
        generator = torch.Generator().manual_seed(self.seed)
        params = _Parameters(layout.hidden_size, self.rank, generator).to(device)
        examples = self._examples(tokenizer, rows)
        steps_per_epoch = -(-len(examples) // self.batch_size)
        total = max(1, round(self.epochs * steps_per_epoch))
        optimizer = torch.optim.AdamW(params.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay)
        state: dict[str, Any] = {}
        before, after = self._hook(lambda: (params.rotate.weight, params.learned.weight, params.learned.bias), state)
        module = model.get_submodule(layout.layer_path(self._layer_index))
        flags = {name: p.requires_grad for name, p in model.named_parameters()}
        training = model.training
        handles = [
            module.register_forward_pre_hook(before, with_kwargs=True),
            module.register_forward_hook(after, with_kwargs=True),
        ]
        order = random.Random(self.seed)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.losses, self.trained_steps = [], 0
        try:
            model.eval()
            model.requires_grad_(False)
            with tqdm(total=total, desc="LoReFT", disable=None) as bar:
                while self.trained_steps < total:
                    batch_order = list(range(len(examples)))
                    order.shuffle(batch_order)
                    epoch_losses = []
                    for start in range(0, len(batch_order), self.batch_size):
                        if self.trained_steps >= total:
                            break
                        chunk = [examples[i] for i in batch_order[start : start + self.batch_size]]
                        width = max(len(p) + len(a) for p, a in chunk)
                        ids = torch.full((len(chunk), width), pad)
                        labels = torch.full((len(chunk), width), -100)
                        attention = torch.zeros((len(chunk), width), dtype=torch.long)
                        for row, (prompt, answer) in enumerate(chunk):
                            seq = prompt + answer
                            ids[row, : len(seq)] = torch.tensor(seq)
                            labels[row, len(prompt) : len(seq)] = torch.tensor(answer)
                            attention[row, : len(seq)] = 1
                        lengths = torch.tensor([len(p) for p, _ in chunk])
                        state["mask"] = intervention_mask(
                            torch.zeros_like(lengths), lengths, width, self.first, self.last
                        )
                        logits = model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
                        loss = torch.nn.functional.cross_entropy(
                            logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                            labels[:, 1:].reshape(-1).to(device),
                            ignore_index=-100,
                        )
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
                        self.trained_steps += 1
                        epoch_losses.append(loss.item())
                        bar.update(1)
                        bar.set_postfix(loss=f"{epoch_losses[-1]:.3f}")
                    self.losses.append(sum(epoch_losses) / max(1, len(epoch_losses)))
        finally:
            for handle in handles:
                handle.remove()
            for name, param in model.named_parameters():
                param.requires_grad_(flags[name])
            model.train(training)
        save_file(params.tensors(), str(out / FILE))

    # ------------------------------------------------------------------ steer
    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("LoReFT edits the live model's hidden states. Fix: use backend=huggingface.")
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        layout = resolve_layout(model)
        last = layout.num_layers - 1
        self._layer_index = self.layer if self.layer is not None else max(0, min(layout.default_layer(0.5), last - 1))
        layout.layer_path(self._layer_index)  # range check
        if self._layer_index % layout.num_layers == last:
            logger.warning(
                "LoReFT at the last decoder layer (%d) edits states no later layer reads: only the first generated "
                "token can change. Fix: layer=%d or lower.",
                last,
                last - 1,
            )
        rows = self.training_rows()
        settings = {k: v for k, v in self.arg_values().items() if k not in self._SERVING_ARGS}
        settings["layer"] = self._layer_index
        key = content_key(
            {
                "trainer": "loreft",
                "format": FORMAT_VERSION,
                "settings": settings,
                "rows": rows_digest([list(r) for r in rows]),
                "base": weights_digest(model),
                "tokenizer": tokenizer_digest(tokenizer),
            }
        )
        self.trained_steps = 0
        entry, built = build_artifact(
            "reft",
            key,
            lambda work, out: self._train(model, copy.copy(tokenizer), rows, out),
            cache_dir=self.cache_dir,
            record={"trainer": "loreft", "rows": len(rows), "layer": self._layer_index},
        )
        if not built:
            self.losses = []
            logger.info("LoReFT: parameters reused from %s (0 steps now)", entry)
        from safetensors.torch import load_file

        self._tensors = load_file(str(entry / FILE))
        self._path = layout.layer_path(self._layer_index)
        self.artifact_path = entry
        return None

    def get_hooks(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> HookSet:
        if self._tensors is None or self._path is None:
            raise RuntimeError("LoReFT is not steered yet: its parameters are trained (or loaded) at steer().")
        mask = kwargs.get("attention_mask")
        width = input_ids.shape[1]
        lengths = mask.sum(dim=1).cpu() if mask is not None else torch.full((input_ids.shape[0],), width)
        state = {"mask": intervention_mask(width - lengths, lengths, width, self.first, self.last)}
        tensors = self._tensors
        before, after = self._hook(lambda: (tensors["rotation"], tensors["weight"], tensors["bias"]), state)
        return {
            "pre": [{"module": self._path, "hook_func": before}],
            "forward": [{"module": self._path, "hook_func": after}],
        }

    def cleanup(self) -> None:
        """Nothing stays on the model (hooks live for one call); the parameters stay loaded until release."""
