"""attnviz.images over the generated corpus: every file gives a correct picture or one clear sentence."""
from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

import attnviz
from attnviz import images
from attnviz.images import CheckedImage, ImageError, open_image

from make_corpus import entries, file_name, photo, png_header_only, write_corpus

CORPUS = entries()
BAD = [e for e in CORPUS if not e.ok]
GOOD = [e for e in CORPUS if e.ok]


def probe(image: Image.Image, x: float, y: float) -> tuple[int, int, int]:
    return image.getpixel((min(int(x * image.width), image.width - 1), min(int(y * image.height), image.height - 1)))


def test_corpus_covers_every_kind_the_issue_names():
    names = {e.name for e in CORPUS}
    assert {"empty.jpg", "page.png", "paper.pdf", "drawing.svg", "photos.zip", "noise.jpg"} <= names
    assert {"truncated.jpg", "truncated.png", "bad_crc.png", "corrupt_exif.jpg", "bomb_60000.png"} <= names
    assert {"cmyk.jpg", "grey16.png", "grey8.png", "rgba.png", "palette.png", "animated.gif"} <= names
    assert {"exif_orientation_6.jpg", "exif_orientation_8.jpg", "one_pixel.png", "eight.png"} <= names
    assert {"panorama.jpg", "strip.png", "photo.webp", "photo.bmp", "photo.tif", "really_png.jpg"} <= names
    assert "photo_24mp.jpg" in names
    assert {e.kind for e in CORPUS} == {"not-image", "broken", "dangerous", "odd"}


def test_bomb_header_is_hand_made_with_no_pixels():
    data = png_header_only(60000, 60000)
    assert len(data) == 8 + 25 + 12  # signature, IHDR, IEND: not one pixel stored
    with pytest.raises(Image.DecompressionBombError):  # PIL itself refuses it from the header
        Image.open(io.BytesIO(data))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
@pytest.mark.parametrize("entry", BAD, ids=[e.name for e in BAD])
def test_bad_file_gives_one_sentence_naming_it(entry):
    with pytest.raises(ImageError) as caught:
        open_image(entry.data, entry.name)
    message = str(caught.value)
    assert entry.matches(message), message
    assert message.startswith(entry.name) and message.endswith(".")
    assert "\n" not in message and "Traceback" not in message and "Error" not in message
    assert len(re.findall(r"[.;] [A-Z]", message)) == 0  # one sentence
    assert isinstance(caught.value.key, str) and caught.value.values.get("name") == entry.name


@pytest.mark.parametrize("entry", GOOD, ids=[e.name for e in GOOD])
def test_odd_but_valid_file_decodes_upright_rgb(entry):
    checked = open_image(entry.data, entry.name)
    assert isinstance(checked, CheckedImage)
    assert checked.image.mode == "RGB"
    assert checked.image.size == entry.size
    for (x, y), colour in entry.probes:
        got = probe(checked.image, x, y)
        assert max(abs(a - b) for a, b in zip(got, colour)) <= 40, (x, y, got, colour)
    if entry.expect:
        assert any(re.search(entry.expect, n) for n in checked.notes), checked.notes
    if entry.no_note:
        assert not any(re.search(entry.no_note, n) for n in checked.notes), checked.notes
    assert len(checked.note_keys) == len(checked.notes)


@pytest.mark.parametrize("fit", ["crop", "squash"])
def test_every_good_file_reaches_a_capture(tiny, fit):
    for entry in GOOD:
        checked = open_image(entry.data, entry.name, max_side=1024)
        cap = attnviz.capture(tiny, checked.image, fit=fit)
        assert cap.input.shape == (1, 3, 32, 32), entry.name
        row = cap.row(1, "mean")
        assert np.isfinite(row).all() and row.sum() == pytest.approx(1.0, abs=1e-5), entry.name


@pytest.mark.parametrize("name", ["bomb_60000.png", "bomb_8000.png", "bomb_65000.jpg", "bomb_65535.gif", "sliver.png"])
def test_dangerous_sizes_are_refused_before_decoding(monkeypatch, name):
    entry = next(e for e in CORPUS if e.name == name)
    decoded = []
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self) or None)
    with pytest.raises(ImageError, match=entry.expect):
        open_image(entry.data, name)
    assert decoded == []


def test_pixel_limit_message_states_the_limit():
    with pytest.raises(ImageError, match=r"8000 × 8000 pixels; the limit is 50 megapixels"):
        open_image(png_header_only(8000, 8000), "big.png")


def test_upload_size_limit_matches_server_config_and_is_explained(monkeypatch):
    config = tomllib.loads((Path(__file__).parents[1] / ".streamlit" / "config.toml").read_text())
    assert images.MAX_BYTES == config["server"]["maxUploadSize"] * 2**20
    monkeypatch.setattr(images, "MAX_BYTES", 2**20)
    with pytest.raises(ImageError, match=r"^big.png is 2 MB; the upload limit is 1 MB\.$"):
        open_image(b"\x89PNG" + bytes(2 * 2**20), "big.png")


def test_exif_rotation_turns_the_stored_picture_upright():
    entry = next(e for e in CORPUS if e.name == "exif_orientation_6.jpg")
    with Image.open(io.BytesIO(entry.data)) as stored:
        assert stored.size == (80, 120)  # portrait on disk …
    upright = open_image(entry.data, entry.name).image
    assert upright.size == (120, 80)  # … landscape as the camera meant it, red corner top-left
    assert probe(upright, 0.1, 0.1)[0] > 200 and probe(upright, 0.1, 0.1)[2] < 80


def test_animated_gif_uses_its_first_frame_and_says_so():
    entry = next(e for e in CORPUS if e.name == "animated.gif")
    checked = open_image(entry.data, entry.name)
    assert checked.format == "GIF"
    assert checked.notes == ("animated image: the first of 3 frames is used",)
    assert checked.note_keys == (("animated", {"frames": 3}),)


def test_transparency_is_composited_on_white_and_said():
    checked = open_image(next(e for e in CORPUS if e.name == "rgba.png").data, "rgba.png")
    assert probe(checked.image, 0.9, 0.5) == images.BACKGROUND
    assert "white background" in checked.notes[0]


def test_format_comes_from_the_bytes_not_the_name():
    assert open_image(next(e for e in CORPUS if e.name == "really_png.jpg").data, "really_png.jpg").format == "PNG"
    assert open_image(next(e for e in CORPUS if e.name == "two_pictures.jpg").data, "x.jpg").format == "JPEG"


def test_max_side_shrinks_large_photos_keeping_shape():
    entry = next(e for e in CORPUS if e.name == "photo_24mp.jpg")
    small = open_image(entry.data, entry.name, max_side=1500).image
    assert small.size == (1500, 1000)
    full = open_image(entry.data, entry.name).image
    reference = np.asarray(full.resize((1500, 1000), Image.Resampling.BOX), dtype=np.float32)
    assert np.abs(np.asarray(small, dtype=np.float32) - reference).mean() < 3  # same picture, only smaller
    assert open_image(entry.data, entry.name, max_side=8000).image.size == (6000, 4000)


def test_sniff_names_common_mistakes():
    assert images.sniff(b"%PDF-1.7 ...") == "a PDF document"
    assert images.sniff(b"PK\x03\x04rest") == "a ZIP archive"
    assert images.sniff(b"  <!DOCTYPE html><html>") == "a web page"
    assert images.sniff(b"\x00\x00\x00\x18ftypheic") == "HEIC"  # read since issue #10
    assert images.sniff(b"\x89PNG\r\n\x1a\nxxxx") == "PNG"
    assert images.sniff(b"hello") is None


def test_decoding_never_touches_pil_global_warning_filters():
    # warnings.catch_warnings() is process-global and not thread-safe; open_image must not rely on it.
    import warnings

    before = list(warnings.filters)
    for entry in CORPUS[:12]:
        try:
            open_image(entry.data, entry.name)
        except ImageError:
            pass
    assert warnings.filters == before


def test_write_corpus_keeps_every_file_inside_the_folder(tmp_path):
    written = write_corpus(tmp_path / "c")
    assert len(written) == len(CORPUS)
    for entry, path in written:
        assert path.parent == tmp_path / "c" and path.read_bytes() == entry.data
    assert file_name(next(e for e in CORPUS if "/" in e.name)) == "_.._.._etc_passwd.png"


def test_photo_helper_is_deterministic():
    assert np.array_equal(np.asarray(photo(40, 30, seed=3)), np.asarray(photo(40, 30, seed=3)))
    assert not np.array_equal(np.asarray(photo(40, 30, seed=3)), np.asarray(photo(40, 30, seed=4)))
