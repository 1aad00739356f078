"""Errors whose message is one sentence a person can act on."""


class ModelError(RuntimeError):
    """A model could not be loaded."""
