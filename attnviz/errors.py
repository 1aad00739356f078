"""Every error attnviz raises on bad input or a model it cannot read: one base class, one sentence each.

    try:
        cap = attnviz.capture(attnviz.load_model(name), attnviz.load_photo(path, model).image)
    except attnviz.AttnvizError as e:
        print(e)  # one sentence a person can act on
"""
from __future__ import annotations


class AttnvizError(Exception):
    """Base of every attnviz error; ``str(error)`` is one sentence a person can act on."""


class ModelError(AttnvizError, RuntimeError):
    """A model could not be loaded, or attnviz cannot reproduce its attention exactly."""


class HubUnavailable(ModelError):
    """A hub model that is not in this computer's cache and cannot (or may not) be downloaded now."""


class IncompleteWeights(ModelError):
    """Weight files that do not give every tensor the model needs: refused, never filled at random.

    ``missing``: how many tensors are missing (or have another shape); ``needed``: how many the model has.
    """

    def __init__(self, message: str, missing: int = 0, needed: int = 0) -> None:
        super().__init__(message)
        self.missing, self.needed = missing, needed


class NoClassTokenError(AttnvizError, ValueError):
    """The model has no class token, so there is no class-token row to show."""


class LayoutError(AttnvizError, ValueError):
    """What was asked of a capture is not defined for this model's token layout (e.g. a product of matrices
    across a change of grid); the sentence names what the model has."""


class ImageError(AttnvizError, ValueError):
    """The file is not an image we can use.

    ``key`` and ``values`` name the same sentence for a translation catalogue (``images.<key>``).
    """

    def __init__(self, message: str, key: str = "unreadable", **values: object) -> None:
        super().__init__(message)
        self.key = key
        self.values = values


class RelevanceError(AttnvizError, ValueError):
    """Class-specific maps cannot be computed for this model (e.g. it has no classifier head)."""


class FaithfulnessError(AttnvizError, ValueError):
    """A removal or ablation experiment this model cannot run (e.g. token removal on a RoPE model)."""


class ExportError(AttnvizError, ValueError):
    """A file is not an attnviz export this version can read."""


class RunError(AttnvizError, ValueError):
    """A dataset run folder that cannot be used as asked."""


class RunFileError(RunError):
    """A file in a run folder (or one a run names) that is not what it must be: not a regular file, too
    large, not valid JSON or Parquet, or holding values out of range.

    ``key`` and ``values`` name the same sentence for a translation catalogue (``dataset.<key>``).
    """

    def __init__(self, message: str, key: str, **values: object) -> None:
        super().__init__(message)
        self.key = key
        self.values = values
