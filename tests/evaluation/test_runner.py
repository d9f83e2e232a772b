"""SteeringEval.run: validation, preflight, protocol warnings, loop nesting, seeds, logs, records, failure."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import warnings
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

import steer_hydra.evaluation.runner as runner_module
from steer_hydra.controls.input import FewShot, SystemPrompt
from steer_hydra.core import InputControl, ModelSource
from steer_hydra.core.identity import derive_trial_seed
from steer_hydra.core.specs import ControlSpec
from steer_hydra.evaluation.provider import ProviderOptions
from steer_hydra.evaluation.runner import SteeringEval, UnsupportedConfigurationError
from steer_hydra.models import TINY_REF


class Picky(InputControl):
    supports_batching = True

    def constraint_failures(self, backend_kind, hf_model_kwargs):
        return ["needs attn_implementation='eager'. Fix: pass hf_model_kwargs={'attn_implementation': 'eager'}."]


class Declares(InputControl):
    RUNTIME_KWARGS_SCHEMA = [{"name": "substrings", "type": "list", "scope": "row"}]
    supports_batching = True


class Counting(InputControl):
    supports_batching = True
    cleanups = 0

    def cleanup(self):
        type(self).cleanups += 1


class FakeSuite:
    """Duck-typed InspectSuite: records run() calls and returns one task's metrics."""

    def __init__(self, name="capability", generate_overrides=None, fail=False, events=None):
        self.name = name
        self.generate_overrides = dict(generate_overrides or {})
        self.fail = fail
        self.calls = []
        self.events = events if events is not None else []

    def identity(self, content_digests=None):
        return {"name": self.name, "generate_overrides": self.generate_overrides}

    def run(self, pipeline, *, log_dir, options, trial_seed, model_name, generate_defaults, display, **labels):
        self.calls.append(
            SimpleNamespace(
                pipeline=pipeline,
                log_dir=Path(log_dir),
                options=options,
                trial_seed=trial_seed,
                model_name=model_name,
                generate_defaults=generate_defaults,
                display=display,
                labels=labels,
            )
        )
        self.events.append(("run", self.name, model_name, trial_seed))
        if self.fail:
            raise RuntimeError("Inspect eval_set failed for task(s): one (logs under somewhere)")
        return {"one": {"metrics": {"acc/accuracy": 0.5, "acc/stderr": 0.1}, "n": 3, "log": "one.eval"}}


@pytest.fixture
def fake_factory(monkeypatch):
    """Replace PipelineFactory: records construction, steered() nesting and release()."""
    state = SimpleNamespace(instances=[], events=[], active=0, max_active=0, pipelines=[], released=0)

    class FakeFactory:
        backend_kind = "huggingface"
        shared_base_fingerprint = "f" * 16
        residency = "loaded"

        def __init__(self, base, **kwargs):
            state.instances.append((base, kwargs))

        def uses_shared_base(self, controls):
            return True

        @contextlib.contextmanager
        def steered(self, controls):
            state.active += 1
            state.max_active = max(state.max_active, state.active)
            pipeline = SimpleNamespace(
                controls=list(controls),
                tokenizer=SimpleNamespace(chat_template="t"),
                model=None,
                supports_batching=all(c.supports_batching for c in controls),
            )
            state.pipelines.append(pipeline)
            state.events.append(("enter", len(state.pipelines)))
            try:
                yield pipeline
            finally:
                state.active -= 1
                state.events.append(("exit", len(state.pipelines)))

        def release(self):
            state.released += 1

    monkeypatch.setattr(runner_module, "PipelineFactory", FakeFactory)
    return state


def _eval(tmp_path, pipelines=None, suites=None, **kwargs):
    kwargs.setdefault("progress", False)
    kwargs.setdefault("save_dir", tmp_path / "save")
    return SteeringEval(
        pipelines if pipelines is not None else {"baseline": []}, TINY_REF, suites or [FakeSuite()], **kwargs
    )


# ------------------------------------------------------------------------------------------ 97 constructor
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"pipelines": [[]]}, TypeError, "dict"),
        ({"num_trials": 0}, ValueError, "num_trials"),
        ({"on_unsupported": "ignore"}, ValueError, "on_unsupported"),
        ({"suites": []}, ValueError, "suites"),
        ({"suites": [FakeSuite("a"), FakeSuite("a")]}, ValueError, "distinct"),
    ],
)
def test_constructor_errors(kwargs, error, match, tmp_path):
    pipelines = kwargs.pop("pipelines", {"baseline": []})
    suites = kwargs.pop("suites", [FakeSuite()])
    with pytest.raises(error, match=match):
        SteeringEval(pipelines, TINY_REF, suites, **kwargs)


def test_arguments_become_attributes(tmp_path):
    ev = _eval(tmp_path, num_trials=2, seed=3, display="plain")
    assert (ev.num_trials, ev.seed, ev.display, ev.on_unsupported) == (2, 3, "plain", "raise")
    assert ev._results is None and ev._log_root is None


# ------------------------------------------------------------------------------------------ 98-99 preflight
def test_unsupported_configurations_raise_before_any_model_work(fake_factory, tmp_path):
    suite = FakeSuite()
    ev = _eval(tmp_path, {"baseline": [], "bad": [Picky()], "bad2": [Picky()]}, [suite])
    with pytest.raises(UnsupportedConfigurationError, match="Unsupported pipeline configuration") as info:
        ev.run()
    assert str(info.value).count("Picky") == 2
    assert fake_factory.instances == [] and suite.calls == []


def test_skip_warns_and_runs_the_others(fake_factory, tmp_path, caplog):
    suite = FakeSuite()
    ev = _eval(tmp_path, {"baseline": [], "bad": [Picky()]}, [suite], on_unsupported="skip")
    with caplog.at_level(logging.WARNING, logger="steer_hydra.evaluation.runner"):
        results = ev.run()
    assert "Skipping unsupported configuration: bad" in caplog.text
    assert results["bad"] == [] and len(results["baseline"]) == 1
    assert [c.model_name for c in suite.calls] == ["baseline"]


# ------------------------------------------------------------------------------------------ 100-101 warnings
def test_seed_without_temperature_warns(fake_factory, tmp_path):
    with pytest.warns(UserWarning, match="temperature"):
        _eval(tmp_path, seed=1).run()


@pytest.mark.parametrize(("defaults", "overrides"), [({"temperature": 0}, {}), ({}, {"temperature": 0.7})])
def test_an_explicit_temperature_silences_the_seed_warning(fake_factory, tmp_path, defaults, overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _eval(tmp_path, suites=[FakeSuite(generate_overrides=overrides)], seed=1, generate_defaults=defaults).run()


def test_a_static_kwarg_no_arm_declares_is_reported_inert(fake_factory, tmp_path):
    options = ProviderOptions(runtime_kwargs={"substrings": ["x"]})
    with pytest.warns(UserWarning, match="inert on every arm"):
        _eval(tmp_path, {"baseline": [], "sys": [SystemPrompt(text="x")]}, provider_options=options).run()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _eval(tmp_path, {"baseline": [], "d": [Declares()]}, provider_options=options).run()


# ------------------------------------------------------------------------------------------ 102 save_dir
def test_save_dir_is_created_with_parents(fake_factory, tmp_path):
    target = tmp_path / "a" / "b" / "c"
    _eval(tmp_path, save_dir=target).run()
    assert target.is_dir()


def test_without_save_dir_logs_go_to_a_temporary_dir(fake_factory, tmp_path, caplog):
    ev = _eval(tmp_path, save_dir=None)
    with caplog.at_level(logging.INFO, logger="steer_hydra.evaluation.runner"):
        ev.run()
    assert ev._log_root.name.startswith("steering-eval-")
    assert "not resumable" in caplog.text


# ------------------------------------------------------------------------------------------ 103-110 the loop
def test_loop_nesting_seeds_log_dirs_and_forwarded_arguments(fake_factory, tmp_path):
    events = []
    cap, tgt = FakeSuite("capability", events=events), FakeSuite("target", events=events)
    options = ProviderOptions(max_batch_size=2)
    ev = _eval(
        tmp_path,
        {"baseline": [], "sys": [SystemPrompt(text="x")]},
        [cap, tgt],
        num_trials=2,
        seed=5,
        provider_options=options,
        generate_defaults={"temperature": 0},
    )
    results = ev.run()
    sys_id = results["sys"][0]["config_id"]
    labels = {"baseline": "baseline", sys_id: f"systemprompt@{sys_id[:6]}"}  # the model name in the logs
    expected = [
        (labels[config], suite, derive_trial_seed(5, config, trial))
        for config in ("baseline", sys_id)
        for trial in (0, 1)
        for suite in ("capability", "target")
    ]
    assert [(e[2], e[1], e[3]) for e in events] == expected
    # one pipeline per configuration, built one at a time
    assert fake_factory.events == [("enter", 1), ("exit", 1), ("enter", 2), ("exit", 2)]
    assert fake_factory.max_active == 1
    assert fake_factory.pipelines[0] is not fake_factory.pipelines[1]
    assert {id(c.pipeline) for c in cap.calls} == {id(p) for p in fake_factory.pipelines}
    assert fake_factory.released == 1
    save = (tmp_path / "save").absolute()
    assert cap.calls[1].log_dir == save / "inspect_logs" / "baseline" / "trial_1" / "capability"
    assert all(c.options is options and c.generate_defaults == {"temperature": 0} for c in cap.calls + tgt.calls)
    assert all(c.display == "none" for c in cap.calls)  # 109: the default display is forwarded
    # the log labels name the arm, its config_id and the trial_id
    assert cap.calls[3].labels["tags"] == ["sys", sys_id]
    metadata = cap.calls[3].labels["metadata"]
    assert (metadata["arm"], metadata["config_id"], metadata["trial_id"]) == ("sys", sys_id, 1)
    assert "trial" not in metadata
    assert results["baseline"][1]["suites"]["capability"]["one"]["log"] == (
        "inspect_logs/baseline/trial_1/capability/one.eval"
    )
    # 105: first 4 bytes, big-endian, of sha256("seed:config_id:trial_id"); 2 configs x 2 trials: 4 distinct trial
    # seeds, each handed to its suites; every record keeps the launch seed
    trial_seeds = [r["trial_seed"] for name in results for r in results[name]]
    assert len(set(trial_seeds)) == 4
    assert [c.trial_seed for c in cap.calls] == trial_seeds
    digest = hashlib.sha256(f"5:{sys_id}:1".encode()).digest()
    assert results["sys"][1]["trial_seed"] == int.from_bytes(digest[:4], "big")
    assert [r["seed"] for name in results for r in results[name]] == [5, 5, 5, 5]
    assert [(r["config_id"], r["trial_id"]) for r in results["sys"]] == [(sys_id, 0), (sys_id, 1)]


def test_unseeded_runs_pass_no_seed(fake_factory, tmp_path):
    suite = FakeSuite()
    results = _eval(tmp_path, suites=[suite], num_trials=2).run()
    assert [c.trial_seed for c in suite.calls] == [None, None]
    assert [(r["seed"], r["trial_seed"]) for r in results["baseline"]] == [(None, None), (None, None)]


def test_display_is_forwarded(fake_factory, tmp_path):
    suite = FakeSuite()
    _eval(tmp_path, suites=[suite], display="plain").run()
    assert suite.calls[0].display == "plain"


def test_config_ids_and_run_records(fake_factory, tmp_path):
    spec = ControlSpec(SystemPrompt, params={"mode": "append"}, vars={"text": ["a", "b"]}, name="sp")
    results = _eval(
        tmp_path,
        {"baseline": [], "fixed": [SystemPrompt(text="x")], "sweep": [spec]},
        seed=1,
        generate_defaults={"temperature": 0},
    ).run()
    assert results["baseline"][0]["config_id"] == "baseline"
    ids = [r["config_id"] for r in results["fixed"] + results["sweep"]]
    assert all(re.fullmatch(r"[0-9a-f]{12}", i) for i in ids) and len(set(ids)) == 3
    record = results["sweep"][1]
    assert set(record) == {"config_id", "trial_id", "seed", "trial_seed", "params", "suites", "provenance"}
    assert (record["seed"], record["trial_seed"]) == (1, derive_trial_seed(1, record["config_id"], 0))
    assert results["baseline"][0]["params"] == {} and results["fixed"][0]["params"] == {}
    assert record["params"] == {"sp": {"mode": "append", "text": "b"}}
    assert record["suites"]["capability"]["one"]["metrics"] == {"acc/accuracy": 0.5, "acc/stderr": 0.1}
    prov = record["provenance"]
    for key in (
        "toolkit_version",
        "inspect_ai_version",
        "inspect_evals_version",
        "backend",
        "prompt_path",
        "shared_base_fingerprint",
        "recorded_utc",
        "model_fingerprint",
    ):
        assert key in prov
    assert not {"base_seed", "seed", "trial_seed"} & set(prov)  # the record holds the seeds, once
    assert prov["toolkit_version"] and prov["inspect_ai_version"]
    assert prov["backend"] == "huggingface" and prov["prompt_path"] == "messages"
    assert prov["shared_base_fingerprint"] == "f" * 16
    assert datetime.fromisoformat(prov["recorded_utc"]).utcoffset().total_seconds() == 0
    assert prov["batch_ceiling"] == 8 and prov["declared_runtime_kwargs"] == {}
    assert prov["steering_vector_hashes"] == {}


def test_provenance_names_batch_ceiling_inert_static_kwargs_and_vectors(fake_factory, tmp_path):
    class ActAdd(InputControl):  # a stand-in: a non-batching control with a (fitted) vector
        vector_hash = "0123456789abcdef"

    actadd = ActAdd()
    options = ProviderOptions(max_batch_size=4, runtime_kwargs={"substrings": ["x"], "positive_examples": []})
    with pytest.warns(UserWarning, match=r"\['substrings'\] .* inert on every arm"):
        results = _eval(tmp_path, {"actadd": [actadd], "few": [FewShot()]}, provider_options=options).run()
    act, few = results["actadd"][0]["provenance"], results["few"][0]["provenance"]
    assert act["batch_ceiling"] == 1 and few["batch_ceiling"] == 4
    assert act["inert_static_runtime_kwargs"] == ["positive_examples", "substrings"]
    assert few["inert_static_runtime_kwargs"] == ["substrings"]
    assert few["declared_runtime_kwargs"] == {"positive_examples": "call", "negative_examples": "call"}
    assert act["steering_vector_hashes"] == {"ActAdd[0]": "0123456789abcdef"}


def test_summary_and_cell_lines_and_progress_bar(fake_factory, tmp_path, caplog, monkeypatch):
    import steer_hydra.evaluation.progress as progress_module

    bars = []
    real_tqdm = progress_module.tqdm

    def spy(*args, **kwargs):
        bars.append(kwargs)
        return real_tqdm(*args, **kwargs)

    monkeypatch.setattr(progress_module, "tqdm", spy)
    ev = _eval(tmp_path, {"baseline": [], "sys": [SystemPrompt(text="x")]}, num_trials=2)
    with caplog.at_level(logging.INFO, logger="steer_hydra.evaluation.runner"):
        ev.run()
    assert "Evaluating 2 configuration(s) x 2 trial(s) x 1 suite(s) = 4 cell(s)" in caplog.text
    assert [f"Cell {i}/4" in caplog.text for i in range(1, 5)] == [True] * 4
    assert bars == []  # progress=False: no bar at all
    _eval(tmp_path, progress=True).run()
    assert len(bars) == 1 and bars[0]["unit"] == "sample"


def test_the_callers_log_level_survives_inspect(fake_factory, tmp_path):
    class Lowering(FakeSuite):
        def run(self, *args, **kwargs):
            logging.getLogger().setLevel(logging.WARNING)  # what Inspect's first eval does
            return super().run(*args, **kwargs)

    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    try:
        _eval(tmp_path, suites=[Lowering()]).run()
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)


# ------------------------------------------------------------------------------------------ 111 failure
def test_a_failing_suite_releases_everything_and_leaves_no_results(tmp_path, monkeypatch):
    import gc

    monkeypatch.setattr(gc, "collect", lambda *a: 0)
    releases = []
    original = runner_module.PipelineFactory.release

    def spy(self):
        releases.append(self)
        return original(self)

    monkeypatch.setattr(runner_module.PipelineFactory, "release", spy)
    Counting.cleanups = 0
    ev = SteeringEval(
        {"arm": [Counting()]},
        ModelSource(TINY_REF, device_map=None),
        [FakeSuite(fail=True)],
        progress=False,
        save_dir=tmp_path,
    )
    with pytest.raises(RuntimeError, match="eval_set failed"):
        ev.run()
    assert Counting.cleanups == 1
    assert len(releases) == 1 and releases[0]._base_model is None
    assert ev._results is None
    with pytest.raises(RuntimeError, match=r"run\(\)"):
        ev.results()


# ------------------------------------------------------------------------------------------ reuse of finished cells
def _small_eval(save_dir, **kwargs):
    from steer_hydra.evaluation.suite import InspectSuite

    suite = InspectSuite(name="s", tasks=("steer_hydra/short_answer",), limit=2, generate_overrides={"max_tokens": 4})
    kwargs.setdefault("generate_defaults", {"temperature": 0})
    return SteeringEval(
        {"baseline": [], "sys": [SystemPrompt(text="Be brief.")]},
        ModelSource(TINY_REF, device_map=None),
        [suite],
        save_dir=save_dir,
        progress=False,
        seed=3,
        **kwargs,
    )


def test_complete_cells_are_reused_without_loading_a_model(tmp_path, monkeypatch):
    claims = []
    first = _small_eval(tmp_path, before_cell=lambda *cell, pipeline: claims.append(cell)).run()
    assert sorted(claims) == [("baseline", 0, "s"), (first["sys"][0]["config_id"], 0, "s")]
    assert not any(r["provenance"]["reused"] for rs in first.values() for r in rs)

    def no_model(self, controls):
        raise AssertionError("a model was loaded for complete cells")

    monkeypatch.setattr(runner_module.PipelineFactory, "steered", no_model)
    again = _small_eval(tmp_path, before_cell=lambda *cell, pipeline: claims.append(cell))
    second = again.run()
    assert len(claims) == 2  # nothing evaluated, nothing claimed
    assert all(r["provenance"]["reused"] for rs in second.values() for r in rs)
    assert again.results().equals(SteeringEval.results(SimpleNamespace(_require_results=lambda: first)))
    changed = _small_eval(tmp_path, generate_defaults={"temperature": 0, "top_p": 0.5})  # another cell key
    with pytest.raises(AssertionError, match="a model was loaded"):
        changed.run()


def test_a_cell_with_logs_keeps_the_model_name_it_started_with(tmp_path):
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample

    from steer_hydra.evaluation.runner import _logged_model_name, model_label

    assert _logged_model_name(tmp_path / "missing") is None and _logged_model_name(tmp_path) is None
    inspect_eval(Task(dataset=[Sample(input="q", target="a")]), model="mockllm/c8fe56c3a0a1", log_dir=str(tmp_path),
                 display="none")  # fmt: skip
    assert _logged_model_name(tmp_path) == "c8fe56c3a0a1"  # resume keeps it: Inspect's task identity includes it
    assert model_label([SystemPrompt(text="x")], "c8fe56c3a0a1") == "systemprompt@c8fe56"
    assert model_label([], "baseline") == "baseline"
