"""ModelMerge: run the pipeline on a merge of checkpoints (linear, SLERP, TIES, task arithmetic, DARE) built with
mergekit, once per content digest, swapped into the live model and restored at release.

How it runs (Hugging Face): `steer()` resolves each input to a folder (a folder as given; a built-in `steer_hydra:`
reference through the backend's model loader, which materializes it; a Hub id is handed to mergekit as it is),
computes the merge's key (`content_key` of the recipe with every folder replaced by its content digest, and the
mergekit version), and builds the merged checkpoint with `mergekit.merge.run_merge` into the artifact cache
(`<cache>/merges/<key>/`, written in a work folder and renamed into place whole: see `artifacts`). A second job with
the same recipe and inputs reuses it. The merged weights are then swapped into the live model with `WeightSwap`
(the LoadCheckpoint step) and the base's values come back bit for bit at release.

Identity: the configuration's `config_id` holds the recipe (the Args) and the content digests of every folder input
(`content_digests`), so new weights in an input give a new id; `vector_hash` is the merged weights' digest.

Methods (mergekit's names, the papers: Wortsman et al. 2022 model soups for `linear`; Shoemake's SLERP, as
popularized for LLMs by mergekit; Yadav et al. 2023 for `ties`; Ilharco et al. 2023 for `task_arithmetic`; Yu et al.
2024 for `dare_ties`):
- `linear`: `sum_i w_i W_i / sum_i w_i` (each model's `weight`; `parameters.normalize: false` drops the division);
- `slerp`: spherical interpolation of two models at `parameters.t` (0 is `base_model`);
- `ties`, `dare_ties`, `task_arithmetic`: task vectors `W_i - W_base` (trimmed to `density` and sign-elected for
  TIES; randomly dropped and rescaled for DARE), weighted by `weight`, added to `base_model`.

Hugging Face only (`check()` refuses vLLM, naming the fix: serve the merged folder as the model).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from steer_hydra.controls.structural.artifacts import (
    CHECKPOINT_PATTERNS,
    build_artifact,
    content_key,
    folder_sha256,
    weights_digest,
)
from steer_hydra.controls.structural.checkpoint import (
    WeightSwap,
    architecture_mismatches,
    folder_tensors,
    read_config,
)
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, Reference, StructuralControl

logger = logging.getLogger(__name__)

METHODS = ("linear", "slerp", "ties", "dare_ties", "task_arithmetic")
_NEEDS_BASE = ("slerp", "ties", "dare_ties", "task_arithmetic")
INSTALL_HINT = "pip install 'steer_hydra[merge]' (mergekit)"


def import_mergekit() -> Any:
    """`(MergeConfiguration, MergeOptions, run_merge)`, or an ImportError naming the extra to install."""
    try:
        from mergekit.config import MergeConfiguration
        from mergekit.merge import MergeOptions, run_merge
    except ImportError as error:
        raise ImportError(f"ModelMerge needs mergekit: {INSTALL_HINT}.") from error
    return MergeConfiguration, MergeOptions, run_merge


def _is_folder(reference: str) -> bool:
    return Path(reference).expanduser().is_dir()


def _identity(reference: str, cache_dir: Any = None) -> str:
    """A folder's content digest, or the reference itself (a built-in or Hub reference names its content)."""
    if _is_folder(reference):
        return f"sha256:{folder_sha256(Path(reference).expanduser(), CHECKPOINT_PATTERNS, cache_dir=cache_dir)}"
    return reference


class ModelMerge(StructuralControl):
    """A merge of checkpoints of the base model's architecture, built with mergekit and cached by content digest.

    Args:
        method: `linear`, `slerp`, `ties`, `dare_ties` or `task_arithmetic` (see the module docstring).
        models: the inputs, each `{model: <folder or reference>, weight: ..., density: ...}` (the per-model
            parameters mergekit takes for the method; `linear` needs a `weight` on each).
        base_model: the base of `slerp` (t = 0) and of the task-vector methods; a folder or reference.
        parameters: the method's global parameters (`t` for slerp, `normalize`, `int8_mask`, ...).
        dtype: the dtype the merge computes and writes in.
        cache_dir: the artifact cache (default `$STEER_HYDRA_CACHE`, else `~/.cache/steer_hydra`).

    Batches and refills. Hugging Face only.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        method: Literal["linear", "slerp", "ties", "dare_ties", "task_arithmetic"]
        models: list[dict[str, Any]]
        base_model: str | None = None
        parameters: dict[str, Any] = field(default_factory=dict)
        dtype: Literal["float32", "bfloat16", "float16"] = "float32"
        cache_dir: str | None = None

        def validate(self) -> None:
            if not self.models or any(
                not isinstance(m, Mapping) or not str(m.get("model") or "").strip() for m in self.models
            ):
                raise ValueError(
                    f"ModelMerge.models must be a non-empty list of {{model: <folder or reference>, ...}}; got "
                    f"{self.models!r}. Fix: models=[{{model: /path/a, weight: 0.5}}, {{model: /path/b, weight: 0.5}}]."
                )
            if self.method in _NEEDS_BASE and not self.base_model:
                raise ValueError(
                    f"ModelMerge.method={self.method!r} needs base_model (the model the others are measured from). "
                    "Fix: base_model=<folder or reference>."
                )
            if self.method == "linear" and (len(self.models) < 2 or any("weight" not in m for m in self.models)):
                raise ValueError(
                    "ModelMerge.method='linear' needs two or more models, each with a weight. "
                    "Fix: models=[{model: A, weight: 0.5}, {model: B, weight: 0.5}]."
                )
            if self.method == "slerp":
                t = self.parameters.get("t")
                if len(self.models) != 2 or not isinstance(t, (int, float)) or not 0 <= t <= 1:
                    raise ValueError(
                        f"ModelMerge.method='slerp' interpolates two models at parameters.t in [0, 1]; got "
                        f"{len(self.models)} models and t={t!r}. Fix: two models and parameters={{t: 0.5}}."
                    )

    supports_batching = True
    supports_refill = True
    restores_base = True  # edits the given model in place and restores it bit for bit: runs on a shared base

    def _configure(self) -> None:
        self._swap = WeightSwap()
        self._merged_sha256: str | None = None
        self.merged_path: Path | None = None
        self.built = False  # whether the last steer() built the merge (False: reused from the cache)

    # ------------------------------------------------------------------ identity
    @classmethod
    def references(cls, args: Mapping[str, Any]) -> dict[str, Reference]:
        """The models `steer()` merges (`models[i].model`) and the `base_model`, resolved before the model loads."""
        found = {
            f"models[{i}].model": Reference(str(m["model"]))
            for i, m in enumerate(args.get("models") or ())
            if isinstance(m, Mapping) and str(m.get("model") or "").strip()
        }
        base = args.get("base_model")
        if isinstance(base, str) and base.strip():
            found["base_model"] = Reference(base)
        return found

    @classmethod
    def content_digests(cls, args: Mapping[str, Any]) -> dict[str, str]:
        """The content digests of the folder inputs (`inputs_sha256`, by reference), so new weights in an input
        give a new configuration id; references that are not folders stay in the Args."""
        references = [str(m.get("model")) for m in args.get("models") or () if isinstance(m, Mapping)]
        if args.get("base_model"):
            references.append(str(args["base_model"]))
        folders = sorted({r for r in references if r.strip() and _is_folder(r)})
        try:
            digests = {r: _identity(r, args.get("cache_dir")) for r in folders}
        except ValueError:
            return {}  # a folder without weights: steer() refuses it, naming the fix
        return {"inputs_sha256": content_key(digests)} if digests else {}

    @property
    def vector_hash(self) -> str | None:
        """The merged checkpoint's content digest once steered, recorded in provenance."""
        return self._merged_sha256

    def provenance(self) -> dict[str, Any]:
        """The merged checkpoint's cache entry and whether this steer built it, once steered."""
        if self.merged_path is None:
            return {}
        return {"merged": str(self.merged_path), "built": self.built, "weights_sha256": self._merged_sha256}

    def recipe(self, resolve: Callable[[str], str] = str) -> dict[str, Any]:
        """mergekit's configuration for this merge, with each reference mapped through `resolve`."""
        config: dict[str, Any] = {
            "merge_method": self.method,
            "models": [
                {
                    "model": resolve(str(m["model"])),
                    **(
                        {"parameters": dict(params)} if (params := {k: v for k, v in m.items() if k != "model"}) else {}
                    ),
                }
                for m in self.models
            ],
            "dtype": self.dtype,
        }
        if self.base_model:
            config["base_model"] = resolve(self.base_model)
        if self.parameters:
            config["parameters"] = dict(self.parameters)
        return config

    # ------------------------------------------------------------------ declarations
    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.IN_PROCESS_TORCH})

    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        if backend_kind in ("vllm", "vllm_serve"):
            return [
                "ModelMerge swaps merged weights into a live model; an engine serves one checkpoint. Fix: build the "
                "merge once on backend=huggingface (it is cached under <cache>/merges/) and serve that folder as "
                f"model.model_name_or_path on backend={backend_kind}."
            ]
        return []

    # ------------------------------------------------------------------ Hugging Face
    def _folder(self, reference: str, load_model: Callable[..., Any] | None) -> str:
        """A folder (or Hub id) mergekit can read for `reference`."""
        if _is_folder(reference):
            return str(Path(reference).expanduser().resolve())
        if reference.startswith("steer_hydra:"):
            if load_model is None:
                raise RuntimeError(
                    f"ModelMerge: the built-in reference {reference!r} needs the Hugging Face backend to materialize "
                    "it. Fix: use backend=huggingface, or give the input as a folder."
                )
            other = load_model(reference)
            folder = str(getattr(other.config, "_name_or_path", "") or "")
            del other
            if not _is_folder(folder):
                raise RuntimeError(f"ModelMerge: {reference!r} loaded without a folder ({folder!r}).")
            return folder
        return reference  # a Hub id: mergekit reads it from the Hugging Face cache

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> torch.nn.Module:
        where = f"ModelMerge({self.method})"
        if model is None:
            raise RuntimeError(f"{where} needs the live model. Fix: use backend=huggingface.")
        merge_config, merge_options, run_merge = import_mergekit()
        load_model = kwargs.get("load_model")
        folders: dict[str, str] = {}

        def resolve(reference: str) -> str:
            if reference not in folders:
                folders[reference] = self._folder(reference, load_model)
            return folders[reference]

        recipe = self.recipe(resolve)
        identity = self.recipe(lambda r: _identity(resolve(r), self.cache_dir))
        from importlib.metadata import version

        key = content_key({"recipe": identity, "mergekit": version("mergekit")})

        def build(work: Path, out: Path) -> None:
            logger.info("Merging %d models (%s) into %s", len(self.models), self.method, out)
            options = merge_options(
                copy_tokenizer=True,
                lazy_unpickle=False,
                low_cpu_memory=False,
                quiet=True,
                device="cuda" if torch.cuda.is_available() else "cpu",
                write_model_card=False,
            )
            run_merge(merge_config.model_validate(recipe), str(out), options)

        entry, self.built = build_artifact("merges", key, build, cache_dir=self.cache_dir, record={"recipe": identity})
        mismatches = architecture_mismatches(model, read_config(entry))
        if mismatches:
            raise ValueError(
                f"{where}: the merged checkpoint is another architecture than the model: {'; '.join(mismatches)}. "
                "Fix: merge checkpoints of the base model's architecture."
            )
        self._swap.apply(model, folder_tensors(entry), where=f"{where} at {entry}")
        self.merged_path = entry
        self._merged_sha256 = weights_digest(model)
        logger.info("%s %s from %s", where, "built" if self.built else "reused", entry)
        return model

    def cleanup(self) -> None:
        """Put the base model's weights back (bit-exact); idempotent."""
        self._swap.restore()
