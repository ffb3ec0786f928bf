class SpekulaError(Exception):
    """Base class: every error a user can cause carries a message that says what to change."""


class ConfigError(SpekulaError, ValueError):
    """A bad argument or option."""


class ModelError(SpekulaError):
    """A model that cannot be found, installed, verified or loaded."""
