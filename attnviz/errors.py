"""Errors whose message is one sentence a person can act on."""


class ModelError(RuntimeError):
    """A model could not be loaded, or attnviz cannot reproduce its attention exactly."""


class HubUnavailable(ModelError):
    """A hub model that is not in this computer's cache and cannot (or may not) be downloaded now."""


class NoClassTokenError(ValueError):
    """The model has no class token, so there is no class-token row to show."""
