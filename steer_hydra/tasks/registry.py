"""`builtin_task`: register a built-in task as `steer_hydra/<name>` however the package is installed.

Inspect namespaces a `@task` by its package only when it detects an installed package; from the root of an
editable checkout (where `steer_hydra.egg-info` shadows the installed metadata) it registers the bare name,
which would make `steer_hydra/short_answer` unresolvable and change the task's identity (and so break resume)
depending on the working directory. This decorator pins the qualified name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from inspect_ai import Task, task
from inspect_ai.util import registry_info

PACKAGE = "steer_hydra"

T = TypeVar("T", bound=Callable[..., Task])


def builtin_task(func: T) -> T:
    """`@task`, registered as `steer_hydra/<function name>`."""
    qualified = f"{PACKAGE}/{func.__name__}"
    wrapped = task(func)
    if registry_info(wrapped).name != qualified:
        wrapped = task(name=qualified)(func)
    return wrapped
