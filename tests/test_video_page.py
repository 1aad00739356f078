"""The page's video source (AppTest, real upload widget): an upload is processed from memory, the result is
kept in the session, and nothing of either is written to disk — not under a shared, fixed temporary folder
(where a planted link was followed and an old file was decoded instead of the upload), not anywhere."""
from __future__ import annotations

import hashlib
import tempfile
import time
from pathlib import Path

import pytest

av = pytest.importorskip("av")

from streamlit.testing.v1 import AppTest

from conftest import APP, holds, written_since
from video_fixtures import write_clip


def test_a_video_upload_is_processed_in_memory_and_never_written(tmp_path, monkeypatch, real_model):
    clip = write_clip(tmp_path / "clip.mp4", 4, fps=4)
    data = clip.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    system_temp = Path(tempfile.gettempdir())
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the folder the old code wrote every upload into
    # a link planted where the old code kept its uploads: it must not be followed (nor anything written there)
    victim = tmp_path / "victim"
    victim.mkdir()
    (temp / "attnviz-video").symlink_to(victim, target_is_directory=True)
    since = time.time() - 1
    at = AppTest.from_file(str(APP), default_timeout=300)
    at.run()
    at.radio(key="source").set_value("video").run()
    at.file_uploader(key="video_upload").set_value(("clip.mp4", data, "video/mp4")).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert any("every frame of clip.mp4" in c.value for c in at.caption), [c.value for c in at.caption]
    assert list(victim.iterdir()) == []
    for folder in (temp, system_temp, Path(__file__).parent.parent):
        for path in written_since(folder, since):
            if path == clip:
                continue
            assert digest not in path.name, f"the upload was stored as {path}"
            assert not holds(path, data, b"attnviz: clip.mp4"), f"written to {path}"
    key, rendered = at.session_state["video_result"]
    assert key[1] == digest and rendered.result.frames_out == 4 and rendered.mp4[4:8] == b"ftyp"
