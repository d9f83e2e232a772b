"""ProviderOptions.batch_ceiling: the one owner of "max_batch_size, or 1 when a control can't batch"."""

from types import SimpleNamespace

import pytest

from steer_hydra.evaluation.options import ProviderOptions
from steer_hydra.evaluation.runner import _control_provenance


@pytest.mark.parametrize(("batches", "ceiling"), [(True, 6), (False, 1)])
def test_batch_ceiling_is_the_max_or_one_when_a_control_cannot_batch(batches, ceiling):
    pipeline = SimpleNamespace(supports_batching=batches)
    options = ProviderOptions(max_batch_size=6)
    assert options.batch_ceiling(pipeline) == ceiling
    assert _control_provenance(pipeline, [], options)["batch_ceiling"] == ceiling


def test_the_provider_uses_the_options_rule(make_pipeline):
    from steer_hydra.evaluation.provider import as_inspect_model

    pipeline = make_pipeline()
    options = ProviderOptions(max_batch_size=5)
    assert as_inspect_model(pipeline, options=options).api.batch_ceiling == options.batch_ceiling(pipeline) == 5
