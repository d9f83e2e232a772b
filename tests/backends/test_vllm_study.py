"""The concept study on real vLLM: one launched server runs the study's cells two at a time (the joblib launcher),
its CAA vectors fitted on Hugging Face and sent as given vectors, and reports what `backend=vllm` reports running
the cells one after another on one engine: the same completions, the same choice on dev and the same study results.
Both fit every vector ahead, on one Hugging Face load, before the server or the engine starts.

Both studies run at once, on the tiny head-dim-64 model in float32, greedy, in subprocesses (offline, logger=none).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from vllm_real import TINY64, finish_sweep, start_sweep

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]
STUDY_TIMEOUT_S = 1200
STUDY = [
    "experiment=concept_steering",
    "model=tiny",
    f"model.model_name_or_path='{TINY64}'",
    "+model.hf_model_kwargs.dtype=float32",
    "hydra.sweeper.arms=[baseline,caa_concept,caa_concept_negated]",
    "hydra.sweeper.attention_methods=[]",  # PASTA runs on Hugging Face only
    "hydra.sweeper.strengths=[0.6,1.2]",
    "concept=weddings,joy",
    "suite.limit=3",
    "suite.generate_overrides.max_tokens=8",
    "progress=false",
    "logger=none",
]
SERVED = [
    "backend=vllm_serve",
    "backend.options.launch=true",
    "backend.options.launch_args=[--max-model-len,512]",
    "hydra/launcher=server_cells",  # joblib: jobs side by side, their requests in the server's engine steps together
    "hydra.launcher.n_jobs=2",
]
ENGINE = ["backend=vllm", "backend.options.max_model_len=512"]
KEY = ["arm", "config_id", "suite", "task", "sample_id", "scorer"]


def _finish(process: subprocess.Popen, cwd: Path) -> tuple[str, Path]:
    out = finish_sweep(process, cwd, STUDY_TIMEOUT_S)
    assert process.returncode == 0, out[-4000:]
    (sweep,) = (cwd / "outputs" / "concept_steering" / "multiruns").iterdir()
    return out, sweep


def test_a_study_on_one_launched_server_two_cells_at_a_time_reports_what_the_engine_reports(tmp_path):
    # each its own cache: each fits its vectors ahead (a shared one would leave the later study nothing to fit)
    served = start_sweep(tmp_path / "serve", [*STUDY, *SERVED], STEER_HYDRA_CACHE=str(tmp_path / "serve-cache"))
    engine = start_sweep(tmp_path / "engine", [*STUDY, *ENGINE], STEER_HYDRA_CACHE=str(tmp_path / "engine-cache"))
    try:
        out_served, sweep_served = _finish(served, tmp_path / "serve")
        out_engine, sweep_engine = _finish(engine, tmp_path / "engine")
    finally:  # a failed study leaves neither running
        for process in (served, engine):
            if process.poll() is None:
                os.killpg(process.pid, 9)

    assert out_served.count(" ready at ") == 1  # one server for the whole study, both phases
    fitted = re.compile(r"Built ahead of the jobs in [0-9.]+ s: 2 in vectors/$", re.MULTILINE)
    for out in (out_served, out_engine):  # both concepts' CAA vectors (one per concept: the layer is not swept)
        assert out.count("Fitting ") == 1 and fitted.search(out), out[-4000:]
    assert fitted.search(out_served).start() < out_served.index(" ready at ")  # before the server
    assert out_engine.count("Booting vLLM engine") == 1  # one engine for the study: no restart to fit a vector
    records = [json.loads(p.read_text()) for p in sweep_served.glob("*/job_record.json")]
    assert len({r["placement"]["pid"] for r in records}) == 2  # the jobs ran in joblib's two worker processes
    launched = pd.read_csv(sweep_served / "study" / "launched.csv")
    assert len(launched) == 2 * (3 + 3 * 2)  # per concept: dev (the baseline, CAA at 2 strengths), 3 arms x 2 suites
    samples = pd.read_csv(sweep_served / "aggregate" / "samples.csv").sort_values(KEY, ignore_index=True)
    expected = pd.read_csv(sweep_engine / "aggregate" / "samples.csv").sort_values(KEY, ignore_index=True)
    assert len(samples) == len(expected) > 0 and samples[KEY].equals(expected[KEY])
    differ = samples[samples["completion"] != expected["completion"]]
    assert differ.empty, differ[[*KEY, "completion"]].to_string()
    on_test = samples[samples["suite"].str.startswith("concept_steering_test")]
    on_test = on_test.assign(arm=on_test["arm"].str.split("@").str[0])  # `caa_concept@<config_id>`: the point
    by_arm = on_test.pivot_table(index=["suite", "sample_id"], columns="arm", values="completion", aggfunc="first")
    assert (by_arm["baseline"] != by_arm["caa_concept"]).any()  # the fitted vectors reached the server
    for name in ("selection.csv", "study_results.csv", "study_summary.csv"):
        assert (sweep_served / "study" / name).read_text() == (sweep_engine / "study" / name).read_text(), name
