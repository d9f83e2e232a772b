"""vLLM general plugin (worker side): applies each request's residual-stream edits inside the engine, per token.

Registered under the `vllm.general_plugins` entry point, so vLLM calls `register()` in each of its processes;
it does nothing unless `STEER_HYDRA_VLLM_STEERING=1` (backend=vllm sets it for its engine; a server is started
with it: `STEER_HYDRA_VLLM_STEERING=1 VLLM_USE_V2_MODEL_RUNNER=0 vllm serve MODEL --enforce-eager`). It hooks vLLM's
V1 model runner, which vLLM 0.32 runs only with `VLLM_USE_V2_MODEL_RUNNER=0` where Triton is importable. When
on, it wraps the worker's `load_model` so that, once the model is loaded, `install(model_runner)` puts five kinds
of hooks on it:

- a forward pre-hook on the model builds the step's plan from the requests of the persistent batch in order
  (`input_batch.req_ids`), their token ranges in the flat batch (`query_start_loc`), their positions (the
  model's `positions` argument) and their `SamplingParams.extra_args` (see `vllm_steering` for the wire format);
- a forward pre-hook (site `input`) and a forward hook (site `output`) on every decoder layer, a forward hook
  (site `attention`) on each layer's attention module, and a forward pre-hook (site `heads`) on each attention's
  output projection (its input: the heads' outputs side by side), apply the plan entries of their (layer, site),
  looked up in a dict built once per step (nothing when the step is unsteered).

The plan is built in two parts. What depends on the batch's composition (each request's payload and starts, in
batch order) is a `Composition`, rebuilt only when that tuple changes (a request admitted or finished, a payload
changed): every edit is an entry (request, start, span length, block or not, first row in one stacked table of the
batch's distinct rows) of a group (layer, site, operation and the edit's rank among its request's edits there, so
two edits at one site apply in turn), entries stored group after group as tensors. The operations: `add` (an
addition), `add_norm` (an addition that keeps each stream's norm), `project` (the component along a unit row
removed, `h <- h - (h.r) r`: directional ablation), `rotate` and `rotate_to` (the stream's component in the plane
of two orthonormal rows rotated by an angle, or set to an angle, its norm kept: angular steering; the table row
packs both basis rows, the angle's cosine and sine) and `condition` (nothing edited: the stream's mean over the
request's prompt positions decides a gate; CAST). Rows of different widths (a `heads` edit is `num_heads *
head_dim` wide, a rotation's packed row wider) share the table, zero-padded; each entry knows its width.

Gates (CAST): a `condition` entry spans the request's prompt positions `[0, prompt length)`. Whenever one of them
is computed in a step (the prefill, possibly in chunks), the condition site reads the stream there and adds it to
a running sum for (the request's nonce, the gate), counting each prompt position once (a recomputed position, after
preemption, is not counted twice); once every prompt position has been read, the mean decides the gate
(`steer_hydra.core.edits`), kept for the request's life (a bounded memo). An edit gated by it spans positions from
the prompt's end only, so its gate is decided before it is reached: the step's plan keeps the gated entries of open
gates and drops the rest; a gated entry reached with its gate undecided (its prompt not computed in this engine)
raises. Each request carrying a condition has a nonce of its own (in its extra_args and its cache salt), shared by
the `n` candidates of one prompt: no other request shares its prefix-cache blocks, and candidates that reuse each
other's blocks share the decision. What depends on the token ranges, the flat (entry, token of its
request) pairs, is cached for ranges seen the step before (a steady decode phase). Per step, a handful of
vectorized ops then select the pairs whose position lies in their entry's span (`position - start` in
`[0, length)`), give each its table row (`first + (position - start)` for a block, `first` otherwise), gather those
rows in one op (up to `_GATHER_AT_ONCE` values; past it each layer gathers its own) and split them by group: no
per-token and, beyond reading each request's extra_args, no per-request Python. The positions are read on the CPU
(one copy, a device sync, per steered step); the plan's indices and rows go to the model's device once per step.

vLLM decoder layers take and return `(hidden_states, residual)`: the residual stream is their sum (the next
norm adds them). An edit goes into `hidden_states` out of place (never an in-place write on an inference tensor);
norm preservation rescales, and a projection, a rotation and a condition read, the whole stream `hidden + residual`,
not `hidden` alone (at the `attention` site, the attention output itself; at `heads`, the projection's input).
Requests without edits (and padding rows) are untouched. Hooks inside a torch.compile'd model would be traced
once, so steering needs eager mode (`enforce_eager=True`).
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from steer_hydra.backends.vllm.steering import ENV_FLAG, RUNNER_ENV, XARGS_KEY, XARGS_NONCE, XARGS_START
from steer_hydra.core.edits import condition_similarity, gate_open, rotate_in_plane

logger = logging.getLogger("vllm.steer_hydra")  # under vLLM's logger: its processes print it

_MARK = "_steer_hydra_steering"


def register() -> None:
    """vLLM's entry point: when the env flag is on, make the worker install the hooks after loading the model."""
    if os.environ.get(ENV_FLAG) != "1":
        return
    try:
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as error:  # another vLLM layout: say so, steering is then unavailable
        logger.warning("steer_hydra steering plugin: no vllm.v1 Worker (%s); steering is off.", error)
        return
    if getattr(Worker.load_model, _MARK, False):
        return
    original = Worker.load_model

    @functools.wraps(original)
    def load_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        install(self.model_runner)
        return result

    setattr(load_model, _MARK, True)
    Worker.load_model = load_model


@dataclass(frozen=True, slots=True)
class Addition:
    """One parsed edit of the wire format (rows as a float32 tensor)."""

    layer: int
    site: str
    mode: str
    preserve_norm: bool
    rows: torch.Tensor
    angle: float = 0.0
    gate: str | None = None
    threshold: float = 0.0
    comparison: str = ">"

    def packed(self) -> torch.Tensor:
        """The rows this edit puts in a step's table: a rotation's basis rows and its angle's cosine and sine
        side by side in one row; any other edit's rows as they are."""
        if self.mode not in ("rotate", "rotate_to"):
            return self.rows
        angle = torch.tensor(self.angle, dtype=torch.float64)
        trig = torch.stack([torch.cos(angle), torch.sin(angle)]).float()
        return torch.cat([self.rows[0], self.rows[1], trig])[None]


@functools.lru_cache(maxsize=512)
def parse(payload: str) -> tuple[Addition, ...]:
    """The additions of one request's `steer_hydra` payload (cached: every row of a call shares it)."""
    return tuple(
        Addition(
            int(item["layer"]),
            str(item["site"]),
            str(item["mode"]),
            bool(item.get("preserve_norm", False)),
            torch.tensor(item["rows"], dtype=torch.float32),
            float(item.get("angle", 0.0)),
            item.get("gate"),
            float(item.get("threshold", 0.0)),
            str(item.get("comparison", ">")),
        )
        for item in json.loads(payload)
    )


Spec = tuple[str | None, tuple[int, ...], str | None]  # a request's payload, starts and nonce (None: no additions)
_NO_SPEC: Spec = (None, (), None)
_UNBOUNDED = torch.iinfo(torch.long).max  # the "length" of a `from` addition: every position from its start
# a step's rows are gathered at once (one op, not one per layer) up to this many values; beyond (long prefills),
# each layer gathers its own when it runs, so they never all sit in memory together
_GATHER_AT_ONCE = 1 << 22
_DECISIONS_KEPT = 1 << 16  # gate decisions remembered (a preempted request recomputing its prompt finds its own)
_PENDING_KEPT = 1 << 12  # gates being read (requests in prefill)


def request_spec(xargs: Mapping[str, Any] | None) -> Spec:
    """A request's `(payload, starts, nonce)` from its extra_args (what its additions depend on)."""
    if not xargs or XARGS_KEY not in xargs:
        return _NO_SPEC
    return xargs[XARGS_KEY], tuple(xargs.get(XARGS_START) or ()), xargs.get(XARGS_NONCE)


def operation(addition: Addition) -> str:
    """The edit's operation: `project`, `rotate`, `rotate_to`, `condition`, `add_norm` (an addition keeping the
    stream's norm) or `add`."""
    if addition.mode in ("project", "rotate", "rotate_to", "condition"):
        return addition.mode
    return "add_norm" if addition.preserve_norm else "add"


@dataclass(frozen=True, slots=True)
class Steer:
    """One step's work at one (layer, site): apply `op` with `table[row_index]` (`table` itself when `row_index` is
    None; the first `packed` columns) to the stream at flat tokens `index`, a stream `width` wide. A `condition`
    also carries, per token, its gate key (`keys`, an index into the composition's gates) and its position
    (`offsets`)."""

    layer: int
    site: str
    op: str
    index: torch.Tensor
    row_index: torch.Tensor | None
    table: torch.Tensor
    width: int = 0
    packed: int = 0
    keys: torch.Tensor | None = None
    offsets: torch.Tensor | None = None

    @property
    def rows(self) -> torch.Tensor:
        rows = self.table if self.row_index is None else self.table.index_select(0, self.row_index)
        return rows[:, : self.packed] if self.packed and rows.shape[1] != self.packed else rows

    @property
    def preserve_norm(self) -> bool:
        return self.op == "add_norm"

    def apply(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """`hidden` after this work (out of place); the stream is `hidden + residual`."""
        if self.width and hidden.shape[-1] != self.width:
            raise RuntimeError(
                f"steer_hydra steering: an edit {self.width} wide meets a stream {hidden.shape[-1]} wide at layer "
                f"{self.layer}, site {self.site!r} (with tensor parallelism the heads' outputs are split across "
                "workers). Fix: tensor_parallel_size=1 for head-slice edits, or edits fitted on this model."
            )
        if self.op == "project":
            return project_rows(hidden, residual, self.index, self.rows)
        if self.op in ("rotate", "rotate_to"):
            return rotate_rows(hidden, residual, self.index, self.rows, self.op == "rotate_to")
        if self.op == "condition":
            raise RuntimeError("A condition edits nothing; SteeringHooks reads it (read_condition).")
        return add_rows(hidden, residual, self.index, self.rows, self.op == "add_norm")


class Composition:
    """What the requests of a batch edit, independent of a step's positions and token ranges.

    Every edit of every request is an entry of a group (layer, site, operation, slot), the slot being the edit's
    rank among the request's edits of the same (layer, site, operation), so a group holds at most one edit per
    request and same-site edits of one request apply one after another. Entries are stored
    group after group as tensors (request, start, length, block or not, first row in `table`, group, gate key),
    `table` stacking the packed rows of each distinct parsed addition once (zero-padded to the widest). A request's
    conditions are its gate keys (`gate_keys`: request and gate name; `gate_info`: the condition and its prompt
    length); a `condition` entry spans the prompt (start 0, length the prompt's), a gated entry names its gate's key.
    """

    def __init__(self, specs: Sequence[Spec], num_layers: int) -> None:
        groups: dict[tuple[int, str, str, int], list[tuple[int, int, Addition, int]]] = {}
        self.gate_keys: list[tuple[int, str]] = []
        self.gate_info: list[tuple[Addition, int]] = []
        for request, (payload, starts, _nonce) in enumerate(specs):
            if payload is None:
                continue
            additions = parse(payload)
            if len(starts) != len(additions):
                raise ValueError(f"{XARGS_START} has {len(starts)} entries for {len(additions)} additions.")
            keys: dict[str, int] = {}
            for addition, start in zip(additions, starts, strict=True):
                if addition.mode == "condition":
                    if not addition.gate or addition.gate in keys:
                        raise ValueError(f"A request's conditions must name distinct gates; got {addition.gate!r}.")
                    keys[addition.gate] = len(self.gate_keys)
                    self.gate_keys.append((request, addition.gate))
                    self.gate_info.append((addition, int(start)))
            seen: dict[tuple[int, str, str], int] = {}
            for addition, start in zip(additions, starts, strict=True):
                if not 0 <= addition.layer < num_layers:
                    raise ValueError(f"Steering layer {addition.layer} is out of range (the model has {num_layers}).")
                if addition.gate is not None and addition.gate not in keys:
                    raise ValueError(
                        f"An edit is gated by {addition.gate!r}, which no condition of its request decides."
                    )
                key = keys[addition.gate] if addition.gate is not None else -1
                site = (addition.layer, addition.site, operation(addition))
                seen[site] = slot = seen.get(site, -1) + 1
                groups.setdefault((*site, slot), []).append((request, int(start), addition, key))
        self.groups = list(groups)
        self.widths: list[tuple[int, int]] = []  # per group: the stream's width and the packed rows' width
        columns: list[tuple[int, ...]] = []  # group, request, start, length, block, first row, gate key
        firsts: dict[int, int] = {}  # id(addition) -> its first row in the table (rows shared by requests once)
        tables: list[torch.Tensor] = []
        for group, members in enumerate(groups.values()):
            widths = {(int(a.rows.shape[-1]), int(a.packed().shape[-1])) for _, _, a, _ in members}
            if len(widths) != 1:
                raise ValueError(f"Edits at one site have different widths {sorted(widths)}; one model, one width.")
            self.widths.append(widths.pop())
            for request, start, addition, key in members:
                if id(addition) not in firsts:
                    firsts[id(addition)] = sum(t.shape[0] for t in tables)
                    tables.append(addition.packed())
                block = addition.mode == "block"
                if addition.mode == "condition":  # the prompt's positions: [0, prompt length)
                    start, length = 0, start
                else:
                    length = addition.rows.shape[0] if block else _UNBOUNDED
                columns.append((group, request, start, length, block, firsts[id(addition)], key))
        width = max((t.shape[1] for t in tables), default=0)
        padded = [torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tables]
        self.table = torch.cat(padded) if padded else torch.zeros(0, 0)
        values = torch.tensor(columns, dtype=torch.long).reshape(-1, 7).T
        self.group, self.request, self.start, self.length, self.block, self.first, self.gate = values
        condition_groups = torch.tensor([op == "condition" for _, _, op, _ in self.groups], dtype=torch.bool)
        self.is_condition = condition_groups[self.group] if self.groups else torch.zeros(0, dtype=torch.bool)
        self._ranges: tuple[bytes, tuple[torch.Tensor, ...]] | None = None
        self._tables: dict[torch.device, torch.Tensor] = {}

    def __bool__(self) -> bool:
        return bool(self.groups)

    def pairs(self, begin: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Each (entry, token of its request) of a step: token, entry, start, length (entries in group order)."""
        counts = (end - begin).clamp_min(0)[self.request]
        entry = torch.repeat_interleave(counts)
        first = counts.cumsum(0) - counts
        token = begin[self.request][entry] + torch.arange(entry.numel()) - first[entry]
        return token, entry, self.start[entry], self.length[entry]

    def plan(
        self, begin: np.ndarray, end: np.ndarray, positions: torch.Tensor, gates: torch.Tensor | None = None
    ) -> list[Steer]:
        """The step's work: requests' token ranges `[begin, end)` in the flat batch, and the tokens' positions;
        `gates` holds each gate key's state (-1 undecided, 0 closed, 1 open; None: all undecided).

        The pairs depend only on the ranges (cached: a steady decode step reuses them); per step, a few vectorized
        ops select the pairs whose position falls in their addition's span (and, for gated entries, whose gate is
        open; for conditions, whose gate is still undecided) and split them by group.
        """
        if positions.dim() != 1:
            raise ValueError("steer_hydra steering supports 1-D token positions (text models), not M-RoPE.")
        key = begin.tobytes() + end.tobytes()
        if self._ranges is None or self._ranges[0] != key:
            self._ranges = key, self.pairs(torch.from_numpy(begin), torch.from_numpy(end))
        token, entry, start, length = self._ranges[1]
        relative = positions.to(device="cpu", dtype=torch.long)[token] - start
        inside = (relative >= 0) & (relative < length)
        if self.gate_keys:
            inside = inside & self._gated(entry, inside, gates)
        chosen = inside.nonzero().squeeze(1)
        entry = entry[chosen]
        index = token[chosen]
        rows = self.first[entry] + relative[chosen] * self.block[entry]
        sizes = torch.bincount(self.group[entry], minlength=len(self.groups)).tolist()
        keys = self.gate[entry].split(sizes) if self.gate_keys else [None] * len(sizes)
        offsets = relative[chosen].split(sizes) if self.gate_keys else [None] * len(sizes)
        device = positions.device
        table = self._tables.get(device)
        if table is None:
            table = self._tables[device] = self.table.to(device)
        index, rows = index.to(device), rows.to(device)
        if rows.numel() * table.shape[1] <= _GATHER_AT_ONCE:
            gathered = table.index_select(0, rows).split(sizes)
            pieces = zip(index.split(sizes), [None] * len(sizes), gathered, strict=True)
        else:
            pieces = zip(index.split(sizes), rows.split(sizes), [table] * len(sizes), strict=True)
        return [
            Steer(layer, site, op, *piece, *widths, *((k, o) if op == "condition" else (None, None)))
            for (layer, site, op, _), size, piece, widths, k, o in zip(
                self.groups, sizes, pieces, self.widths, keys, offsets, strict=True
            )
            if size
        ]

    def _gated(self, entry: torch.Tensor, inside: torch.Tensor, gates: torch.Tensor | None) -> torch.Tensor:
        """Which pairs their gates let through: ungated ones; conditions whose gate is undecided; gated edits whose
        gate is open (one reached undecided raises)."""
        key = self.gate[entry]
        keyed = key >= 0
        state = gates if gates is not None else torch.full((len(self.gate_keys),), -1, dtype=torch.int8)
        found = state.to(torch.int8)[key.clamp_min(0)]
        condition = self.is_condition[entry]
        undecided = inside & keyed & ~condition & (found == -1)
        if bool(undecided.any()):
            request, gate = self.gate_keys[int(key[undecided.nonzero()[0, 0]])]
            raise RuntimeError(
                f"steer_hydra steering: gate {gate!r} of the batch's request {request} is undecided where an edit it "
                "gates begins: the request's prompt was not all computed in this engine. Fix: leave its cache_salt "
                "as the client sets it (no prefix-cache sharing with other requests)."
            )
        return ~keyed | (condition & (found == -1)) | (~condition & (found == 1))


def build_plan(
    requests: Sequence[tuple[int, int, Mapping[str, Any] | None]],
    positions: torch.Tensor,
    num_layers: int,
    gates: Mapping[str, bool] | None = None,
) -> list[Steer]:
    """The work of one step, in application order: `requests` lists each request's token range `[start, end)` in
    the flat batch and its extra_args; `positions` are the flat batch's token positions; `gates` the decided gates
    by name (the same for every request; none decided when None)."""
    composition = Composition([request_spec(x) for _, _, x in requests], num_layers)
    begin = np.array([b for b, _, _ in requests], dtype=np.int64)
    end = np.minimum(np.array([e for _, e, _ in requests], dtype=np.int64), positions.shape[-1])
    decided = dict(gates or {})
    states = torch.tensor([int(decided[g]) if g in decided else -1 for _, g in composition.gate_keys], dtype=torch.int8)
    return composition.plan(begin, end, positions, states) if composition else []


def add_rows(
    hidden: torch.Tensor, residual: torch.Tensor | None, index: torch.Tensor, rows: torch.Tensor, preserve: bool
) -> torch.Tensor:
    """`hidden` with `rows` added at flat positions `index` (out of place); the stream is `hidden + residual`."""
    index = index.to(hidden.device)
    rows = rows.to(device=hidden.device, dtype=hidden.dtype)
    if not preserve:
        return hidden.index_add(0, index, rows)
    part = hidden.index_select(0, index)
    rest = residual.index_select(0, index) if residual is not None else torch.zeros_like(part)
    stream = part + rest
    steered = stream + rows
    steered = steered * (stream.norm(dim=-1, keepdim=True) / steered.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    return hidden.index_copy(0, index, steered - rest)


def project_rows(
    hidden: torch.Tensor, residual: torch.Tensor | None, index: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """`hidden` with each stream at flat positions `index` stripped of its component along the unit row it gets
    (`s <- s - (s.r) r`, the stream being `hidden + residual`), out of place."""
    index = index.to(hidden.device)
    rows = rows.to(device=hidden.device, dtype=hidden.dtype)
    stream = hidden.index_select(0, index)
    if residual is not None:
        stream = stream + residual.index_select(0, index)
    return hidden.index_add(0, index, -(stream * rows).sum(-1, keepdim=True) * rows)


def rotate_rows(
    hidden: torch.Tensor, residual: torch.Tensor | None, index: torch.Tensor, packed: torch.Tensor, to_angle: bool
) -> torch.Tensor:
    """`hidden` with each stream at flat positions `index` rotated in the plane its packed row names (basis rows,
    then the angle's cosine and sine; `rotate_in_plane`), the stream being `hidden + residual`, out of place."""
    index = index.to(hidden.device)
    width = hidden.shape[-1]
    packed = packed.to(device=hidden.device, dtype=torch.float32)
    first, second = packed[:, :width], packed[:, width : 2 * width]
    cos, sin = packed[:, 2 * width : 2 * width + 1], packed[:, 2 * width + 1 : 2 * width + 2]
    part = hidden.index_select(0, index)
    rest = residual.index_select(0, index) if residual is not None else None
    stream = part if rest is None else part + rest
    rotated = rotate_in_plane(stream, first, second, cos, sin, to_angle=to_angle)
    return hidden.index_copy(0, index, rotated if rest is None else rotated - rest)


class SteeringHooks:
    """The hooks of one model runner: a per-step plan and its application at each decoder layer; the gates its
    requests' conditions decided (by nonce and gate name) and those being read."""

    def __init__(self, runner: Any, num_layers: int) -> None:
        self.runner = runner
        self.num_layers = num_layers
        self.plan: list[Steer] = []
        self.at: dict[tuple[int, str], list[Steer]] = {}  # the plan by (layer, site): what each layer hook reads
        self.composition: Composition | None = None  # the last batch's, reused while its specs stay the same
        self.specs: tuple[Spec, ...] = ()
        self.steps = 0  # forwards that steered at least one token (for tests and logs)
        self.no_attention: set[int] = set()  # layers without an attention module found (no `attention` site)
        self.no_heads: set[int] = set()  # layers without an attention output projection (no `heads` site)
        self.decided: collections.OrderedDict[tuple[str, str], bool] = collections.OrderedDict()
        self.pending: collections.OrderedDict[tuple[str, str], tuple[torch.Tensor, torch.Tensor]] = (
            collections.OrderedDict()
        )
        self.gate_names: list[tuple[str, str]] = []  # the composition's gate keys as (nonce or request id, gate)

    def before_model(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.plan, self.at = [], {}
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        num_reqs = int(self.runner.input_batch.num_reqs)
        if positions is None or num_reqs == 0:
            return
        states = self.runner.requests
        specs = tuple(
            request_spec(getattr(getattr(states.get(r), "sampling_params", None), "extra_args", None))
            for r in self.runner.input_batch.req_ids[:num_reqs]
        )
        if specs != self.specs or self.composition is None:
            self.composition, self.specs = Composition(specs, self.num_layers), specs
            req_ids = self.runner.input_batch.req_ids[:num_reqs]
            self.gate_names = [(specs[r][2] or str(req_ids[r]), g) for r, g in self.composition.gate_keys]
        if not self.composition:
            return
        gates = None
        if self.gate_names:
            gates = torch.tensor([int(self.decided.get(name, -1)) for name in self.gate_names], dtype=torch.int8)
        bounds = np.minimum(self.runner.query_start_loc.np[: num_reqs + 1], positions.shape[-1]).astype(np.int64)
        self.plan = self.composition.plan(bounds[:-1], bounds[1:], positions, gates)
        for steer in self.plan:
            for site, missing, module in (
                ("attention", self.no_attention, "attention module (self_attn)"),
                ("heads", self.no_heads, "attention output projection (o_proj)"),
            ):
                if steer.site == site and steer.layer in missing:
                    raise RuntimeError(
                        f"steer_hydra steering: decoder layer {steer.layer} has no {module} to edit at site "
                        f"{site!r}. Fix: run this control on backend=huggingface."
                    )
            self.at.setdefault((steer.layer, steer.site), []).append(steer)
        self.steps += bool(self.plan)

    def run(self, steers: Sequence[Steer], hidden: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """`hidden` after the steers of one site, in order (a condition reads the stream as the steers before it
        leave it)."""
        for steer in steers:
            if steer.op == "condition":
                self.read_condition(steer, hidden, residual)
            else:
                hidden = steer.apply(hidden, residual)
        return hidden

    def read_condition(self, steer: Steer, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        """Add the stream at a condition's prompt positions to its gate's running sum (each position once), and
        decide the gates whose prompt has now been read whole."""
        index = steer.index.to(hidden.device)
        stream = hidden.index_select(0, index)
        if residual is not None:
            stream = stream + residual.index_select(0, index)
        stream = stream.to(device="cpu", dtype=torch.float64)
        keys, offsets = steer.keys, steer.offsets
        for key in keys.unique().tolist():
            chosen = (keys == key).nonzero().squeeze(1)
            name = self.gate_names[key]
            condition, prompt_length = self.composition.gate_info[key]
            sums, seen = self.pending.pop(name, None) or (
                torch.zeros(stream.shape[-1], dtype=torch.float64),
                torch.zeros(prompt_length, dtype=torch.bool),
            )
            positions = offsets[chosen]
            unique, inverse = torch.unique(positions, return_inverse=True)
            first = torch.full((unique.numel(),), positions.numel()).scatter_reduce(
                0, inverse, torch.arange(positions.numel()), "amin"
            )
            fresh = ~seen[unique]
            sums = sums + stream[chosen[first[fresh]]].sum(0)
            seen[unique[fresh]] = True
            if bool(seen.all()):
                similarity = condition_similarity(sums / prompt_length, condition.rows[0].double())
                self.decided[name] = bool(gate_open(similarity, condition.threshold, condition.comparison))
                while len(self.decided) > _DECISIONS_KEPT:
                    self.decided.popitem(last=False)
            else:
                self.pending[name] = (sums, seen)
                while len(self.pending) > _PENDING_KEPT:
                    self.pending.popitem(last=False)

    def before_layer(self, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        steers = self.at.get((layer, "input"))
        if not steers:
            return None
        args = list(args)
        hidden = args[1] if len(args) > 1 else kwargs["hidden_states"]
        residual = args[2] if len(args) > 2 else kwargs.get("residual")
        hidden = self.run(steers, hidden, residual)
        if len(args) > 1:
            args[1] = hidden
        else:
            kwargs["hidden_states"] = hidden
        return tuple(args), kwargs

    def after_layer(self, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        steers = self.at.get((layer, "output"))
        if not steers:
            return None
        hidden, residual = (output[0], output[1]) if isinstance(output, tuple) else (output, None)
        hidden = self.run(steers, hidden, residual)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    def after_attention(self, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
        steers = self.at.get((layer, "attention"))
        if not steers:
            return None
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = self.run(steers, hidden, None)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    def before_heads(self, layer: int, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        steers = self.at.get((layer, "heads"))
        if not steers:
            return None
        if args:
            return (self.run(steers, args[0], None), *args[1:]), kwargs
        key = next(iter(kwargs))
        return args, {**kwargs, key: self.run(steers, kwargs[key], None)}


def decoder_layers(model: torch.nn.Module, expected: int | None) -> torch.nn.ModuleList:
    """The model's decoder-layer list: the longest `ModuleList` named `...layers` (of `expected` length if known)."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] in ("layers", "h", "blocks")
    ]
    if expected is not None:
        found = [(n, m) for n, m in found if len(m) == expected] or found
    if not found:
        raise ValueError(f"No decoder-layer ModuleList found in {type(model).__name__}; steering cannot install.")
    return max(found, key=lambda item: len(item[1]))[1]


def attention_module(layer: torch.nn.Module) -> torch.nn.Module | None:
    """A decoder layer's attention block (`self_attn` in vLLM's Llama-family layers), None when it has none."""
    for name in ("self_attn", "attn", "attention"):
        module = getattr(layer, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def output_projection(attention: torch.nn.Module) -> torch.nn.Module | None:
    """An attention block's output projection (`o_proj` in vLLM's Llama-family attention), whose input holds the
    heads' outputs side by side; None when it has none."""
    for name in ("o_proj", "out_proj", "dense", "c_proj", "wo"):
        module = getattr(attention, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


def install(runner: Any) -> SteeringHooks | None:
    """Put the steering hooks on the runner's model (eager mode) once; returns them (also kept on the model).

    Returns None, hooking nothing, for a runner without the V1 persistent batch this reads.
    """
    missing = [name for name in ("input_batch", "query_start_loc", "requests") if not hasattr(runner, name)]
    if missing:  # another model runner (e.g. vLLM's V2): leave it alone; the client's probe reports no steering
        logger.warning(
            "steer_hydra steering: %s has no %s (vLLM's V2 model runner?); steering is off. Fix: start the engine "
            "with %s=0.",
            type(runner).__name__,
            missing,
            RUNNER_ENV,
        )
        return None
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    existing = getattr(model, _MARK, None)
    if existing is not None:  # hooked already (a reload): follow the current runner
        existing.runner = runner
        return existing
    config = getattr(getattr(runner, "model_config", None), "hf_text_config", None)
    layers = decoder_layers(model, getattr(config, "num_hidden_layers", None))
    hooks = SteeringHooks(runner, len(layers))
    model.register_forward_pre_hook(hooks.before_model, with_kwargs=True)
    for index, layer in enumerate(layers):
        layer.register_forward_pre_hook(functools.partial(hooks.before_layer, index), with_kwargs=True)
        layer.register_forward_hook(functools.partial(hooks.after_layer, index), with_kwargs=True)
        attention = attention_module(layer)
        if attention is not None:
            attention.register_forward_hook(functools.partial(hooks.after_attention, index), with_kwargs=True)
        else:
            hooks.no_attention.add(index)
        projection = output_projection(attention) if attention is not None else None
        if projection is not None:
            projection.register_forward_pre_hook(functools.partial(hooks.before_heads, index), with_kwargs=True)
        else:
            hooks.no_heads.add(index)
    setattr(model, _MARK, hooks)
    logger.info("steer_hydra steering hooks on %d decoder layers of %s", len(layers), type(model).__name__)
    return hooks
