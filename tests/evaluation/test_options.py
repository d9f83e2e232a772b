"""ProviderOptions.batch_ceiling and batching_in_force: the one owner of "max_batch_size, or 1 when a control can't
batch" and of which batching runs (the default "auto": refill where the pipeline can)."""

from types import SimpleNamespace

import pytest

from steer_hydra.evaluation.options import ProviderOptions
from steer_hydra.evaluation.runner import _control_provenance


@pytest.mark.parametrize(("batches", "ceiling"), [(True, 6), (False, 1)])
def test_batch_ceiling_is_the_max_or_one_when_a_control_cannot_batch(batches, ceiling):
    pipeline = SimpleNamespace(supports_batching=batches, refill_blockers=lambda: [])
    options = ProviderOptions(max_batch_size=6)
    assert options.batch_ceiling(pipeline) == ceiling
    assert _control_provenance(pipeline, [], options)["batch_ceiling"] == ceiling


def test_the_provider_uses_the_options_rule(make_pipeline):
    from steer_hydra.evaluation.provider import as_inspect_model

    pipeline = make_pipeline()
    options = ProviderOptions(max_batch_size=5)
    assert as_inspect_model(pipeline, options=options).api.batch_ceiling == options.batch_ceiling(pipeline) == 5


@pytest.mark.parametrize(
    ("mode", "blockers", "batches", "in_force"),
    [
        ("auto", [], True, "refill"),
        ("auto", ["PASTA2 does not declare supports_refill"], True, "static"),
        ("auto", [], False, "static"),  # a ceiling of 1 has no slot to refill
        ("static", [], True, "static"),
        ("refill", [], True, "refill"),
    ],
)
def test_the_default_batching_refills_where_the_pipeline_can(mode, blockers, batches, in_force):
    pipeline = SimpleNamespace(supports_batching=batches, refill_blockers=lambda: blockers)
    options = ProviderOptions(max_batch_size=4, batching=mode)
    assert ProviderOptions().batching == "auto"
    assert options.batching_in_force(pipeline) == in_force
    assert _control_provenance(pipeline, [], options)["batching"] == in_force  # the record says which ran


def test_an_explicit_refill_the_pipeline_cannot_run_names_why():
    pipeline = SimpleNamespace(supports_batching=True, refill_blockers=lambda: ["a decoding driver owns the loop"])
    with pytest.raises(ValueError, match=r"cannot refill: a decoding driver owns the loop. Fix: use batching='auto'"):
        ProviderOptions(batching="refill").batching_in_force(pipeline)
