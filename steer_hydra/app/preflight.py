"""Preflight: every check of a composed job config that needs no model, run before anything loads or is written.

Invariants:
- nothing here loads a model, builds a pipeline, writes a file or starts W&B; the slowest check is a Hub
  lookup bounded by `HUB_TIMEOUT` seconds (none at all under `HF_HUB_OFFLINE=1`);
- every problem found is reported in one `ConfigError` whose message is one line: the config key, the bad
  value, what is wrong and `Fix: ...`; several problems are numbered in the same line;
- checks that need the model's context window use its config (`config.json` of a local or cached checkpoint,
  the tiny model's spec, vLLM's `max_model_len`) and are skipped when it is unknown before load.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from steer_hydra.app.plan import ConfigError, to_plain
from steer_hydra.app.secrets import is_secret_name

HUB_TIMEOUT = 5.0  # seconds for one Hub lookup of a model id that is not cached locally
CONNECT_TIMEOUT = 3.0  # seconds to reach a vllm_serve server's port

# `generate_defaults` / `suite.generate_overrides` go to `eval_set(**settings)`: GenerateConfig fields plus
# eval_set options. These eval_set parameters are set by the suite itself and cannot be overridden.
RESERVED_EVAL_SET_KEYS = frozenset({"tasks", "log_dir", "model", "model_args", "model_base_url", "kwargs"})
# Names that become directory or file names: one path component each.
PATH_NAMES = ("experiment_name", "model.name", "suite.name", "arm.name", "baseline_arm")
EXTRA_FOR_PACKAGE = {"inspect_evals": "pip install 'steer_hydra[evals]' (the inspect-evals package)"}
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
_VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


def preflight(cfg: Any) -> None:
    """Raise `ConfigError` (one line, every problem numbered) when the job config cannot work; else return."""
    plain = to_plain(cfg)
    problems: list[str] = []
    for check in (
        check_path_names,
        check_secrets,
        check_generation,
        check_devices,
        check_backend,
        check_model,
        check_tasks,
    ):
        problems.extend(check(plain))
    if problems:
        raise ConfigError(format_problems(problems))


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
    problems = []
    for key in PATH_NAMES:
        value = _get(plain, key)
        if value is None:
            continue
        text = str(value)
        bad = (
            not text.strip()
            or ".." in text
            or any(sep in text for sep in ("/", "\\", os.sep, "\0"))
            or text in (".", "~")
            or text.startswith("~")
        )
        if bad:
            problems.append(
                f"{key}={text!r} becomes a directory name, so it must be one plain path component (no '..', "
                f"no '/' or '\\'). Fix: {key}=<name> with letters, digits, '-', '_' or '.' (set output_root or "
                "save_dir to choose where outputs go)."
            )
    return problems


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
            "export the key in an environment variable and name it with backend.options.api_key_env=<VAR> "
            "(default VLLM_API_KEY); remove the override."
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
    """The backend's options validate, its extra is installed, and a server's port answers."""
    backend = plain.get("backend") or {}
    kind = str(backend.get("kind"))
    options = {k: v for k, v in (backend.get("options") or {}).items() if not is_secret_name(str(k))}  # see above
    if kind == "vllm_serve":
        from steer_hydra.backends.vllm_serve import ServeOptions

        try:
            settings = ServeOptions.from_mapping(options)
        except ValueError as error:
            return [f"backend.options: {error}"]
        reason = _unreachable(settings.base_url)
        if reason:
            return [
                f"backend.options.base_url={settings.base_url!r}: {reason}. Fix: start the server (vllm serve "
                "MODEL) or point backend.options.base_url=http://HOST:PORT at a running one."
            ]
        return []
    if kind == "vllm":
        problems = []
        if importlib.util.find_spec("vllm") is None:
            problems.append(
                "backend=vllm needs the vllm package, which is not installed. Fix: pip install "
                "'steer_hydra[vllm]' (CUDA), or use backend=huggingface / backend=vllm_serve."
            )
        dtype = options.get("dtype")
        if dtype is not None and dtype not in _VLLM_DTYPES:
            problems.append(f"backend.options.dtype={dtype!r} is not a vLLM dtype. Fix: one of {list(_VLLM_DTYPES)}.")
        return problems
    return []


def _unreachable(base_url: str) -> str | None:
    """Why nothing answers at `base_url`'s host and port (None when a TCP connection opens)."""
    parsed = urlparse(base_url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "localhost", port), timeout=CONNECT_TIMEOUT):
            return None
    except OSError as error:
        return f"nothing accepts connections there within {CONNECT_TIMEOUT:.0f}s ({type(error).__name__}: {error})"


# ---------------------------------------------------------------------------------------------- model
def _hub_offline() -> bool:
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _looks_local(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~", ".\\")) or ref.count("/") > 1 or "\\" in ref


def check_model(plain: Mapping[str, Any]) -> list[str]:
    """The model reference resolves without loading: a built-in ref, an existing folder, or a known Hub id."""
    ref = _get(plain, "model.model_name_or_path")
    where = "model.model_name_or_path"
    if not isinstance(ref, str) or not ref:
        return [f"{where} is empty. Fix: model=<option> or {where}=<Hub id or local folder>."]
    if ref.startswith("steer_hydra:"):
        return _builtin_problems(ref, where)
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists() and not list(path.glob("*.gguf")):
            return [f"{where}={ref!r} is a folder without config.json. Fix: point it at a saved checkpoint folder."]
        return []
    if _looks_local(ref):
        return [
            f"{where}={ref!r}: no such local folder (resolved to {path.absolute()}). Fix: correct the path, "
            "or give a Hugging Face Hub id like org/name."
        ]
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError as error:
        return [f"{where}={ref!r} is neither a local folder nor a valid Hub id ({error}). Fix: correct it."]
    if _cached_hub_file(ref, "config.json") is not None:
        return []
    if _hub_offline():
        return [
            f"{where}={ref!r} is not a local folder and not in the Hugging Face cache, and HF_HUB_OFFLINE=1 (or "
            "TRANSFORMERS_OFFLINE=1) forbids "
            "downloading it. Fix: download it once with network (hf download " + ref + "), unset HF_HUB_OFFLINE, "
            "or point model.model_name_or_path at a local folder."
        ]
    return _hub_lookup(ref, where)


def _builtin_problems(ref: str, where: str) -> list[str]:
    from steer_hydra.models import BUILTIN_REFERENCES, is_smollm2_reference, is_tiny_reference
    from steer_hydra.models.smollm2 import gguf_path
    from steer_hydra.models.tiny import parse_tiny_reference

    if is_tiny_reference(ref):
        try:
            parse_tiny_reference(ref)
        except ValueError as error:
            return [f"{where}={ref!r}: {error} Fix: model=tiny or model=tiny_base."]
        return []
    if is_smollm2_reference(ref):
        try:
            gguf_path()
        except ImportError as error:
            return [f"{where}={ref!r}: {error}"]
        return []
    return [
        f"{where}={ref!r} is not a built-in model reference. Fix: one of {list(BUILTIN_REFERENCES)}, a Hub id "
        "or a local folder."
    ]


def _cached_hub_file(repo_id: str, filename: str) -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return found if isinstance(found, str) else None


def _hub_lookup(ref: str, where: str) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(ref, timeout=HUB_TIMEOUT)
    except GatedRepoError:
        return [
            f"{where}={ref!r} is gated on the Hub and this machine has no access. Fix: accept its license on the "
            "Hub, then `hf auth login` or export HF_TOKEN."
        ]
    except RepositoryNotFoundError:
        return [f"{where}={ref!r}: no such model on the Hub (or it is private). Fix: check the id, or log in."]
    except Exception as error:  # network: unreachable, DNS, timeout
        return [
            f"{where}={ref!r} is not cached locally and the Hub did not answer within {HUB_TIMEOUT:.0f}s "
            f"({type(error).__name__}). Fix: download it where there is network (hf download {ref}), or set "
            "HF_HUB_OFFLINE=1 with a populated cache, or use a local folder."
        ]
    return []


def model_context(plain: Mapping[str, Any]) -> tuple[int, str] | None:
    """`(tokens, where it comes from)` of the model's context window when known without loading, else None."""
    max_model_len = _get(plain, "backend.options.max_model_len")
    if isinstance(max_model_len, int) and not isinstance(max_model_len, bool):
        return max_model_len, "backend.options.max_model_len"
    ref = _get(plain, "model.model_name_or_path")
    if not isinstance(ref, str) or not ref:
        return None
    config: Mapping[str, Any] | None = None
    try:
        if ref.startswith("steer_hydra:"):
            from steer_hydra.models import is_tiny_reference
            from steer_hydra.models.tiny import parse_tiny_reference

            if is_tiny_reference(ref):
                config = {"max_position_embeddings": parse_tiny_reference(ref).max_position_embeddings}
        elif (Path(ref).expanduser() / "config.json").is_file():
            config = json.loads((Path(ref).expanduser() / "config.json").read_text())
        elif not _looks_local(ref):
            cached = _cached_hub_file(ref, "config.json")
            config = json.loads(Path(cached).read_text()) if cached else None
    except (ValueError, OSError):
        return None
    if not isinstance(config, Mapping):
        return None
    for key in _CONTEXT_KEYS:
        value = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value, f"{key} of {ref}"
    return None


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


def _task_problem(name: str) -> str | None:
    file, _, _ = name.partition("@")
    if "@" in name or file.endswith(".py"):
        if not Path(file).expanduser().is_file():
            return f"no such task file {file!r}. Fix: correct the path (relative to the launch directory)."
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
