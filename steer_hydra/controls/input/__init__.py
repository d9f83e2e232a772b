"""Input controls: rewrite the prompt before (chat) or after (tokens) templating."""

from steer_hydra.controls.input.few_shot import FewShot
from steer_hydra.controls.input.system_prompt import SystemPrompt
from steer_hydra.controls.input.user_prefix import UserPrefix

__all__ = ["FewShot", "SystemPrompt", "UserPrefix"]
