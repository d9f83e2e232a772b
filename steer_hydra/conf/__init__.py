"""Hydra config groups shipped with steer_hydra (model, control, arm, suite, provider, backend, logger, experiment)."""
