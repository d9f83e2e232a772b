"""Resume from the logs, for real: SIGKILL mid-run and re-run; more trials; a 2 x 2 smoke study end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from steer_hydra.analysis import plotting
from steer_hydra.analysis.frames import summarize_runs
from steer_hydra.analysis.logs import results_from_logs
from steer_hydra.analysis.stats import paired_deltas
from steer_hydra.controls.input import SystemPrompt
from steer_hydra.core import ModelSource
from steer_hydra.core.identity import derive_trial_seed
from steer_hydra.evaluation.provider import ProviderOptions, SteeringPipelineModelAPI
from steer_hydra.evaluation.runner import SteeringEval
from steer_hydra.evaluation.suite import InspectSuite
from steer_hydra.models import TINY_REF
from steer_hydra.tasks import smoke_suite

pytestmark = pytest.mark.slow

N_SAMPLES = 10

# The evaluation a user would re-run after a crash. Every generated prompt is appended to a counter file as soon
# as it is generated; a short sleep after each generation (with one sample in flight at a time) leaves time to
# kill the process while samples are still being generated.
JOB = textwrap.dedent(
    """
    import json, sys, threading, time
    from steer_hydra.core.pipeline import SteeringPipeline

    save_dir, limit, counter, delay = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    generate, lock = SteeringPipeline.generate, threading.Lock()

    def counting(self, *args, **kwargs):
        out = generate(self, *args, **kwargs)
        chats = kwargs.get("messages")
        chats = [chats] if chats and isinstance(chats[0], dict) else chats or []
        with lock, open(counter, "a") as f:
            for chat in chats:
                f.write(json.dumps(chat[-1]["content"]) + "\\n")
        time.sleep(delay)
        return out

    SteeringPipeline.generate = counting

    from steer_hydra.core import ModelSource
    from steer_hydra.evaluation.provider import ProviderOptions
    from steer_hydra.evaluation.runner import SteeringEval
    from steer_hydra.evaluation.suite import InspectSuite

    suite = InspectSuite(name="qa", tasks=("steer_hydra/short_answer",), limit=limit,
                         generate_overrides={"temperature": 0, "max_tokens": 8})
    source = ModelSource("steer_hydra:tiny", device_map=None)
    SteeringEval({"baseline": []}, source, [suite], save_dir=save_dir, progress=False,
                 provider_options=ProviderOptions(max_batch_size=1), generate_defaults={"log_buffer": 1}).run()
    """
)


def _qa_eval(save_dir: Path) -> SteeringEval:
    """The same evaluation as JOB, in this process (no delay, no counting)."""
    suite = InspectSuite(
        name="qa",
        tasks=("steer_hydra/short_answer",),
        limit=N_SAMPLES,
        generate_overrides={"temperature": 0, "max_tokens": 8},
    )
    return SteeringEval(
        {"baseline": []},
        ModelSource(TINY_REF, device_map=None),
        [suite],
        save_dir=save_dir,
        progress=False,
        provider_options=ProviderOptions(max_batch_size=1),
        generate_defaults={"log_buffer": 1},
    )


def _lines(path: Path) -> list[str]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _logged_samples(log_dir: Path) -> list:
    from inspect_ai.log import read_eval_log

    for path in log_dir.glob("*.eval"):
        try:
            return list(read_eval_log(str(path)).samples or [])
        except Exception:  # the file is being written; try again
            return []
    return []


def test_sigkill_then_rerun_completes_only_missing_samples(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    save = tmp_path / "save"
    log_dir = save / "inspect_logs" / "baseline" / "trial_0" / "qa"
    first, second = tmp_path / "generated_1.txt", tmp_path / "generated_2.txt"
    command = [sys.executable, str(script), str(save), str(N_SAMPLES)]

    process = subprocess.Popen([*command, str(first), "0.3"], cwd=tmp_path, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    try:
        while len(_logged_samples(log_dir)) < 2:
            if process.poll() is not None:
                pytest.fail(
                    f"the job exited (rc {process.returncode}) before it could be killed: "
                    f"{process.stderr.read().decode()[-2000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail("no samples were logged within 240 s")
            time.sleep(0.1)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    finished = {s.input for s in _logged_samples(log_dir)}
    assert 2 <= len(finished) < N_SAMPLES  # killed while samples were still being generated

    rerun = subprocess.run([*command, str(second), "0"], cwd=tmp_path, capture_output=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr.decode()[-3000:]

    # the final record: the success log per task, every sample exactly once (the partial log is superseded)
    frame = results_from_logs(save)
    assert frame["n"].unique().tolist() == [N_SAMPLES]
    from inspect_ai.log import read_eval_log

    final = read_eval_log(str(save / frame["log"].iloc[0]))
    assert final.status == "success"
    ids = [s.id for s in final.samples]
    assert sorted(ids) == [f"sa-{i:02d}" for i in range(1, N_SAMPLES + 1)]
    # samples finished before the kill were not generated again; the rest were generated by the re-run
    regenerated = Counter(_lines(second))
    assert not finished & set(regenerated)
    assert set(regenerated) | finished == {s.input for s in final.samples}
    assert max(regenerated.values()) == 1
    assert Counter(_lines(first))[next(iter(finished))] == 1

    # the resumed results equal a clean, uninterrupted run (greedy)
    clean = _qa_eval(tmp_path / "clean")
    clean.run()
    clean_samples = {s.id: (s.output.completion, s.scores["includes"].value) for s in _clean_samples(clean)}
    resumed_samples = {s.id: (s.output.completion, s.scores["includes"].value) for s in final.samples}
    assert resumed_samples == clean_samples
    clean_metrics = clean.results().set_index(["scorer", "metric"])["value"].to_dict()
    assert frame.set_index(["scorer", "metric"])["value"].to_dict() == clean_metrics


def _clean_samples(ev: SteeringEval) -> list:
    from inspect_ai.log import read_eval_log

    log = ev.results()["log"].iloc[0]
    return list(read_eval_log(str(ev._log_root / log)).samples)


# ------------------------------------------------------------------------------------------ 2 configs x 2 trials
@pytest.fixture(scope="module")
def smoke_study(tmp_path_factory):
    """The smoke suite on two configurations: one trial, then two trials into the same save_dir, then again."""
    save = tmp_path_factory.mktemp("smoke_study")
    prompts: list[str] = []
    lock = threading.Lock()
    original = SteeringPipelineModelAPI._generate  # every request Inspect makes, whatever the batching

    async def counting(self, input, *args, **kwargs):
        with lock:
            prompts.append(input[-1].text)
        return await original(self, input, *args, **kwargs)

    def study(num_trials: int) -> tuple[SteeringEval, int]:
        before = len(prompts)
        ev = SteeringEval(
            {"baseline": [], "brief": [SystemPrompt(text="Answer briefly.")]},
            ModelSource(TINY_REF, device_map=None),
            [smoke_suite(limit=4)],
            num_trials=num_trials,
            seed=0,
            save_dir=save,
            progress=False,
        )
        ev.run()
        return ev, len(prompts) - before

    SteeringPipelineModelAPI._generate = counting
    try:
        _, one_trial = study(1)
        trial_0_logs = sorted(p.name for p in save.glob("inspect_logs/*/trial_0/smoke/*.eval"))
        two, added = study(2)
        _, again = study(2)
    finally:
        SteeringPipelineModelAPI._generate = original
    return {
        "save": save,
        "one_trial": one_trial,
        "added": added,
        "again": again,
        "eval": two,
        "trial_0_logs": trial_0_logs,
    }


def test_more_trials_generate_only_the_new_trials_samples(smoke_study):
    n_tasks, limit, n_configs = 3, 4, 2
    assert smoke_study["one_trial"] == n_configs * n_tasks * limit
    assert smoke_study["added"] == smoke_study["one_trial"]  # only trial 1 was generated
    assert smoke_study["again"] == 0  # a complete save_dir makes no model calls
    save = smoke_study["save"]
    assert sorted(p.name for p in save.glob("inspect_logs/*/trial_0/smoke/*.eval")) == smoke_study["trial_0_logs"]


def test_two_configs_two_trials_smoke_frames_and_plots(smoke_study, tmp_path):
    ev = smoke_study["eval"]
    results = ev.results()
    assert len(results) == 2 * 2 * 3 * 2  # configs x trials x tasks x (accuracy, stderr)
    assert set(results["task"]) == {"steer_hydra/short_answer", "steer_hydra/mcqa", "steer_hydra/instruction_following"}
    assert results["n"].unique().tolist() == [4]

    runs = ev.runs_frame(["accuracy"], task="steer_hydra/mcqa")
    assert runs[["arm", "trial_id", "seed"]].values.tolist() == [
        ["baseline", 0, 0],
        ["baseline", 1, 0],
        ["brief", 0, 0],
        ["brief", 1, 0],
    ]
    assert runs["trial_seed"].tolist() == [
        derive_trial_seed(0, c, t) for c, t in runs[["config_id", "trial_id"]].values
    ]
    summary = summarize_runs(runs, ["accuracy"])
    assert summary["n_trials"].tolist() == [2, 2]

    samples = ev.samples_frame(
        ["instruction_checker"], task="steer_hydra/instruction_following", metadata_keys=["check"], include_text=True
    )
    assert len(samples) == 2 * 2 * 4
    assert samples["completion"].map(lambda c: isinstance(c, str)).all()
    deltas = paired_deltas(samples, "instruction_checker")
    assert deltas[["arm", "n", "n_trials", "n_trials_baseline"]].values.tolist() == [["brief", 4, 2, 2]]
    assert deltas["ci_low"].iloc[0] <= deltas["delta"].iloc[0] <= deltas["ci_high"].iloc[0]
    assert 0.0 <= deltas["changed"].iloc[0] <= 1.0  # the completions are there: the changed share is known

    # the record on disk alone gives the same results frame (success logs only)
    # (the save_dir holds no configuration records, written by the app's jobs: the arms are named here)
    names = {"baseline": "baseline", results.loc[results.arm == "brief", "config_id"].iloc[0]: "brief"}
    rebuilt = results_from_logs(smoke_study["save"], names, seed=0)
    key = ["arm", "config_id", "trial_id", "task", "scorer", "metric"]
    compared = [*key, "seed", "trial_seed", "value", "n", "log"]
    assert rebuilt.sort_values(key)[compared].values.tolist() == results.sort_values(key)[compared].values.tolist()

    import matplotlib

    matplotlib.use("Agg")
    plotting.plot_metric_by_config(
        summary,
        "accuracy",
        x_col="arm",
        baseline_value=summary.accuracy_mean[0],
        save_path=tmp_path / "by_config.png",
    )
    plotting.plot_paired_deltas(deltas, save_path=tmp_path / "deltas.png")
    capability = summarize_runs(ev.runs_frame(["accuracy"], task="steer_hydra/short_answer"), ["accuracy"])
    target = summarize_runs(ev.runs_frame(["accuracy"], task="steer_hydra/instruction_following"), ["accuracy"])
    tradeoff = capability.merge(target, on=["arm", "config_id"], suffixes=("", "_t")).rename(
        columns={
            "accuracy_mean": "capability_mean",
            "accuracy_std": "capability_std",
            "accuracy_mean_t": "target_mean",
            "accuracy_std_t": "target_std",
        }
    )
    plotting.plot_tradeoff_scatter(
        tradeoff, "capability", "target", label_col="arm", show_pareto=True, save_path=tmp_path / "tradeoff.png"
    )
    for name in ("by_config", "deltas", "tradeoff"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0
    import matplotlib.pyplot as plt

    plt.close("all")
