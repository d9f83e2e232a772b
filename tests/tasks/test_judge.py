"""The model judge of the concept-steering task: strict rating lines, one retry, unscored as NaN (never 0), the
harmonic mean, the judge role (never the model under test) and Inspect's generate cache."""

from __future__ import annotations

import math

import pytest
from inspect_ai import Task, score
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.log import read_eval_log
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate

from steer_hydra.analysis.frames import cells_frame
from steer_hydra.analysis.logs import samples_frame
from steer_hydra.tasks.judge import (
    HARMONIC_KEY,
    JudgeNotBoundError,
    concept_judge,
    judge_harmonic,
    judge_model,
    parse_rating,
)

# per sample id: the judge's replies per criterion, in order (a second reply answers the follow-up)
SCRIPT = {
    "a": {"concept": ["It is all about weddings.\nRating: 2"], "instruction": ["Rating: 2"], "fluency": ["Rating: 2"]},
    "b": {"concept": ["Once, in passing.\nRating: 1"], "instruction": ["Rating: 2"], "fluency": ["Broken.\nRating: 0"]},
    "c": {"concept": ["I would say it is a 2.", "Rating: 2"], "instruction": ["Rating: 1"], "fluency": ["Rating: 2"]},
    "d": {"concept": ["Rating: 1"], "instruction": ["Rating: 1"], "fluency": ["Hard to say.", "Still unsure."]},
}
CRITERION_OF = {
    "how strongly it brings in": "concept",
    "answers the instruction": "instruction",
    "how fluent": "fluency",
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INSPECT_CACHE_DIR", str(tmp_path / "inspect_cache"))


def _output(text: str) -> ModelOutput:
    output = ModelOutput.from_content(model="mockllm", content=text)
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)  # mockllm counts no tokens then
    return output


class ScriptedJudge:
    """A mockllm judge answering from `SCRIPT` by the answer it judges, the criterion and the attempt."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def __call__(self, messages, *args):
        self.calls.append(messages)
        prompt = messages[0].text
        sample = next(s for s in SCRIPT if f"answer of {s}." in prompt)
        criterion = next(c for marker, c in CRITERION_OF.items() if marker in prompt)
        attempt = (len(messages) - 1) // 2  # the follow-up adds the first reply and the request
        return _output(SCRIPT[sample][criterion][attempt])

    def model(self):
        return get_model("mockllm/model", custom_outputs=self)


def _answer(messages, *args) -> ModelOutput:
    """The model under test: `answer of <sample>.` for instruction `instruction <sample>`."""
    return _output(f"answer of {messages[-1].text.split()[-1]}.")


def _task(**metadata) -> Task:
    samples = [
        Sample(
            id=s,
            input=f"instruction {s}",
            metadata={"concept": "weddings", "concept_description": "weddings: brides, vows", **metadata},
        )
        for s in SCRIPT
    ]
    return Task(dataset=samples, solver=generate(), scorer=concept_judge(), name="judged")


def _run(tmp_path, judge=None, task=None):
    roles = {"judge": judge} if judge is not None else None
    model = get_model("mockllm/model", custom_outputs=_answer)
    (log,) = inspect_eval(
        task or _task(), model=model, model_roles=roles, log_dir=str(tmp_path / "logs"), display="none"
    )
    return log


@pytest.mark.parametrize(
    ("reply", "rating"),
    [
        ("Rating: 2", 2),
        ("The text mentions a bride twice.\n\nRating: 1\n", 1),
        ("  Rating:0  ", 0),
        ("Rating: 3", None),
        ("rating: 2", None),
        ("Rating: 2.", None),
        ("**Rating: 2**", None),
        ("Rating: 2\nI hope this helps.", None),
        ("I rate it 2.", None),
        ("", None),
    ],
)
def test_only_a_last_line_in_the_answer_format_is_a_rating(reply, rating):
    assert parse_rating(reply) == rating


def test_the_harmonic_mean_is_axbenchs_aggregate():
    assert judge_harmonic([2, 2, 2]) == 1.0
    assert judge_harmonic([2, 1, 2]) == pytest.approx(3 / (1 + 2 + 1))
    assert judge_harmonic([0, 2, 2]) == 0.0
    assert math.isnan(judge_harmonic([math.nan, 2, 2]))


def test_a_scripted_judge_gives_exactly_its_ratings_retrying_once_and_leaving_the_rest_unscored(tmp_path):
    judge = ScriptedJudge()
    log = _run(tmp_path, judge.model())
    assert log.status == "success", log.error
    values = {s.id: s.scores["concept_judge"].value for s in log.samples}
    assert values["a"] == {"judge_concept": 2, "judge_instruction": 2, "judge_fluency": 2, HARMONIC_KEY: 1.0}
    assert values["b"] == {"judge_concept": 1, "judge_instruction": 2, "judge_fluency": 0, HARMONIC_KEY: 0.0}
    assert values["c"] == {"judge_concept": 2, "judge_instruction": 1, "judge_fluency": 2, HARMONIC_KEY: 0.75}
    assert values["d"]["judge_concept"] == 1 and values["d"]["judge_instruction"] == 1
    assert math.isnan(values["d"]["judge_fluency"]) and math.isnan(values["d"][HARMONIC_KEY])  # unscored, not 0
    assert len(judge.calls) == 3 + 3 + 4 + 4  # one retry for c's concept, one for d's fluency
    retry = next(messages for messages in judge.calls if len(messages) == 3)
    assert "Rating: X" in retry[-1].text and retry[1].text == "I would say it is a 2."
    scored = log.samples[3].scores["concept_judge"]
    assert scored.metadata["unscored"] == ["fluency"] and "Still unsure." in scored.explanation

    results = {(s.name, name): m.value for s in log.results.scores for name, m in s.metrics.items()}
    assert results[("judge_concept", "mean")] == pytest.approx(1.5)
    assert results[("judge_fluency", "mean")] == pytest.approx(4 / 3)  # d's fluency is left out, not a 0
    assert results[("judge_harmonic", "mean")] == pytest.approx((1.0 + 0.0 + 0.75) / 3)
    assert results[("concept_judge", "unscored")] == 1.0
    fluency = next(s for s in log.results.scores if s.name == "judge_fluency")
    assert (fluency.scored_samples, fluency.unscored_samples) == (3, 1)

    cells = cells_frame(
        {"arm": [{"config_id": "c", "trial_id": 0, "suites": {"s": {"judged": {"log": log.location}}}}]}
    )
    frame = samples_frame(cells, None, scores=None).set_index("sample_id")
    assert list(frame.columns[-4:]) == ["judge_concept", "judge_instruction", "judge_fluency", HARMONIC_KEY]
    assert frame["judge_fluency"].dtype == float and math.isnan(frame.loc["d", "judge_fluency"])
    assert frame["judge_fluency"].mean() == pytest.approx(4 / 3)
    named = samples_frame(cells, None, scores=["judge_harmonic", "concept_judge/judge_concept"])
    assert named["concept_judge/judge_concept"].tolist() == [2.0, 1.0, 2.0, 1.0]


def test_judging_the_same_log_again_makes_no_judge_call(tmp_path):
    first = ScriptedJudge()
    log = _run(tmp_path, first.model())
    assert len(first.calls) == 14
    again = ScriptedJudge()
    # a log read whole, as `rescore` reads it: Inspect's `score` loads a lazily read log inside its own event loop,
    # which patches asyncio for the rest of the process (nest_asyncio)
    log = read_eval_log(log.location)
    rescored = score(log, concept_judge(), model=get_model("none"), model_roles={"judge": again.model()})
    assert again.calls == []  # every reply, retries included, came from Inspect's generate cache
    assert [s.scores["concept_judge1"].value for s in rescored.samples][:3] == [
        s.scores["concept_judge"].value for s in log.samples
    ][:3]


def test_the_judge_never_falls_back_to_the_model_under_test(tmp_path):
    with pytest.raises(JudgeNotBoundError, match=r"judge=<model>"):
        judge_model()
    answered = []

    def counted(messages, *args):
        answered.append(messages)
        return _answer(messages)

    model = get_model("mockllm/model", custom_outputs=counted)
    (log,) = inspect_eval(_task(), model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "error" and "no model is bound to Inspect's model role 'judge'" in log.error.message
    assert "judge=<model>" in log.error.message
    assert len(answered) <= len(SCRIPT)  # generations only: nothing was judged by the model under test


def test_the_instruction_falls_back_to_the_input_and_a_missing_description_is_refused(tmp_path):
    judge = ScriptedJudge()
    log = _run(tmp_path, judge.model())
    prompts = [m[0].text for m in judge.calls if "answers the instruction" in m[0].text]
    assert any("[INSTRUCTION]\ninstruction a\n" in p for p in prompts)
    given = ScriptedJudge()
    _run(tmp_path / "given", given.model(), _task(instruction="Write two sentences."))
    prompts = [m[0].text for m in given.calls if "answers the instruction" in m[0].text]
    assert prompts and all("[INSTRUCTION]\nWrite two sentences.\n" in p for p in prompts)
    assert log.status == "success"

    task = Task(
        dataset=[Sample(id="a", input="instruction a", metadata={"concept": "weddings"})],
        solver=generate(),
        scorer=concept_judge(),
    )
    failed = _run(tmp_path / "bare", ScriptedJudge().model(), task)
    assert failed.status == "error" and "no 'concept_description'" in failed.error.message
