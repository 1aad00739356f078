"""The version of attnviz, in one place (pyproject.toml reads it too)."""

__version__ = "0.1.0"
