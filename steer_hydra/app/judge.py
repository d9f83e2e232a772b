"""The model judge of a job or a rescore (`judge=`): what it may name, its checks, and the Inspect model it becomes.

`judge` takes either
- an Inspect model string (`vllm/<model>` or `openai/<model>` with a base URL, `openai/gpt-4o-mini`, `hf/<repo>`),
  bound to Inspect's model role "judge" (with `judge_options.base_url` when given, else Inspect's own settings such as
  `VLLM_BASE_URL` or `OPENAI_BASE_URL`);
- `steer_hydra/<model option>` (e.g. `steer_hydra/smollm2`): an unsteered pipeline of that option of the `model`
  group on the Hugging Face backend, wrapped with `as_inspect_model` and named `steer_hydra/judge-<option>@<digest>`
  (the digest is of the option's model config), so the name, and with it Inspect's cache key, identifies the
  weights the judge runs. It is built on first use (a job whose cells are all reused loads no judge) and released
  when the job or the rescore ends;
- `steer_hydra/scripted`: an offline stand-in that reads nothing and rates each prompt by a digest of its text, in
  the answer format; for trying the judge path out without a model or network, never for results.

`judge_options` (`JudgeOptions`): the judge's token budget per reply, and for a judge reached over the network the
bounds of each call (`attempt_timeout` seconds per attempt, `max_retries`, `timeout` seconds over all attempts):
Inspect retries a provider that never answers without limit unless told.

Checks (`judge_problems`, run by pre-flight and by rescore before any model loads, each a line naming `judge` and
the fix): the form; a `steer_hydra/` option that composes and whose model reference resolves; an Inspect provider
that exists and whose package is installed (asked of the provider's own registry entry, which imports it and
constructs nothing); `hf/<repo>` resolving like any model reference; `mockllm/` refused (its fixed reply is never a
rating, and it downloads a tokenizer file); a network judge's server answering HTTP within `PROBE_TIMEOUT` seconds.

The judge scores the tasks in `tasks.judge.JUDGED_TASKS` (the concept-steering task) with `concept_judge`, beside
their rule scorers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steer_hydra.app.secrets import mask_url_credentials
from steer_hydra.core.identity import canonical_json
from steer_hydra.tasks.judge import JUDGE_ROLE, JUDGED_TASKS

PREFIX = "steer_hydra/"
SCRIPTED = "steer_hydra/scripted"
CONF_MODEL_DIR = Path(__file__).resolve().parents[1] / "conf" / "model"
FORMS = (
    "an Inspect model string (provider/model: vllm/<model> or openai/<model> with a base URL, openai/gpt-4o-mini, "
    "hf/<repo>), steer_hydra/<model option> (e.g. steer_hydra/smollm2) or steer_hydra/scripted (offline, for trying "
    "the path out)"
)
PROBE_TIMEOUT = 5.0  # seconds pre-flight waits for a network judge's server to answer one HTTP request
# Providers that run in this process (no server to reach) and the default servers of the common hosted APIs.
LOCAL_PROVIDERS = frozenset({"hf", "none", "mockllm", "llama-cpp-python", "transformer_lens", "nnterp"})
DEFAULT_BASE_URLS = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com/v1",
    "mistral": "https://api.mistral.ai/v1",
    "groq": "https://api.groq.com/openai/v1",
}
API_KEY_VARS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


@dataclass(frozen=True, slots=True)
class JudgeOptions:
    """`judge_options`: the judge's token budget and, for a judge reached over the network, the bounds of one call.

    Attributes:
        max_tokens: the judge's token budget per reply (its reasoning and the rating line).
        attempt_timeout: seconds one attempt may take before it is abandoned and retried.
        max_retries: retries of a failed or abandoned attempt.
        timeout: seconds one judge call may take over all its attempts.
        base_url: the judge's server (`http://host:port/v1`); None: Inspect's own setting for the provider
            (`VLLM_BASE_URL`, `OPENAI_BASE_URL`, ...).
    """

    max_tokens: int = 512
    attempt_timeout: int = 120
    max_retries: int = 2
    timeout: int = 400
    base_url: str | None = None

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None) -> JudgeOptions:
        """The options of a plain `judge_options` node (missing keys take the defaults); ValueError naming the key
        and the fix for a value out of range."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in dict(node or {}).items() if k in known and v is not None}
        options = cls(**values)
        for key in ("max_tokens", "attempt_timeout", "timeout"):
            value = getattr(options, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"judge_options.{key}={value!r} must be an integer >= 1. Fix: judge_options.{key}=N.")
        if isinstance(options.max_retries, bool) or not isinstance(options.max_retries, int) or options.max_retries < 0:
            raise ValueError(
                f"judge_options.max_retries={options.max_retries!r} must be an integer >= 0. Fix: "
                "judge_options.max_retries=2."
            )
        return options

    def scorer_args(self, judge: str | None) -> dict[str, Any]:
        """`concept_judge`'s arguments: the token budget, and the call bounds for a judge outside this process."""
        args: dict[str, Any] = {"max_tokens": self.max_tokens}
        if judge is None or not str(judge).startswith(PREFIX):
            args.update(timeout=self.timeout, attempt_timeout=self.attempt_timeout, max_retries=self.max_retries)
        return args


def model_options() -> list[str]:
    """The `model` group's built-in options."""
    return sorted(path.stem for path in CONF_MODEL_DIR.glob("*.yaml"))


def model_group_config(option: str) -> dict[str, Any]:
    """The `model` group option `option` as a plain dict (composed under the running app's search path when there is
    one, so user groups count); ValueError naming the options when it does not compose."""
    from omegaconf import OmegaConf

    from steer_hydra.app.compose import compose_config

    try:
        cfg = compose_config([f"model={option}"])
    except Exception as error:  # noqa: BLE001 - Hydra's errors for a missing option vary; say it in one line
        raise ValueError(
            f"judge={PREFIX}{option}: {option!r} is not an option of the model group ({type(error).__name__}). "
            f"Fix: judge={PREFIX}<one of {', '.join(model_options())}>."
        ) from error
    return dict(OmegaConf.to_container(cfg.model, resolve=True, enum_to_str=True))  # type: ignore[arg-type]


def check_judge(judge: str | None, tasks: Sequence[str], suite: str = "") -> tuple[str, ...]:
    """The suite's tasks the judge scores (`()` without a judge); ValueError naming the fix for a judge that is not a
    model name, a `steer_hydra/` option that does not exist, or a suite with nothing to judge."""
    if judge is None:
        return ()
    if not isinstance(judge, str) or "/" not in judge.strip("/") or judge != judge.strip():
        raise ValueError(f"judge={judge!r} names no model. Fix: judge=<{FORMS}>.")
    if judge.startswith(PREFIX) and judge != SCRIPTED:
        model_group_config(judge.removeprefix(PREFIX))
    judged = tuple(task for task in tasks if task in JUDGED_TASKS)
    if not judged:
        raise ValueError(
            f"judge={judge} scores only {list(JUDGED_TASKS)}, and suite {suite!r} runs none of them ({list(tasks)}). "
            "Fix: choose a suite that runs it (e.g. suite=concept_steering), or drop judge=."
        )
    return judged


class JudgeModel:
    """A `steer_hydra/<model option>` judge, built when first called (see the module docstring)."""

    def __init__(self, option: str, model: Mapping[str, Any]) -> None:
        self.option = option
        self.model = dict(model)
        weights = {key: value for key, value in self.model.items() if key != "name"}
        digest = hashlib.sha256(canonical_json(weights).encode()).hexdigest()[:8]
        self.model_name = f"judge-{option}@{digest}"
        self._pipeline: Any = None
        self._inspect_model: Any = None

    @property
    def name(self) -> str:
        """The judge's Inspect model name (`steer_hydra/judge-<option>@<digest>`)."""
        return f"{PREFIX}{self.model_name}"

    def __call__(self) -> Any:
        """The judge as an Inspect `Model` (its pipeline loads on the first call)."""
        if self._inspect_model is None:
            from inspect_ai.model import GenerateConfig

            from steer_hydra.core.backend import BackendSpec
            from steer_hydra.core.pipeline import SteeringPipeline
            from steer_hydra.core.source import ModelSource
            from steer_hydra.evaluation.options import ProviderOptions
            from steer_hydra.evaluation.provider import as_inspect_model

            source = ModelSource.from_config(self.model)
            self._pipeline = SteeringPipeline(source, backend=BackendSpec("huggingface")).steer()
            model = as_inspect_model(self._pipeline, options=ProviderOptions(), model_name=self.model_name)
            # Inspect's adaptive concurrency ignores the provider's own limit unless it is given (provider docs)
            model.config = GenerateConfig(max_connections=model.api.max_connections())
            self._inspect_model = model
        return self._inspect_model

    def release(self) -> None:
        """Close the judge's provider and free its model."""
        model, pipeline = self._inspect_model, self._pipeline
        self._inspect_model = self._pipeline = None
        if model is not None:
            model.api.close()
        if pipeline is not None:
            pipeline.release()


def scripted_judge() -> Any:
    """`steer_hydra/scripted` as an Inspect `Model` (see `ScriptedJudgeAPI`)."""
    from inspect_ai.model import GenerateConfig, Model

    return Model(_scripted_api_class()("scripted"), GenerateConfig())


_SCRIPTED_API: Any = None


def _scripted_api_class() -> Any:
    """The scripted judge's `ModelAPI` class, built once and named under the `steer_hydra` provider."""
    global _SCRIPTED_API
    if _SCRIPTED_API is not None:
        return _SCRIPTED_API
    from inspect_ai._util.registry import registry_info, set_registry_info
    from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, ModelUsage

    from steer_hydra.evaluation.provider import steer_hydra as provider_entry

    class ScriptedJudgeAPI(ModelAPI):
        """An offline stand-in judge: each reply rates the prompt by a digest of its text (0, 1 or 2) in the
        answer format; it reads nothing, so its ratings mean nothing."""

        def __init__(self, model_name: str, base_url: str | None = None, api_key: str | None = None, **_: Any):
            super().__init__(model_name, base_url, api_key, [], GenerateConfig())

        async def generate(self, input: Any, tools: Any, tool_choice: Any, config: Any) -> Any:
            text = "\n".join(str(getattr(message, "text", message)) for message in input)
            rating = int(hashlib.sha256(text.encode()).hexdigest(), 16) % 3
            reply = (
                f"Scripted judge: this rating comes from a digest of the prompt, not from reading it.\nRating: {rating}"
            )
            output = ModelOutput.from_content(model=self.model_name, content=reply)
            output.usage = ModelUsage(
                input_tokens=len(text.split()), output_tokens=16, total_tokens=len(text.split()) + 16
            )
            return output

        def max_connections(self) -> int:
            return 8

    set_registry_info(ScriptedJudgeAPI, registry_info(provider_entry))
    _SCRIPTED_API = ScriptedJudgeAPI
    return ScriptedJudgeAPI


def judge_role(judge: str, options: JudgeOptions | None = None) -> Any:
    """What the runner binds to the "judge" role: the Inspect model string as given (an Inspect `Model` when
    `options.base_url` names its server), a `JudgeModel`, or the scripted judge's factory."""
    if judge == SCRIPTED:
        return scripted_judge
    if judge.startswith(PREFIX):
        option = judge.removeprefix(PREFIX)
        return JudgeModel(option, model_group_config(option))
    if options is not None and options.base_url:
        from inspect_ai.model import get_model

        base_url = options.base_url
        return lambda: get_model(judge, base_url=base_url)
    return judge


def judge_as_model(judge: Any, options: JudgeOptions | None = None) -> tuple[Any, Callable[[], None]]:
    """`(Inspect Model, release)` for a judge given as a `judge=` string or as an Inspect `Model` (kept as it is)."""
    if not isinstance(judge, str):
        return judge, lambda: None
    check_judge(judge, JUDGED_TASKS)
    role = judge_role(judge, options)
    if isinstance(role, JudgeModel):
        return role(), role.release
    if callable(role):
        return role(), lambda: None
    from inspect_ai.model import get_model

    return get_model(role), lambda: None


# ---------------------------------------------------------------------------------------------- checks
def judge_problems(judge: Any, options: JudgeOptions | None = None, where: str = "judge") -> list[str]:
    """Why `judge` cannot work, found without loading a model or calling it (module docstring, "Checks"): `[]` when
    it looks usable. The slowest check is one HTTP request to a network judge's server, bounded by
    `PROBE_TIMEOUT` seconds (DNS included)."""
    if judge is None:
        return []
    options = options or JudgeOptions()
    if not isinstance(judge, str) or "/" not in judge.strip("/") or judge != judge.strip():
        return [f"{where}={judge!r} names no model. Fix: {where}=<{FORMS}>."]
    if judge == SCRIPTED:
        return []
    if judge.startswith(PREFIX):
        option = judge.removeprefix(PREFIX)
        try:
            model = model_group_config(option)
        except ValueError as error:
            return [str(error)]
        from steer_hydra.models.checks import reference_problems

        ref = model.get("model_name_or_path")
        return [_renamed(p, f"{where}={judge} (model.model_name_or_path", ref) for p in reference_problems(ref, where)]
    provider, _, name = judge.partition("/")
    if provider == "mockllm":
        return [
            f"{where}={judge}: Inspect's mock model replies with a fixed text that is never a rating (every sample "
            "would be unscored), and it downloads a tokenizer file on its first call. Fix: "
            f"{where}={SCRIPTED} to try the judge path out offline, or a served model ({where}=vllm/<model> with "
            "judge_options.base_url=http://HOST:PORT/v1)."
        ]
    problem = _provider_problem(provider, judge, where)
    if problem is not None:
        return [problem]
    if provider == "hf":
        from steer_hydra.models.checks import reference_problems

        return [_renamed(p, f"{where}={judge} (the Hub id", name) for p in reference_problems(name, where)]
    if provider in LOCAL_PROVIDERS:
        return []
    key = API_KEY_VARS.get(provider)
    if key is not None and not os.environ.get(key) and not options.base_url:
        return [
            f"{where}={judge}: the {provider} provider needs its key in {key}, which is not set. Fix: export {key} "
            "(any value for a local server that checks none), or choose another judge."
        ]
    base_url, source, setting = _base_url(provider, options)
    if base_url is None:
        if provider == "vllm":
            return [
                f"{where}={judge}: no server is named (judge_options.base_url and VLLM_BASE_URL are unset), so "
                "Inspect would start vLLM itself in this job. Fix: serve the judge (vllm serve <model>) and set "
                f"judge_options.base_url=http://HOST:PORT/v1 (or VLLM_BASE_URL)."
            ]
        return []
    why = probe_server(base_url, PROBE_TIMEOUT)
    if why is None:
        return []
    shown = mask_url_credentials(base_url)
    return [
        f"{where}={judge}: its server {shown} ({source}) {why}, so every judge call would fail. Fix: start the "
        f"server, or point {setting} at one that answers."
    ]


def _renamed(problem: str, head: str, ref: Any) -> str:
    """A `reference_problems` line about `judge=<ref>` reworded to name the judge: `<head> <ref>)...`."""
    prefix = f"judge={ref!r}"
    return f"{head} {ref!r}){problem[len(prefix) :]}" if problem.startswith(prefix) else problem


def _provider_problem(provider: str, judge: str, where: str) -> str | None:
    """Why Inspect cannot make `provider`'s models here (unknown provider, package not installed), or None."""
    import inspect_ai.model  # noqa: F401 - registers Inspect's providers
    from inspect_ai._util.error import PrerequisiteError
    from inspect_ai._util.registry import registry_find, registry_unqualified_name

    import steer_hydra.evaluation.provider  # noqa: F401 - registers the steer_hydra provider

    found = registry_find(lambda info: info.type == "modelapi" and registry_unqualified_name(info) == provider)
    if not found:
        known = sorted(
            registry_unqualified_name(info)
            for info in (
                getattr(entry, "__registry_info__", None) for entry in registry_find(lambda i: i.type == "modelapi")
            )
            if info is not None
        )
        return f"{where}={judge}: Inspect has no model provider {provider!r}. Fix: one of {known}."
    factory = _wrapped_factory(found[0])
    if factory is None:
        return None
    try:
        factory()  # what Inspect calls first in get_model: imports the provider's package, builds nothing
    except PrerequisiteError as error:
        text = re.sub(r"\[/?[a-z ]+\]", "", str(error)).replace("ERROR:", "").split()
        return f"{where}={judge}: {' '.join(text)}."
    except Exception:  # noqa: BLE001 - another failure is Inspect's to report when it makes the model
        return None
    return None


def _wrapped_factory(entry: Any) -> Callable[[], Any] | None:
    """The provider function a registered model API wraps (Inspect's `modelapi` decorator keeps it in a closure),
    or None when this Inspect keeps it otherwise."""
    for cell in getattr(entry, "__closure__", None) or ():
        value = cell.cell_contents
        if callable(value) and not isinstance(value, type) and value is not entry:
            return value
    return None


def _base_url(provider: str, options: JudgeOptions) -> tuple[str | None, str, str]:
    """`(the judge's server, where it comes from, the setting that changes it)`: judge_options.base_url,
    `<PROVIDER>_BASE_URL`, or the provider's public API."""
    if options.base_url:
        return options.base_url, "judge_options.base_url", "judge_options.base_url=http://HOST:PORT/v1"
    variable = f"{provider.upper().replace('-', '_')}_BASE_URL"
    if os.environ.get(variable):
        return os.environ[variable], variable, f"{variable} (or judge_options.base_url)"
    return DEFAULT_BASE_URLS.get(provider), "the provider's public API", f"judge_options.base_url (or {variable})"


def probe_server(base_url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when `base_url` answers one HTTP request (any status) within `timeout` seconds, else why not (`gave no
    HTTP answer within 5s (ConnectionRefusedError)`); the request runs on a thread, so DNS is bounded too."""
    import base64
    import urllib.error
    import urllib.parse
    import urllib.request

    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"is not an http(s) URL ({mask_url_credentials(base_url)!r})"
    netloc = parts.hostname + (f":{parts.port}" if parts.port else "")
    url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/") + "/models", "", ""))
    request = urllib.request.Request(url, method="GET")
    if parts.username:  # credentials in the URL travel as basic auth, as an HTTP client sends them
        token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                outcome.append(None)
        except urllib.error.HTTPError:  # it answered (401, 404, ...): reachable
            outcome.append(None)
        except Exception as error:  # noqa: BLE001 - refused, timed out, DNS, TLS: all mean "cannot be reached"
            reason = getattr(error, "reason", error)
            outcome.append(f"gave no HTTP answer within {timeout:.0f}s ({type(reason).__name__})")

    worker = threading.Thread(target=ask, name="steer-hydra-judge-probe", daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    return outcome[0] if outcome else f"gave no HTTP answer within {timeout:.0f}s (no reply)"


__all__ = [
    "JUDGE_ROLE",
    "SCRIPTED",
    "JudgeModel",
    "JudgeOptions",
    "check_judge",
    "judge_as_model",
    "judge_problems",
    "judge_role",
    "model_group_config",
    "probe_server",
    "scripted_judge",
]
