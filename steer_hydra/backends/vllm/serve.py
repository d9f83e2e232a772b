"""`VLLMServeBackend` (kind `vllm_serve`): generation on a running vLLM (or OpenAI-compatible) completions server.

Prompts are tokenized here and posted as token ids to `{base_url}/v1/completions`, one request per prompt
row (`prompt` = the row's real token ids, `n` candidates, the row's seed), at most `max_concurrency` in
flight per backend. Transport errors (connection refused or dropped, timeouts) are retried up to
`max_retries` times with exponential backoff (`retry_backoff * 2**attempt` seconds); HTTP errors are never
retried and raise `ServerError` carrying the server's own message.

Deadlines bound every wait: one attempt waits at most `request_timeout` seconds, one request (all its attempts
and backoff) at most `request_deadline`, and every request of the backend's life at most `job_deadline` after
it connected (null: no job limit). A request that runs out of attempts or time marks the server unavailable:
every later request fails at once with the same error instead of waiting again, so a frozen server fails
the job within one request deadline. Each distinct failure is logged once at ERROR with the server's own
message, so it reaches the console (Inspect's own summary says only that the task failed).

Identity: `base_url` and the connection settings (`CONNECTION_OPTIONS`: address, key variable, timeouts and
deadlines, concurrency, retries, and the `launch*` settings) are not part of what is evaluated; the class's
`protocol_options()` leaves them out and `identity()` (after connecting) names the served model (its `/v1/models`
id) and the server's version, which is what a protocol should record, so a restarted server on another port can
resume.

Launched server: with `launch: true` the app (`python -m steer_hydra`, its `LaunchServer` callback) starts one
server for the run or sweep (`steer_hydra.backends.vllm.launch`) and hands its address to the jobs in the
environment variable `LAUNCHED_URL_ENV`; `base_url` then stays unset and is read from there.

Token ids come back exactly through vLLM's `return_token_ids` request extension (recent vLLM answers with
`choices[i].token_ids`). A server that ignores it (an older vLLM, another OpenAI-compatible server) answers
text only; then the text (requested with special tokens kept) is re-tokenized with the client tokenizer and
the stop token the server reports (`stop_reason`, else eos on a `stop` finish) is appended. That fallback is
logged once, since re-tokenized ids can differ from the generated ones at token boundaries.

LoRA: a LoRA adapter in the pipeline (LoRAAdapter) must be one the server was started with (`--enable-lora
--lora-modules NAME=PATH`); its requests name the adapter as their `model`. The backend refuses, naming the command
line that serves it, when `/v1/models` does not list it.

The API key is read from the environment variable named by `api_key_env` when the backend connects and is
sent as `Authorization: Bearer ...`; it is never part of the options, the config or its digest.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from steer_hydra.backends.vllm.engine import TokenEngineBackend
from steer_hydra.backends.vllm.offline import LoRAServing, lora_rank_bound
from steer_hydra.core.rendering import encode_lock

logger = logging.getLogger(__name__)

MISSING = "???"  # Hydra's marker for a required value left unset


class ServerError(RuntimeError):
    """The server answered a request with an HTTP error (never retried); carries its status and message."""

    def __init__(self, status: int, message: str, url: str) -> None:
        super().__init__(f"Server at {url} answered HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.url = url


class ServerUnavailableError(ConnectionError):
    """Every attempt of a request failed in transport (connection refused or dropped, timeout), or its deadline
    passed; later requests of the same backend fail at once with this error."""


LAUNCH_OPTIONS = ("launch", "launch_host", "launch_timeout", "launch_args")
# the launched server's address, set by the app for each job (a sweep: `hydra.job.env_set`)
LAUNCHED_URL_ENV = "STEER_HYDRA_VLLM_SERVE_URL"
CONNECT_TIMEOUT = 3.0  # seconds for pre-flight to reach the server's port

CONNECTION_OPTIONS = (
    "base_url",
    "api_key_env",
    "request_timeout",
    "request_deadline",
    "job_deadline",
    "max_concurrency",
    "max_retries",
    "retry_backoff",
    *LAUNCH_OPTIONS,
)

_NUMERIC = (
    ("request_timeout", float, "> 0 seconds", lambda v: v > 0),
    ("request_deadline", float, "> 0 seconds", lambda v: v > 0),
    ("job_deadline", float, "> 0 seconds", lambda v: v > 0),
    ("max_concurrency", int, ">= 1", lambda v: v >= 1),
    ("max_retries", int, ">= 0", lambda v: v >= 0),
    ("retry_backoff", float, ">= 0 seconds", lambda v: v >= 0),
    ("launch_timeout", float, "> 0 seconds", lambda v: v > 0),
)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Options of `backend=vllm_serve` (the Hydra `backend.options` mapping).

    Attributes:
        base_url: the server root, e.g. `http://localhost:8000` (a trailing `/v1` is accepted).
        api_key_env: name of the environment variable holding the API key (unset variable: no auth header).
        model: the served model name; None asks `/v1/models` (the only model, or `model_name_or_path`).
        request_timeout: seconds one attempt may wait (connect, and each read or write).
        request_deadline: seconds one request may take over all its attempts and backoff.
        job_deadline: seconds after connecting after which no request may still run (None: no limit).
        max_concurrency: requests in flight at once from this backend.
        max_retries: extra attempts after a transport error (HTTP errors are not retried).
        retry_backoff: seconds before the first retry; doubles for each further one.
        launch: the app starts a server for the run or sweep (`vllm_launch`); `base_url` is then its address.
        launch_host: the launched server's bind address (`0.0.0.0`: jobs reach it by this machine's hostname).
        launch_timeout: seconds the launched server may take to answer `GET /v1/models`.
        launch_args: extra command-line arguments of the launched server (appended last, so they win).
    """

    base_url: str
    api_key_env: str | None = "VLLM_API_KEY"
    model: str | None = None
    request_timeout: float = 60.0
    request_deadline: float = 180.0
    job_deadline: float | None = None
    max_concurrency: int = 8
    max_retries: int = 3
    retry_backoff: float = 0.5
    launch: bool = False
    launch_host: str = "127.0.0.1"
    launch_timeout: float = 900.0
    launch_args: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any], *, launched_url: str | None = None) -> ServeOptions:
        """Validate `options`, naming any unknown or bad field and the fix.

        With `launch: true`, `base_url` must be unset: it is `launched_url`, else the `LAUNCHED_URL_ENV` variable.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        if "api_key" in options:
            raise ValueError(
                "backend=vllm_serve does not take api_key in its options (it would land in the config, logs and "
                "W&B). Fix: export the key in an environment variable and set api_key_env to its name "
                "(default VLLM_API_KEY)."
            )
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise ValueError(f"Unknown backend=vllm_serve option(s) {unknown}; valid options: {names}.")
        launch = options.get("launch", False)
        if not isinstance(launch, bool):
            raise ValueError(f"backend=vllm_serve options.launch must be true or false; got {launch!r}.")
        base_url = options.get("base_url")
        if launch:
            base_url = _launched_base_url(base_url, launched_url)
        elif base_url in (None, "", MISSING):
            raise ValueError(
                "backend=vllm_serve needs options.base_url, the server root (e.g. http://localhost:8000). "
                "Fix: pass backend.options.base_url=http://HOST:PORT (Hydra) or options={'base_url': ...}."
            )
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"backend=vllm_serve options.base_url must be an http(s) URL; got {base_url!r}.")
        values = {k: options[k] for k in names if k in options}
        values["base_url"] = normalize_base_url(base_url)
        values["launch_args"] = _launch_args(options.get("launch_args"))
        for name, kind, rule, ok in _NUMERIC:
            if name not in values or (name == "job_deadline" and values[name] is None):
                continue
            raw = values[name]
            try:
                if isinstance(raw, bool):
                    raise TypeError
                values[name] = kind(raw)
            except (TypeError, ValueError):
                raise ValueError(f"backend=vllm_serve options.{name} must be a number {rule}; got {raw!r}.") from None
            if not ok(values[name]):
                raise ValueError(f"backend=vllm_serve options.{name} must be {rule}; got {raw!r}.")
        for name in ("api_key_env", "model"):
            if values.get(name) is not None and not isinstance(values[name], str):
                raise ValueError(f"backend=vllm_serve options.{name} must be a string or null; got {values[name]!r}.")
        host = values.get("launch_host", "127.0.0.1")
        if not isinstance(host, str) or not host:
            raise ValueError(
                f"backend=vllm_serve options.launch_host must be a bind address (127.0.0.1, 0.0.0.0); got {host!r}."
            )
        parsed = cls(**values)
        return parsed


def _launched_base_url(base_url: Any, launched_url: str | None) -> str:
    """The address of the server launched for `launch: true`; refuses a `base_url` set beside it."""
    if base_url not in (None, "", MISSING):
        raise ValueError(
            f"backend=vllm_serve options.launch=true starts its own server, so options.base_url must stay unset; "
            f"got base_url={base_url!r}. Fix: drop backend.options.base_url, or set backend.options.launch=false "
            "to use the server at base_url."
        )
    url = launched_url or os.environ.get(LAUNCHED_URL_ENV)
    if not url:
        raise ValueError(
            "backend=vllm_serve options.launch=true, but no server was launched for this job: `python -m "
            "steer_hydra` starts it (the launch_server callback in hydra.callbacks) and passes its address in "
            f"{LAUNCHED_URL_ENV}. Fix: run through python -m steer_hydra with that callback kept, or start a server "
            "(steer_hydra.backends.vllm_launch.launch_server) and pass options base_url=<its address>, launch=false."
        )
    return url


def _launch_args(raw: Any) -> tuple[str, ...]:
    """`launch_args` as strings (YAML numbers allowed: `[--max-model-len, 512]`)."""
    if raw is None:
        return ()
    if isinstance(raw, str) or not isinstance(raw, Sequence):
        raise ValueError(
            f"backend=vllm_serve options.launch_args must be a list of server arguments; got {raw!r}. "
            "Fix: backend.options.launch_args=[--max-model-len,4096]."
        )
    bad = [a for a in raw if isinstance(a, bool) or not isinstance(a, str | int | float)]
    if bad:
        raise ValueError(f"backend=vllm_serve options.launch_args must hold strings or numbers; got {bad!r}.")
    return tuple(str(a) for a in raw)


def normalize_base_url(url: str) -> str:
    """The server root without a trailing slash or `/v1` (paths below are written `/v1/...`)."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def completion_body(prompt: Sequence[int], fields: Mapping[str, Any], *, model: str) -> dict[str, Any]:
    """The JSON body of one `/v1/completions` request for one prompt row (token ids, sampling fields, and the
    row's request fields from output controls, e.g. `structured_outputs`, which vLLM's server reads as is)."""
    return {
        "model": model,
        "prompt": [int(t) for t in prompt],
        **fields,
        "stream": False,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "return_token_ids": True,
    }


def server_message(response: Any) -> str:
    """The error message in an error response (OpenAI `{"error": {"message"}}`, vLLM `{"message"}`, or text)."""
    try:
        payload = response.json()
    except ValueError:
        return response.text.strip() or response.reason_phrase
    if isinstance(payload, Mapping):
        error = payload.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        for key in ("message", "detail"):
            if payload.get(key):
                return str(payload[key])
    return str(payload)


def ids_from_choice(choice: Mapping[str, Any], tokenizer: Any) -> list[int]:
    """A completion choice's token ids: exact `token_ids` when present, else the re-tokenized text plus its stop."""
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]]
    text = choice.get("text") or ""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if choice.get("finish_reason") != "stop":
        return ids
    reason = choice.get("stop_reason")
    if isinstance(reason, int) and not isinstance(reason, bool):
        tail = [reason]
    elif isinstance(reason, str):
        tail = [] if text.endswith(reason) else list(tokenizer.encode(reason, add_special_tokens=False))
    else:
        tail = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    if tail and ids[-len(tail) :] != tail:
        ids += tail
    return ids


def _unreachable(base_url: str) -> str | None:
    """Why nothing answers at `base_url`'s host and port (None when a TCP connection opens)."""
    parsed = urlparse(base_url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "localhost", port), timeout=CONNECT_TIMEOUT):
            return None
    except OSError as error:
        return f"nothing accepts connections there within {CONNECT_TIMEOUT:.0f}s ({type(error).__name__}: {error})"


class VLLMServeBackend(LoRAServing, TokenEngineBackend):
    """A vLLM OpenAI-compatible server: input controls, lowered stopping rules and sampled best-of-n run there.

    Attributes after `load()`: `served_model` (the name sent as `model`), `retries` (transport retries so far).
    """

    kind = "vllm_serve"

    @classmethod
    def protocol_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options that bear on what is generated: none of the connection or launch settings
        (`CONNECTION_OPTIONS`)."""
        return {k: v for k, v in options.items() if k not in CONNECTION_OPTIONS}

    @classmethod
    def fits_vectors_with(cls, options: Mapping[str, Any] | None) -> bool:
        """A launched server runs the model group's checkpoint here, so a vector to fit is fitted on its Hugging
        Face model (the cache `backend=vllm` uses) and sent as a given vector; another server's checkpoint may
        live elsewhere."""
        return bool((options or {}).get("launch", False))

    @classmethod
    def uses_model_dtype_with(cls, options: Mapping[str, Any]) -> bool:
        """A launched server runs at the model group's dtype (`launch`), so `hf_model_kwargs.dtype` is used."""
        return bool((options or {}).get("launch", False))

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        """The options validate, and a TCP connection opens at the server's address within `CONNECT_TIMEOUT`."""
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

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.settings = ServeOptions.from_mapping(self.options)
        self.served_model: str | None = None
        self.server_version: str | None = None
        self.retries = 0
        self._client: Any = None
        self._job_deadline: float | None = None  # monotonic time after which no request may run
        self._unavailable: ServerUnavailableError | None = None
        self._reported: set[str] = set()
        self._fallback_warned = False
        self._count_lock = threading.Lock()
        # requests in flight from any number of calling threads (the provider streams one call per request)
        self._slots = threading.BoundedSemaphore(self.settings.max_concurrency)

    # ------------------------------------------------------------------ connection
    def _open(self, *, model_name_or_path: str | None, trust_remote_code: bool) -> None:
        import httpx

        settings = self.settings
        headers = {"Content-Type": "application/json"}
        if settings.api_key_env:
            key = os.environ.get(settings.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
            else:
                logger.debug("%s is not set; requests go without an API key.", settings.api_key_env)
        self._unavailable, self._reported = None, set()
        self._job_deadline = time.monotonic() + settings.job_deadline if settings.job_deadline else None
        self._client = httpx.Client(
            base_url=settings.base_url,
            headers=headers,
            timeout=httpx.Timeout(settings.request_timeout),
            limits=httpx.Limits(
                max_connections=settings.max_concurrency, max_keepalive_connections=settings.max_concurrency
            ),
        )
        try:
            self.served_model = settings.model or self._discover_model(model_name_or_path)
            self._check_lora_served()
        except BaseException:
            self._close()
            raise
        logger.info("backend=vllm_serve: %s serving %r", settings.base_url, self.served_model)

    def identity(self) -> dict[str, Any]:
        """What a protocol records about the server instead of its address: the served model and version.

        `served_model` is the name the server serves (its `/v1/models` id, or the configured `model`);
        `server_version` is `GET /version` when the server answers it (vLLM does), else None.
        """
        if self._client is None:
            raise RuntimeError("backend=vllm_serve is not connected: call steer() (or load()) first.")
        if self.server_version is None:
            try:
                self.server_version = str(self._request("GET", "/version", attempts=1).get("version")) or None
            except (ServerError, ServerUnavailableError):
                self.server_version = None
        return {"kind": self.kind, "served_model": self.served_model, "server_version": self.server_version}

    def _discover_model(self, model_name_or_path: str | None) -> str:
        payload = self._request("GET", "/v1/models")
        # LoRA adapters are listed beside their base model, with the base as their `parent`
        ids = [str(m.get("id")) for m in payload.get("data", []) if isinstance(m, Mapping) and not m.get("parent")]
        if self.settings.launch and model_name_or_path not in ids:  # launched: served under the model reference
            raise ValueError(
                f"The launched server at {self.settings.base_url} serves {ids}, not this job's model "
                f"{model_name_or_path!r}: one launched server serves one model. Fix: run one sweep per model."
            )
        if len(ids) == 1:
            return ids[0]
        if model_name_or_path in ids:
            return str(model_name_or_path)
        raise ValueError(
            f"The server at {self.settings.base_url} serves {ids or 'no models'}; cannot tell which to use. "
            "Fix: set backend option model= to one of them."
        )

    def _check_lora_served(self) -> None:
        """Refuse a LoRA adapter the server does not list in `/v1/models`, naming the command line that serves it."""
        if self._lora is None:
            return
        payload = self._request("GET", "/v1/models")
        ids = [str(m.get("id")) for m in payload.get("data", []) if isinstance(m, Mapping)]
        if self._lora.name in ids:
            return
        name, path, rank = self._lora.name, self._lora.path, lora_rank_bound(self._lora.rank)
        raise ValueError(
            f"The server at {self.settings.base_url} does not serve the LoRA adapter {name!r} (it lists {ids}). "
            f"Fix: start it with `--enable-lora --max-lora-rank {rank} --max-loras 2 --lora-modules {name}={path}` "
            f"(with launch=true: backend.options.launch_args=[--enable-lora,--max-lora-rank,{rank},--max-loras,2,"
            f"--lora-modules,{name}={path}]), or set the LoRAAdapter's name to the name the server serves it under. "
            "(--max-loras 2 keeps an empty slot: on a CPU, vLLM gives base requests batched beside adapter ones the "
            "last slot's adapter.)"
        )

    def _lora_fields(self, artifact: Any) -> dict[str, Any]:
        """The adapter's name as the request's model (`completion_body` lets a row's fields name the model)."""
        return {"model": artifact.name}

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *, attempts: int | None = None
    ) -> dict[str, Any]:
        """One HTTP request within its deadlines; transport errors retried with backoff, HTTP errors at once."""
        if self._client is None:
            raise RuntimeError("backend=vllm_serve is not connected: call steer() (or load()) first.")
        if self._unavailable is not None:
            raise ServerUnavailableError(f"{self._unavailable} (an earlier request gave up; not retrying)")
        if attempts is not None:  # a probe (identity): neither condemns the server nor reports
            return self._attempts(method, path, body, attempts)
        try:
            return self._attempts(method, path, body, self.settings.max_retries + 1)
        except ServerUnavailableError as error:
            self._unavailable = error
            self._report(str(error))
            raise
        except ServerError as error:
            self._report(str(error))
            raise

    def _report(self, message: str) -> None:
        """Log a failure once at ERROR (the console shows it even when Inspect only says the task failed)."""
        with self._count_lock:
            if message in self._reported:
                return
            self._reported.add(message)
        logger.error("backend=vllm_serve: %s", message)

    def _attempts(self, method: str, path: str, body: Mapping[str, Any] | None, attempts: int) -> dict[str, Any]:
        import httpx

        settings = self.settings
        url = f"{settings.base_url}{path}"
        deadline = time.monotonic() + settings.request_deadline
        limit, which = deadline, f"request_deadline={settings.request_deadline:g}s"
        if self._job_deadline is not None and self._job_deadline < deadline:
            limit, which = self._job_deadline, f"job_deadline={settings.job_deadline:g}s"
        attempt = 0
        while True:
            left = limit - time.monotonic()
            if left <= 0:
                raise ServerUnavailableError(
                    f"{method} {url} gave up: its {which} passed after {attempt} attempt(s). Fix: check that the "
                    "server at base_url answers (a stuck server needs a restart), or raise "
                    f"backend.options.{which.partition('=')[0]}."
                )
            timeout = min(settings.request_timeout, left)
            try:
                response = self._client.request(method, path, json=body, timeout=httpx.Timeout(timeout))
            except httpx.TransportError as error:
                attempt += 1
                if attempt >= attempts:
                    raise ServerUnavailableError(
                        f"{method} {url} failed in transport {attempt} time(s) (last: {type(error).__name__}: "
                        f"{error or 'no answer'} within {timeout:.3g}s). Fix: check that the server is up at "
                        "base_url, or raise request_timeout / max_retries."
                    ) from error
                delay = min(settings.retry_backoff * 2 ** (attempt - 1), max(0.0, limit - time.monotonic()))
                with self._count_lock:
                    self.retries += 1
                logger.warning(
                    "%s %s: %s (%s); retry %d/%d in %.2fs",
                    method,
                    url,
                    type(error).__name__,
                    error,
                    attempt,
                    attempts - 1,
                    delay,
                )
                time.sleep(delay)
                continue
            if response.status_code >= 400:
                raise ServerError(response.status_code, server_message(response), url)
            try:
                payload = response.json()
            except ValueError:
                raise ServerError(response.status_code, f"not JSON: {response.text[:200]!r}", url) from None
            if not isinstance(payload, dict):
                raise ServerError(response.status_code, f"expected a JSON object; got {payload!r}", url)
            return payload

    # ------------------------------------------------------------------ completions
    def _complete(self, prompts: Sequence[list[int]], fields: Sequence[dict[str, Any]]) -> list[list[list[int]]]:
        if len(prompts) == 1:
            return [self._complete_one(prompts[0], fields[0])]
        workers = min(self.settings.max_concurrency, len(prompts))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vllm_serve") as pool:
            futures = [pool.submit(self._complete_one, p, f) for p, f in zip(prompts, fields, strict=True)]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def _complete_one(self, prompt: list[int], fields: dict[str, Any]) -> list[list[int]]:
        with self._slots:  # at most max_concurrency in flight; a request's deadlines start when it is sent
            payload = self._request("POST", "/v1/completions", completion_body(prompt, fields, model=self.served_model))
        choices = sorted(payload.get("choices") or [], key=lambda c: c.get("index", 0))
        if len(choices) != fields["n"]:
            raise ServerError(
                200, f"expected {fields['n']} choices, got {len(choices)}", f"{self.settings.base_url}/v1/completions"
            )
        if any(c.get("token_ids") is None for c in choices) and not self._fallback_warned:
            self._fallback_warned = True
            logger.warning(
                "The server at %s returned no token_ids (vLLM's return_token_ids extension); re-tokenizing the "
                "returned text client-side, which can differ from the generated ids at token boundaries.",
                self.settings.base_url,
            )
        if all(c.get("token_ids") is not None for c in choices):
            return [ids_from_choice(c, self.tokenizer) for c in choices]
        with encode_lock(self.tokenizer):
            return [ids_from_choice(c, self.tokenizer) for c in choices]
