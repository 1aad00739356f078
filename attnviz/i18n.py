"""Every word a person reads, in English and Traditional Chinese (as a Taiwanese classroom says it).

One folder of TOML files per language (``locales/<lang>/<part>.toml``) with the same keys in both;
``text(lang, "section.key", **values)`` looks a string up and fills in ``{placeholders}``. Parts
(the app, the lesson, …) are separate files so they can grow independently. The core never decides
the language: callers pass it.
"""
from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping

LANGUAGES = {"en": "English", "zh-TW": "繁體中文"}
DEFAULT = "en"
_DIR = Path(__file__).with_name("locales")


def _flatten(table: Mapping, prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            flat |= _flatten(value, f"{prefix}{key}.")
        else:
            flat[prefix + key] = value
    return flat


@lru_cache(maxsize=None)
def catalogue(lang: str) -> Mapping[str, str]:
    """All strings of one language, keyed ``"section.key"`` (read once, never mutated)."""
    if lang not in LANGUAGES:
        raise KeyError(f"unknown language {lang!r}; choose from {list(LANGUAGES)}")
    flat: dict[str, str] = {}
    for part in sorted((_DIR / lang).glob("*.toml")):
        with open(part, "rb") as f:
            table = _flatten(tomllib.load(f))
        clash = flat.keys() & table.keys()
        if clash:
            raise KeyError(f"{part} repeats keys {sorted(clash)}")
        flat |= table
    return flat


def text(lang: str, key: str, **values: object) -> str:
    """The string ``key`` in ``lang`` with ``{name}`` placeholders filled from ``values``."""
    template = catalogue(lang)[key]
    return template.format(**values) if values else template


def join(lang: str, items: Iterable[object]) -> str:
    """Items listed in a sentence of ``lang``: "1, 2, 3" in English, "1、2、3" in Chinese (the enumeration comma)."""
    return text(lang, "lists.separator").join(str(item) for item in items)
