"""Preflight: every check of a composed job config that needs no model, run before anything loads or is written.

Invariants:
- nothing here loads a model, builds a pipeline, writes a file (the writability check creates and removes an
  empty directory) or starts W&B; the slowest checks are Hub lookups bounded by `HUB_TIMEOUT` seconds each (the
  model, and the datasets of `inspect_evals` tasks that are not cached; none at all under `HF_HUB_OFFLINE=1`) and
  one HTTP request to a network judge's server bounded by `app.judge.PROBE_TIMEOUT` seconds;
- every problem found is reported in one `ConfigError` whose message is one line: the config key, the bad
  value, what is wrong and `Fix: ...`; several problems are numbered in the same line;
- checks that need the model's shape (context window, number of layers and heads) use its config (`config.json`
  of a local or cached checkpoint, the built-in models' known shapes, vLLM's `max_model_len`) and are skipped
  when it is unknown before load;
- names that become directories and the output directories use the same rules as the resolvers of
  `app.schema`, which already refuse them while Hydra resolves its run and sweep directories.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from steer_hydra.app.compose import to_plain
from steer_hydra.app.schema import dir_name_problem, writable_dir_problem
from steer_hydra.app.secrets import is_secret_name
from steer_hydra.core.backend import BackendSpec
from steer_hydra.core.errors import ConfigError
from steer_hydra.core.layout import CONTEXT_FIELDS, config_int
from steer_hydra.evaluation.suite import EXECUTION_FIELDS
from steer_hydra.models.checks import HUB_TIMEOUT, hub_offline, known_config, reference_problems

# `generate_defaults` / `suite.generate_overrides` go to `eval_set(**settings)`: GenerateConfig fields plus
# eval_set options. These eval_set parameters are set by the suite itself and cannot be overridden.
RESERVED_EVAL_SET_KEYS = frozenset({"tasks", "log_dir", "model", "model_args", "model_base_url", "kwargs"})
# Names that become directory or file names: one path component each.
PATH_NAMES = ("experiment_name", "model.name", "suite.name", "arm.name", "baseline_arm")
OUTPUT_DIRS = ("output_root", "save_dir")  # directories a job creates and writes
# eval_set options that decide how failures are handled; the suite sets them so that a failing sample fails alone
# and a re-run retries it (Inspect never retries a sample that errored under fail_on_error=false or a fraction).
FAILURE_POLICY_KEYS = ("fail_on_error", "continue_on_fail")
EXTRA_FOR_PACKAGE = {"inspect_evals": "pip install 'steer_hydra[evals]' (the inspect-evals package)"}
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")


def preflight(cfg: Any) -> None:
    """Raise `ConfigError` (one line, every problem numbered) when the job config cannot work; else return."""
    problems: list[str] = []
    plain = _resolved(cfg, problems)
    for check in (
        check_path_names,
        check_output_dirs,
        check_trials,
        check_secrets,
        check_generation,
        check_devices,
        check_backend,
        check_model,
        check_layers,
        check_tasks,
        check_concept,
        check_datasets,
        check_judge_model,
    ):
        problems.extend(p for p in check(plain) if p not in problems)
    if problems:
        raise ConfigError(format_problems(problems))


def preflight_references(cfg: Any) -> None:
    """Raise `ConfigError` (one line, every problem numbered) when a second model or file the arm's controls name
    cannot be loaded (`check_control_references`); run after `preflight`, before the main model loads. It imports
    the arm's control classes (as building the job does next), which `preflight` itself never does."""
    problems = check_control_references(to_plain(cfg))
    if problems:
        raise ConfigError(format_problems(list(dict.fromkeys(problems))))


def _resolved(cfg: Any, problems: list[str]) -> Mapping[str, Any]:
    """The plain config; when `save_dir`'s interpolation refuses a name or directory, the rest of it (the refusal
    is recorded once, and the checks below name the key it comes from)."""
    try:
        return to_plain(cfg)
    except Exception as error:  # OmegaConf wraps what a resolver raises
        refusal = _config_error_in(error)
        if refusal is None or not OmegaConf.is_config(cfg):
            raise
        raw = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
        raw.pop("hydra", None)
        raw["save_dir"] = None
        problems.append(str(refusal))
        return to_plain(OmegaConf.create(raw))


def _config_error_in(error: BaseException | None) -> ConfigError | None:
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ConfigError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def format_problems(problems: list[str]) -> str:
    """One line: the problem itself, or `N problems: (1) ... (2) ...`."""
    lines = [" ".join(p.split()) for p in problems]
    if len(lines) == 1:
        return lines[0]
    return f"{len(lines)} problems: " + " ".join(f"({i}) {p}" for i, p in enumerate(lines, 1))


def _get(plain: Mapping[str, Any], dotted: str) -> Any:
    node: Any = plain
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


# ---------------------------------------------------------------------------------------------- names, secrets
def check_path_names(plain: Mapping[str, Any]) -> list[str]:
    """Names that become directories must be one safe path component (no `..`, no separators)."""
    values = {key: _get(plain, key) for key in PATH_NAMES}
    return [p for key, value in values.items() if value is not None and (p := dir_name_problem(key, value))]


def check_output_dirs(plain: Mapping[str, Any]) -> list[str]:
    """`output_root` and `save_dir` exist as writable directories or can be created (`writable_dir_problem`); a
    `save_dir` of None was refused by its interpolation (recorded) or is not set."""
    values = {key: plain.get(key) for key in OUTPUT_DIRS}
    return [
        p
        for key, value in values.items()
        if not (value is None and key == "save_dir") and (p := writable_dir_problem(key, value))
    ]


def check_trials(plain: Mapping[str, Any]) -> list[str]:
    """`num_trials` is an integer >= 1 (every trial is one evaluation of each cell)."""
    value = plain.get("num_trials")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return [
            f"num_trials={value!r}: each trial evaluates every task once, so there must be at least one. Fix: "
            "num_trials=1 (or more, for repeated trials with derived seeds)."
        ]
    return []


def _secret_keys(node: Any, prefix: str) -> list[str]:
    found = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{prefix}.{key}"
            if isinstance(key, str) and is_secret_name(key) and isinstance(value, str) and value:
                found.append(where)
            else:
                found.extend(_secret_keys(value, where))
    return found


def check_secrets(plain: Mapping[str, Any]) -> list[str]:
    """Keys and tokens never go in the config (it is written to disk, the protocol and W&B): refuse them."""
    problems = []
    for where in _secret_keys(plain.get("backend"), "backend"):
        problems.append(
            f"{where} holds a secret in the config, which is written to .hydra/, the protocol and W&B. Fix: "
            "export the key in an environment variable and remove the override; a backend that sends a key names "
            "its variable in its options (backend.options.api_key_env=<VAR>)."
        )
    for group in ("model", "provider", "suite", "generate_defaults"):
        for where in _secret_keys(plain.get(group), group):
            problems.append(
                f"{where} holds a secret in the config, which is written to .hydra/, the protocol and W&B. Fix: "
                "remove it and set it in the environment instead (HF_TOKEN or `hf auth login` for the Hub)."
            )
    return problems


# ---------------------------------------------------------------------------------------------- generation
def _generation_keys() -> tuple[frozenset[str], frozenset[str]]:
    import inspect

    from inspect_ai import eval_set
    from inspect_ai.model import GenerateConfig

    eval_set_keys = frozenset(inspect.signature(eval_set).parameters) - RESERVED_EVAL_SET_KEYS
    return frozenset(GenerateConfig.model_fields), eval_set_keys


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


# key -> (rule text, predicate on a number); a value that is not a number fails too
_SIGN_RULES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "temperature": (">= 0 (0 is greedy)", lambda v: v >= 0),
    "max_tokens": ("an integer >= 1", lambda v: v >= 1 and v == int(v)),
    "top_p": ("in (0, 1]", lambda v: 0 < v <= 1),
    "top_k": ("an integer >= 1", lambda v: v >= 1 and v == int(v)),
    "num_choices": ("an integer >= 1", lambda v: v >= 1 and v == int(v)),
    "max_connections": ("an integer >= 1", lambda v: v >= 1 and v == int(v)),
    "max_samples": ("an integer >= 1", lambda v: v >= 1 and v == int(v)),
    "max_retries": ("an integer >= 0", lambda v: v >= 0 and v == int(v)),
    "timeout": ("> 0 seconds", lambda v: v > 0),
    "attempt_timeout": ("> 0 seconds", lambda v: v > 0),
    "seed": ("an integer", lambda v: v == int(v)),
}


def generation_settings(plain: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """`(config key, setting, value)` of every generation setting, defaults first (the suite's win)."""
    settings = [(f"generate_defaults.{k}", k, v) for k, v in (plain.get("generate_defaults") or {}).items()]
    overrides = _get(plain, "suite.generate_overrides") or {}
    settings += [(f"suite.generate_overrides.{k}", k, v) for k, v in overrides.items()]
    return settings


def check_generation(plain: Mapping[str, Any]) -> list[str]:
    """Known keys (GenerateConfig fields or eval_set options), types and signs, max_tokens within the context."""
    generate_keys, eval_set_keys = _generation_keys()
    problems = []
    effective: dict[str, tuple[str, Any]] = {}
    for where, key, value in generation_settings(plain):
        if key in RESERVED_EVAL_SET_KEYS:
            problems.append(f"{where} is set by steer_hydra itself and cannot be overridden. Fix: remove {where}.")
            continue
        if key in FAILURE_POLICY_KEYS and value is not True:  # true is what the suite sets anyway
            problems.append(
                f"{where}={value!r}: steer_hydra runs every task with fail_on_error=true and continue_on_fail=true, "
                "so a failing sample fails alone (the others are scored) and re-running the command retries it; "
                "Inspect never retries a sample that errored under a tolerated fail_on_error (false or a fraction), "
                f"so re-running would keep the failure. Fix: remove {where}; to retry failing samples more, set "
                "suite.retry_on_error=N (immediate retries of a sample) or suite.retry_attempts=N (task retries "
                "that re-run only the failed samples)."
            )
            continue
        if key in EXECUTION_FIELDS:  # eval_set options the suite sets from suite.<key>
            problems.append(
                f"{where}={value!r}: how the suite runs is its own setting (it is not part of the save_dir "
                f"protocol, so changing it never invalidates earlier logs). Fix: suite.{key}={value} instead of "
                f"{where}."
            )
            continue
        if key not in generate_keys and key not in eval_set_keys:
            near = sorted(k for k in generate_keys | eval_set_keys if key[:4] in k or k[:4] in key)[:5]
            hint = f" (did you mean one of {near}?)" if near else ""
            problems.append(
                f"{where}: unknown generation setting {key!r}{hint}. Fix: use a field of Inspect's GenerateConfig "
                f"(e.g. max_tokens, temperature, top_p, seed) or an eval_set option, and remove {where}."
            )
            continue
        effective[key] = (where, value)
        if value is None or key not in _SIGN_RULES:
            continue
        rule, ok = _SIGN_RULES[key]
        number = _number(value)
        if number is None or not ok(number):
            problems.append(f"{where}={value!r}: {key} must be {rule}. Fix: set {where} to a value {rule}.")
    if problems:
        return problems
    gen = {k: v for k, (_, v) in effective.items() if k in generate_keys and v is not None}
    try:
        from inspect_ai.model import GenerateConfig

        GenerateConfig(**gen)
    except Exception as error:  # pydantic's message names the field; keep its first line
        first = str(error).splitlines()
        problems.append(
            f"generation settings: {' '.join(first[:3])}. Fix: correct the value in generate_defaults or "
            "suite.generate_overrides."
        )
    default_max = _get(plain, "provider.default_max_tokens")
    where, max_tokens = effective.get("max_tokens", ("provider.default_max_tokens", default_max))
    context = model_context(plain)
    if context is not None and isinstance(max_tokens, int) and max_tokens >= context[0]:
        problems.append(
            f"{where}={max_tokens} is not below the model's context window of {context[0]} tokens ({context[1]}): "
            f"the prompt and the answer must fit in it. Fix: {where}=<fewer than {context[0]}>."
        )
    return problems


# ---------------------------------------------------------------------------------------------- devices, dtypes
def _cuda_devices(value: Any) -> list[str]:
    """The CUDA devices a device_map names (strings like `cuda:0`, bare GPU indices, values of a dict)."""
    if isinstance(value, Mapping):
        return [d for v in value.values() for d in _cuda_devices(v)]
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [f"cuda:{value}"]
    if isinstance(value, str) and (value.startswith("cuda") or value.isdigit()):
        return [value]
    return []


def check_devices(plain: Mapping[str, Any]) -> list[str]:
    """device_map names devices this machine has; dtypes are torch dtypes (or vLLM's names)."""
    import torch

    problems = []
    model = plain.get("model") or {}
    kwargs = model.get("hf_model_kwargs") or {}
    for where, value in (("model.device_map", model.get("device_map")), *_kw(kwargs, "device_map")):
        cuda = _cuda_devices(value)
        if cuda and not torch.cuda.is_available():
            problems.append(
                f"{where}={value!r} asks for CUDA ({cuda[0]}), but torch sees no CUDA device on this machine. "
                f"Fix: {where}=cpu (or null / auto), or run on a machine with a GPU and a CUDA build of torch."
            )
        elif cuda:
            count = torch.cuda.device_count()
            for device in cuda:
                index = device.partition(":")[2] if device.startswith("cuda") else device
                if index.isdigit() and int(index) >= count:
                    problems.append(f"{where}={value!r}: {device} does not exist ({count} GPU(s)). Fix: use cuda:0.")
        mps = isinstance(value, str) and value.startswith("mps")
        if mps and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            problems.append(f"{where}={value!r}: MPS is not available here. Fix: {where}=cpu.")
    for where, value in (*_kw(kwargs, "dtype"), *_kw(kwargs, "torch_dtype")):
        if value is None or value == "auto":
            continue
        if not isinstance(value, str) or not isinstance(getattr(torch, value, None), torch.dtype):
            problems.append(f"{where}={value!r} is not a torch dtype. Fix: {where}=bfloat16, float16, float32 or auto.")
    return problems


def _kw(kwargs: Mapping[str, Any], name: str) -> list[tuple[str, Any]]:
    return [(f"model.hf_model_kwargs.{name}", kwargs[name])] if name in kwargs else []


# ---------------------------------------------------------------------------------------------- backend
def check_backend(plain: Mapping[str, Any]) -> list[str]:
    """The backend's own checks of its options (`Backend.check_options`: they validate, its extra is installed, a
    server answers); secret-named options are reported by `check_secrets` and left out here."""
    backend = plain.get("backend") or {}
    options = {k: v for k, v in (backend.get("options") or {}).items() if not is_secret_name(str(k))}
    try:
        spec = BackendSpec(kind=str(backend.get("kind")), options=options)
    except ValueError as error:
        return [f"backend: {error}"]
    return spec.check_options()


# ---------------------------------------------------------------------------------------------- model
def check_model(plain: Mapping[str, Any]) -> list[str]:
    """The model reference resolves without loading: a built-in ref, an existing folder, or a known Hub id."""
    ref = _get(plain, "model.model_name_or_path")
    where = "model.model_name_or_path"
    if not isinstance(ref, str) or not ref:
        return [f"{where} is empty. Fix: model=<option> or {where}=<Hub id or local folder>."]
    return reference_problems(ref, where)


def model_config(plain: Mapping[str, Any]) -> tuple[Mapping[str, Any], str] | None:
    """`(config fields, model reference)` of the job's model when readable without loading it (`known_config`)."""
    ref = _get(plain, "model.model_name_or_path")
    config = known_config(ref)
    return (config, ref) if config is not None else None


def model_context(plain: Mapping[str, Any]) -> tuple[int, str] | None:
    """`(tokens, where it comes from)` of the model's context window when known without loading, else None."""
    max_model_len = _get(plain, "backend.options.max_model_len")
    if isinstance(max_model_len, int) and not isinstance(max_model_len, bool):
        return max_model_len, "backend.options.max_model_len"
    found = model_config(plain)
    context = config_int(found[0], CONTEXT_FIELDS) if found else None
    return (context[0], f"{context[1]} of {found[1]}") if context and found else None


def model_shape(plain: Mapping[str, Any]) -> tuple[int, int | None, str] | None:
    """`(decoder layers, attention heads or None, where it comes from)` when known without loading, else None."""
    found = model_config(plain)
    layers = config_int(found[0], _LAYER_KEYS) if found else None
    if not found or not layers:
        return None
    heads = config_int(found[0], _HEAD_KEYS)
    return layers[0], heads[0] if heads else None, f"{layers[1]} of {found[1]}"


# ---------------------------------------------------------------------------------------------- control layers
def _control_layers(slot: str, node: Mapping[str, Any]) -> list[tuple[str, int, list[int]]]:
    """`(config key, layer, heads)` of every decoder layer a state control's args name: `layer_id` (CAA, ActAdd),
    `layers` (directional ablation: a list of layers) and `head_config` (PASTA: a list of layers, or
    `{layer: [heads]}`). Malformed entries are left to the control's own validation."""
    base = f"arm.controls.{slot}"
    found: list[tuple[str, int, list[int]]] = []
    layer_id = node.get("layer_id")
    if isinstance(layer_id, int) and not isinstance(layer_id, bool):
        found.append((f"{base}.layer_id", layer_id, []))
    layers = node.get("layers")
    if isinstance(layers, list):
        found.extend((f"{base}.layers", layer, []) for layer in map(_as_int, layers) if layer is not None)
    head_config = node.get("head_config")
    if isinstance(head_config, Mapping):
        for key, heads in head_config.items():
            layer = _as_int(key)
            if layer is not None:
                listed = [h for h in (heads or []) if isinstance(h, int) and not isinstance(h, bool)]
                found.append((f"{base}.head_config", layer, listed if isinstance(heads, list) else []))
    elif isinstance(head_config, list):
        found.extend((f"{base}.head_config", layer, []) for layer in map(_as_int, head_config) if layer is not None)
    return found


def _as_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def check_layers(plain: Mapping[str, Any]) -> list[str]:
    """Layer (and head) indices of state controls exist in the model, read from its config without loading it."""
    controls = _get(plain, "arm.controls") or {}
    named = [
        entry
        for slot, node in controls.items()
        if isinstance(node, Mapping) and node.get("enabled", True) is not False
        for entry in _control_layers(str(slot), node)
    ]
    shape = model_shape(plain) if named else None
    if shape is None:
        return []
    layers, heads, source = shape
    problems = []
    for where, layer, listed in named:
        if not 0 <= layer < layers:
            if where.endswith(".layer_id"):
                what, fix = f"{where}={layer} is out of range", f"{where}=<0..{layers - 1}> (or null for its default)"
            else:
                what, fix = f"{where} names layer {layer}", f"layers 0..{layers - 1} in {where}"
            problems.append(
                f"{what}: the model has {layers} decoder layers (0..{layers - 1}; {source}). Fix: {fix}; "
                "choose layers per model in conf/arm_model/<arm>_<model>.yaml (or model.steering_layer, which the "
                "concept controls read)."
            )
            continue
        bad = [h for h in listed if heads is not None and not 0 <= h < heads]
        if bad:
            problems.append(
                f"{where} names heads {bad} of layer {layer}, but the model has {heads} attention heads per layer "
                f"(0..{heads - 1}; {source}). Fix: heads 0..{heads - 1} in {where}."
            )
    return problems


# ---------------------------------------------------------------------------------------------- tasks
def check_tasks(plain: Mapping[str, Any]) -> list[str]:
    """Every task name resolves in Inspect's registry (or names an existing file), naming the unknown one."""
    tasks = _get(plain, "suite.tasks") or []
    problems, missing_packages = [], set()
    for index, name in enumerate(tasks):
        where = f"suite.tasks[{index}]"
        package = str(name).split("/")[0] if "/" in str(name) and "@" not in str(name) else None
        if package in missing_packages:
            continue
        problem = _task_problem(str(name))
        if problem and package and "is not installed" in problem:
            missing_packages.add(package)
            others = [str(t) for t in tasks if str(t).startswith(f"{package}/")]
            problems.append(f"suite.tasks={others}: {problem}")
        elif problem:
            problems.append(f"{where}={name!r}: {problem}")
    return problems


def file_tasks(path: Path) -> list[str]:
    """The names of the `@task` functions a task file defines (read with `ast`: the file is not run); ValueError
    naming the line when the file does not parse."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as error:
        raise ValueError(f"it does not parse (line {error.lineno}: {error.msg})") from None
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if getattr(target, "id", getattr(target, "attr", None)) == "task":
                    found.append(node.name)
    return found


def _task_problem(name: str) -> str | None:
    file, _, wanted = name.partition("@")
    if "@" in name or file.endswith(".py"):
        path = Path(file).expanduser()
        if not path.is_file():
            return f"no such task file {file!r}. Fix: correct the path (relative to the launch directory)."
        try:
            defined = file_tasks(path)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            return f"task file {file!r} cannot be read: {error}. Fix: correct the file."
        if wanted and wanted not in defined:
            listed = f"it defines {defined}" if defined else "it defines no @task function"
            return (
                f"task file {file!r} has no task {wanted!r} ({listed}). Fix: {file}@<one of its @task functions>, or "
                f"decorate {wanted} with @task."
            )
        return None
    from inspect_ai._util.registry import registry_lookup

    package = name.split("/")[0] if "/" in name else None
    if package == "steer_hydra":
        import steer_hydra.tasks  # noqa: F401  (registers the built-in tasks)
    elif package is not None and importlib.util.find_spec(package) is None:
        install = EXTRA_FOR_PACKAGE.get(package, f"pip install {package.replace('_', '-')}")
        return f"task package {package!r} is not installed. Fix: {install}."
    try:
        found = registry_lookup("task", name)
    except Exception as error:  # a package whose registry fails to import
        return f"loading the tasks of {package!r} failed ({type(error).__name__}: {error}). Fix: reinstall it."
    if found is None:
        return (
            f"unknown task {name!r}. Fix: use a registered task name (e.g. steer_hydra/short_answer, "
            "inspect_evals/gsm8k) or a file reference path/to/task.py@name."
        )
    return None


def _control_class(target: Any) -> Any:
    """The class a control's `_target_` names, or None when it does not import or is not a control (building the
    job reports that)."""
    if not isinstance(target, str) or "." not in target:
        return None
    from steer_hydra.core.controls import BaseControl

    module, _, name = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - a missing module or name: instantiating the arm says so, naming the fix
        return None
    return found if isinstance(found, type) and issubclass(found, BaseControl) else None


def check_control_references(plain: Mapping[str, Any]) -> list[str]:
    """Every second model and file the enabled controls of the arm name (`BaseControl.references`) resolves before
    the main model loads: a model reference (`models.checks.reference_problems`), a reward model or classifier that
    is a sequence classifier (`classifier_problems`), a LoRA folder whose files are readable and whose tensors fit
    the model (`adapter_problems`), a concept that loads, a file that exists. Each problem names
    `arm.controls.<slot>.<arg>`."""
    from steer_hydra.models.checks import adapter_problems, classifier_problems

    controls = _get(plain, "arm.controls") or {}
    model_ref = _get(plain, "model.model_name_or_path")
    problems: list[str] = []
    for slot, node in controls.items():
        if not isinstance(node, Mapping) or node.get("enabled", True) is False:
            continue
        cls = _control_class(node.get("_target_"))
        if cls is None:
            continue
        args = {k: v for k, v in node.items() if not str(k).startswith("_") and k != "enabled"}
        try:
            references = cls.references(args)
        except Exception:  # noqa: BLE001 - malformed arguments: the control's own validation names them
            continue
        for arg, reference in references.items():
            where = f"arm.controls.{slot}.{arg}"
            value = reference.value
            if reference.kind == "classifier":
                problems += classifier_problems(value, where)
            elif reference.kind == "adapter":
                problems += adapter_problems(value, where, model_ref)
            elif reference.kind == "concept":
                if value != plain.get("concept"):  # the job's own concept is checked by check_concept
                    problems += [p.replace("concept=", f"{where}=", 1) for p in check_concept({"concept": value})]
            elif reference.kind == "file":
                if not Path(str(value)).expanduser().is_file():
                    problems.append(
                        f"{where}={value!r}: no such file. Fix: correct the path (relative to the launch directory)."
                    )
            else:
                problems += reference_problems(value, where)
    return problems


def check_concept(plain: Mapping[str, Any]) -> list[str]:
    """`concept` names a built-in concept or a well-formed concept file (the concept suites and controls read it
    as `${concept}`); checked for every job, since loading one small file costs nothing."""
    value = plain.get("concept")
    if value is None:
        return []
    from steer_hydra.tasks.concepts import ConceptFileError, load_concept

    try:
        load_concept(str(value))
    except ConceptFileError as error:
        return [f"concept={value!r}: {error}"]
    return []


def check_judge_model(plain: Mapping[str, Any]) -> list[str]:
    """The judge can be made and reached (`app.judge.judge_problems`: its provider and package, its model reference,
    its server answering within `PROBE_TIMEOUT` seconds), and `judge_options` holds usable bounds."""
    judge = plain.get("judge")
    if judge is None:
        return []
    from steer_hydra.app.judge import JudgeOptions, judge_problems

    try:
        options = JudgeOptions.from_config(plain.get("judge_options"))
    except (TypeError, ValueError) as error:
        return [str(error)]
    return judge_problems(judge, options)


# ---------------------------------------------------------------------------------------------- catalog datasets
# The Hub datasets of the catalog tasks the packaged suites use; other `inspect_evals` tasks are read from their
# source (`catalog_datasets`).
CATALOG_DATASETS: dict[str, tuple[str, ...]] = {
    "inspect_evals/gsm8k": ("openai/gsm8k",),
    "inspect_evals/mmlu_0_shot": ("cais/mmlu",),
    "inspect_evals/mmlu_5_shot": ("cais/mmlu",),
    "inspect_evals/arc_challenge": ("allenai/ai2_arc",),
    "inspect_evals/arc_easy": ("allenai/ai2_arc",),
    "inspect_evals/ifeval": ("google/IFEval",),
}
CATALOG_PACKAGE = "inspect_evals"
_DATASET_ID = r"[\w.-]+/[\w.-]+"
_DATASET_IN_SOURCE = (
    re.compile(rf"(?:hf_dataset|load_dataset|snapshot_download)\(\s*(?:path\s*=\s*)?[\"']({_DATASET_ID})[\"']"),
    re.compile(rf"\b[A-Z_]*DATASET[A-Z_]*\s*(?::\s*str\s*)?=\s*[\"']({_DATASET_ID})[\"']"),
)


def catalog_installed() -> bool:
    """Whether the `inspect_evals` package (the `evals` extra) is importable."""
    return importlib.util.find_spec(CATALOG_PACKAGE) is not None


def datasets_in_source(folder: Path) -> tuple[str, ...]:
    """Hub dataset ids a task package's source loads (`hf_dataset("org/name", ...)`, `DATASET_PATH = "org/name"`)."""
    found: list[str] = []
    for file in sorted(folder.glob("*.py")):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for pattern in _DATASET_IN_SOURCE:
            found.extend(m for m in pattern.findall(text) if m not in found)
    return tuple(found)


def catalog_datasets(task: str) -> tuple[str, ...]:
    """The Hub datasets an installed `inspect_evals/...` task loads (empty when unknown: then nothing is checked)."""
    if task in CATALOG_DATASETS:
        return CATALOG_DATASETS[task]
    from inspect_ai._util.registry import registry_lookup

    try:
        source = inspect.getsourcefile(registry_lookup("task", task))
    except Exception:  # noqa: BLE001 - an unknown task is check_tasks' finding; its data then goes unchecked
        return ()
    return datasets_in_source(Path(source).parent) if source else ()


def dataset_cached(repo_id: str) -> bool:
    """Whether a Hub dataset is in a local cache: the Hub's (`hf download --repo-type dataset`), the `datasets`
    library's (a load that once ran online) or Inspect's own copy of a loaded split."""
    from huggingface_hub import constants

    org, _, name = repo_id.partition("/")
    snapshots = Path(constants.HF_HUB_CACHE) / f"datasets--{org}--{name}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    datasets_cache = os.environ.get("HF_DATASETS_CACHE") or os.path.join(constants.HF_HOME, "datasets")
    if (Path(datasets_cache) / f"{org}___{name}").is_dir():
        return True
    from inspect_ai._util.appdirs import inspect_cache_dir
    from inspect_ai._util.file import safe_filename

    inspect_cache = inspect_cache_dir("hf_datasets", create=False)
    return inspect_cache.is_dir() and any(inspect_cache.glob(f"{safe_filename(repo_id)}-*"))


def _datasets_offline() -> bool:
    return hub_offline() or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _hub_dataset_unreachable(repo_id: str) -> tuple[str, bool] | None:
    """`(why the Hub cannot serve repo_id now, whether the Hub itself is unreachable)`; None when it answers
    within `HUB_TIMEOUT`."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(repo_id, timeout=HUB_TIMEOUT)
    except GatedRepoError:
        return "it is gated on the Hub and this machine has no access (accept its terms, then hf auth login)", False
    except RepositoryNotFoundError:
        return "the Hub has no such dataset (or it is private)", False
    except Exception as error:  # noqa: BLE001 - network: unreachable, DNS, timeout
        return f"the Hub did not answer within {HUB_TIMEOUT:.0f}s ({type(error).__name__})", True
    return None


def check_datasets(plain: Mapping[str, Any]) -> list[str]:
    """The datasets of the suite's installed `inspect_evals` tasks are cached locally or reachable on the Hub."""
    tasks = [str(t) for t in _get(plain, "suite.tasks") or [] if str(t).startswith(f"{CATALOG_PACKAGE}/")]
    if not tasks or not catalog_installed():  # not installed: check_tasks says so
        return []
    uncached: dict[str, list[str]] = {}  # dataset -> the tasks that load it
    for task in tasks:
        for repo_id in catalog_datasets(task):
            if not dataset_cached(repo_id):
                uncached.setdefault(repo_id, []).append(task)
    reasons: dict[str, str] = {}  # dataset -> why it cannot be fetched now
    hub_down = "HF_HUB_OFFLINE=1 (or HF_DATASETS_OFFLINE=1) forbids downloading it" if _datasets_offline() else None
    for repo_id in uncached:
        if hub_down is not None:  # one lookup that found no Hub is enough for every dataset
            reasons[repo_id] = hub_down
            continue
        found = _hub_dataset_unreachable(repo_id)
        if found is not None:
            reasons[repo_id] = found[0]
            hub_down = found[0] if found[1] else None
    if not reasons:
        return []
    by_reason: dict[str, list[str]] = {}
    for repo_id, reason in reasons.items():
        by_reason.setdefault(reason, []).extend(f"{task} ({repo_id})" for task in dict.fromkeys(uncached[repo_id]))
    listed = "; ".join(f"{', '.join(users)}: {reason}" for reason, users in by_reason.items())
    fetch = "; ".join(f"hf download --repo-type dataset {repo_id}" for repo_id in reasons)
    suite = _get(plain, "suite.name") or "this suite"
    return [
        f"suite.tasks: the task data is not in the local Hugging Face cache ({listed}), so suite {suite!r} would fail "
        "after the model loads. Fix: suite=capability_offline (built-in tasks, no download), or fetch the data "
        f"once with network: run this command online once, or {fetch}."
    ]
