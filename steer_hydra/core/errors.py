"""The error every layer raises for a configuration value that cannot work (one line: the key, the value, the fix)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key and the fix."""
