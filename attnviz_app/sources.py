"""Photo sources beyond the built-in ones (sample, upload, camera, live camera), offered by both pages.

Each is name → (label key, function(model, settings) → (bytes, name) or a stop); the module behind it is
imported only when someone picks it, so the still-photo path never loads PyAV for a video.
"""
from __future__ import annotations

from types import MappingProxyType


def video_source(model, settings):
    from . import video

    return video.video_source(model, settings)


MORE = MappingProxyType({"video": ("video.source", video_source)})
