"""A loopback OpenAI-compatible completions server over a `SteeringPipeline`, for offline tests of `vllm_serve`.

`LoopbackCompletionsServer(pipeline)` serves `GET /v1/models`, `GET /version` and `POST /v1/completions` on
127.0.0.1 (an ephemeral port) from a background thread, generating with the given (steered, usually Hugging
Face) pipeline, one request at a time. It understands what `backend=vllm_serve` sends, in vLLM's dialect:
token-id prompts (`list[int]`; also a string or a list of token-id lists), `max_tokens`, `temperature` (0 is
greedy), `top_p`, `top_k`, `n`, `seed`, `stop`, `stop_token_ids`, `include_stop_str_in_output`, `min_tokens`,
`repetition_penalty`, `skip_special_tokens` and `return_token_ids`; bad requests get HTTP 400 with an OpenAI
error body. Faults can be injected for the next requests: `drop_next()` closes the connection after reading
a request without answering, `fail_next(status, message)` answers an HTTP error, `stall_next(seconds)` answers
late, and `freeze()` makes the server accept and read every request but never answer (a hung server) until
`thaw()` or `stop()`. `requests` records every request (path, headers, body); `max_in_flight` the peak
concurrency; `spans` the `(start, end)` monotonic times of each completion served; `frozen_requests` how many
requests a freeze swallowed.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from steer_hydra.core.tensors import strip_trailing

logger = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A request the server refuses with HTTP 400."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the loopback server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


class LoopbackCompletionsServer:
    """Serve `pipeline` as an OpenAI-compatible completions endpoint on 127.0.0.1; use as a context manager.

    Args:
        pipeline: a steered `SteeringPipeline` (its tokenizer decodes the returned text).
        model_name: the name `/v1/models` lists.
        api_key: when set, requests without `Authorization: Bearer <api_key>` get HTTP 401.
        return_token_ids: honour vLLM's `return_token_ids` extension (False imitates a server that ignores it).
    """

    def __init__(
        self, pipeline: Any, *, model_name: str = "loopback", api_key: str | None = None, return_token_ids: bool = True
    ) -> None:
        self.pipeline = pipeline
        self.model_name = model_name
        self.api_key = api_key
        self.return_token_ids = return_token_ids
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self.spans: list[tuple[float, float]] = []
        self._in_flight = 0
        self._faults: list[tuple[str, Any]] = []
        self._thawed = threading.Event()
        self._thawed.set()
        self._frozen_paths: tuple[str, ...] = ()
        self.frozen_requests = 0
        self._state = threading.Condition()
        self._generate = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("The loopback server is not running; use it as a context manager or call start().")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> LoopbackCompletionsServer:
        handler = type("Handler", (_Handler,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="loopback-completions", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.thaw()  # frozen handlers return (without answering) so the server can shut down
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> LoopbackCompletionsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ faults
    def drop_next(self, count: int = 1) -> None:
        """The next `count` completion requests are read, then the connection is closed without an answer."""
        with self._state:
            self._faults.extend([("drop", None)] * count)

    def fail_next(self, status: int, message: str, count: int = 1) -> None:
        """The next `count` completion requests get HTTP `status` with `message` in an OpenAI error body."""
        with self._state:
            self._faults.extend([("fail", (status, message))] * count)

    def stall_next(self, seconds: float, count: int = 1) -> None:
        """The next `count` completion requests wait `seconds` before being served."""
        with self._state:
            self._faults.extend([("stall", seconds)] * count)

    def freeze(self, paths: tuple[str, ...] = ("/v1/completions",)) -> None:
        """From now on requests to `paths` are read and recorded, then held without an answer until `thaw()`."""
        with self._state:
            self._frozen_paths = tuple(paths)
            self._thawed.clear()

    def thaw(self) -> None:
        """End a freeze: held requests get their connection closed (their clients have usually given up)."""
        self._thawed.set()

    def _hold_if_frozen(self, handler: BaseHTTPRequestHandler) -> bool:
        """Hold a request while frozen; True when it was held (its connection is then closed unanswered)."""
        if self._thawed.is_set() or handler.path not in self._frozen_paths:
            return False
        with self._state:
            self.frozen_requests += 1
        self._thawed.wait()
        handler.close_connection = True
        return True

    def reset(self) -> None:
        """Forget recorded requests, pending faults and the concurrency peak."""
        self.thaw()
        with self._state:
            self.requests.clear()
            self._faults.clear()
            self.spans.clear()
            self.max_in_flight = 0
            self.frozen_requests = 0

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no completion request is being served (e.g. one a client gave up on); False on timeout."""
        with self._state:
            return self._state.wait_for(lambda: self._in_flight == 0, timeout=timeout)

    def completion_requests(self) -> list[RecordedRequest]:
        """The recorded `POST /v1/completions` requests, in arrival order."""
        with self._state:
            return [r for r in self.requests if r.path == "/v1/completions"]

    def _next_fault(self) -> tuple[str, Any] | None:
        with self._state:
            return self._faults.pop(0) if self._faults else None

    # ------------------------------------------------------------------ completions
    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Answer one completions request body (raises BadRequest for a malformed one)."""
        tokenizer = self.pipeline.tokenizer
        prompts = _prompts(body.get("prompt"), tokenizer)
        n = _int(body, "n", 1, minimum=1)
        max_tokens = _int(body, "max_tokens", 16, minimum=1)
        temperature = _float(body, "temperature", 1.0, minimum=0.0)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        if not all(isinstance(s, str) and s for s in stops):
            raise BadRequest(f"stop must be a string or a list of non-empty strings; got {body.get('stop')!r}")
        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "n": n, "do_sample": temperature > 0}
        if temperature > 0:
            kwargs["temperature"] = temperature
            if body.get("top_p") is not None:
                kwargs["top_p"] = _float(body, "top_p", 1.0, minimum=0.0)
            top_k = body.get("top_k")
            if top_k is not None and int(top_k) > 0:
                kwargs["top_k"] = int(top_k)
            if body.get("seed") is not None:
                kwargs["seed"] = _int(body, "seed", 0)
        if stops:
            kwargs["stop_strings"] = stops
        if body.get("stop_token_ids"):
            kwargs["stop_token_ids"] = [int(t) for t in body["stop_token_ids"]]
        if body.get("min_tokens"):
            kwargs["min_new_tokens"] = _int(body, "min_tokens", 0, minimum=0)
        if body.get("repetition_penalty") is not None:
            kwargs["repetition_penalty"] = _float(body, "repetition_penalty", 1.0, minimum=0.0)
        keep_stop = bool(body.get("include_stop_str_in_output", False))
        skip_special = bool(body.get("skip_special_tokens", True))
        want_ids = self.return_token_ids and bool(body.get("return_token_ids", False))

        choices, generated = [], 0
        for p, prompt in enumerate(prompts):
            with self._generate:
                output = self.pipeline.generate(input_ids=prompt, return_output=True, **kwargs)
            for j, row in enumerate(output.output_ids.tolist()):
                ids, _ = strip_trailing(row, tokenizer.pad_token_id)
                generated += len(ids)
                text = tokenizer.decode(ids, skip_special_tokens=skip_special)
                reason, stop_reason = self._finish(output.finish_reasons[j], ids, text, stops, kwargs)
                if isinstance(stop_reason, str):
                    cut = text.find(stop_reason)
                    text = text[: cut + len(stop_reason)] if keep_stop else text[:cut]
                elif stop_reason is None and reason == "stop" and ids and skip_special is False:
                    text = tokenizer.decode(ids[:-1], skip_special_tokens=False)  # vLLM leaves eos out of text
                choice = {
                    "index": p * n + j,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": stop_reason,
                }
                if want_ids:
                    choice["token_ids"] = ids
                choices.append(choice)
        prompt_tokens = sum(len(p) for p in prompts)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": generated,
                "total_tokens": prompt_tokens + generated,
            },
        }

    @staticmethod
    def _finish(
        reason: str | None, ids: list[int], text: str, stops: list[str], kwargs: Mapping[str, Any]
    ) -> tuple[str, str | int | None]:
        """OpenAI finish reason and vLLM stop reason (the stop string or token id; None for eos or length)."""
        if reason == "stop":
            hits = [(text.find(s), s) for s in stops if s in text]
            if hits:
                return "stop", min(hits)[1]
            if ids and ids[-1] in kwargs.get("stop_token_ids", ()):
                return "stop", ids[-1]
        if reason in ("stop", "eos"):
            return "stop", None
        return "length", None


class _Handler(BaseHTTPRequestHandler):
    owner: LoopbackCompletionsServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read `requests` instead
        logger.debug("loopback: " + format, *args)

    def _record(self, body: dict[str, Any] | None) -> None:
        with self.owner._state:
            self.owner.requests.append(RecordedRequest(self.command, self.path, dict(self.headers.items()), body))

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}.get(status, "ServerError")
        self._send(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def _authorized(self) -> bool:
        key = self.owner.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._error(401, "Invalid or missing API key.")
        return False

    def do_GET(self) -> None:
        self._record(None)
        if self.owner._hold_if_frozen(self) or not self._authorized():
            return
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.owner.model_name, "object": "model"}]})
        elif self.path == "/version":
            self._send(200, {"version": "loopback"})
        else:
            self._error(404, f"No route {self.path}.")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError as error:
            self._record(None)
            self._error(400, f"Request body is not JSON: {error}")
            return
        self._record(body if isinstance(body, dict) else None)
        if self.owner._hold_if_frozen(self) or not self._authorized():
            return
        if self.path != "/v1/completions":
            self._error(404, f"No route {self.path}.")
            return
        fault = self.owner._next_fault()
        if fault is not None and fault[0] == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if fault is not None and fault[0] == "fail":
            self._error(*fault[1])
            return
        with self.owner._state:
            self.owner._in_flight += 1
            self.owner.max_in_flight = max(self.owner.max_in_flight, self.owner._in_flight)
        started = time.monotonic()
        try:
            if fault is not None and fault[0] == "stall":
                time.sleep(fault[1])
            if not isinstance(body, dict):
                raise BadRequest("The request body must be a JSON object.")
            answer: tuple[int, Any] = (200, self.owner.complete(body))
        except BadRequest as error:
            answer = (400, str(error))
        except Exception as error:  # a server answers errors; the client surfaces the message
            logger.exception("loopback completion failed")
            answer = (500, f"{type(error).__name__}: {error}")
        finally:
            with self.owner._state:  # before answering: the client may send its next request at once
                self.owner._in_flight -= 1
                self.owner.spans.append((started, time.monotonic()))
                self.owner._state.notify_all()
        if answer[0] == 200:
            self._send(*answer)
        else:
            self._error(*answer)


def _prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [list(prompt)]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(p, list) and p for p in prompt)
        and all(isinstance(t, int) for p in prompt for t in p)
    ):
        return [list(p) for p in prompt]
    raise BadRequest(f"prompt must be a string, a non-empty list of token ids or a list of those; got {prompt!r}")


def _int(body: Mapping[str, Any], name: str, default: int, minimum: int | None = None) -> int:
    value = body.get(name, default)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
        raise BadRequest(f"{name} must be an integer{f' >= {minimum}' if minimum is not None else ''}; got {value!r}")
    return value


def _float(body: Mapping[str, Any], name: str, default: float, minimum: float | None = None) -> float:
    value = body.get(name, default)
    if value is None:
        value = default
    if not isinstance(value, (int, float)) or isinstance(value, bool) or (minimum is not None and value < minimum):
        raise BadRequest(f"{name} must be a number{f' >= {minimum}' if minimum is not None else ''}; got {value!r}")
    return float(value)
