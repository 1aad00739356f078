"""Issue #25, the library's edges and the CLI's outputs: nothing lost, nothing silently wrong.

- `attnviz export` never writes over one of its inputs (after symbolic links, through a linked folder,
  a hard link), refuses in one line with exit 2 before anything is written, and writes every file
  through a temporary file and an atomic rename (an interrupted run leaves no half file, and an old
  export stays whole);
- a picture reaches the model the same way through `capture(model, Image.open(p))`, `read_photo(bytes)`
  (the page) and the CLI: 16-bit and float pixels scaled, transparency on white, EXIF orientation;
  NaN / infinite / empty pictures and tensors of the wrong dtype or shape are one sentence;
- files are checked by `stat` before they are read (a FIFO, a device, a 1 GB sparse file);
- the HTML template fills its placeholders once, never inside a photo's name.
Every hostile file is made here, in a temporary folder.
"""
from __future__ import annotations

import io
import os
import re
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import attnviz
from attnviz import atomic, cli, export, html, photos
from attnviz.images import ImageError, as_rgb
from conftest import ASSETS, tiny_vit

from make_corpus import encode, entries, photo


CORPUS = entries()


@pytest.fixture
def model(monkeypatch):
    """The tiny ViT, also as the model `attnviz export` loads."""
    tiny = tiny_vit()
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny)
    return tiny


def never_load(*args, **kwargs):
    raise AssertionError("the model was loaded although the export had to be refused first")


def run(args: list[str], capsys) -> tuple[int, list[str]]:
    code = cli.main(["export", *map(str, args), "--quiet"])
    return code, capsys.readouterr().err.strip().splitlines()


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def one_sentence(line: str) -> bool:
    return "\n" not in line and "Traceback" not in line and len(re.findall(r"\. [A-Z]", line)) == 0


# ---- outputs never overwrite inputs ----

@pytest.mark.parametrize("victim, options", [
    ("x_overlay.png", []),  # the case: x.jpg's overlay is x_overlay.png
    ("x.npz", []),
    ("x.html", ["--html"]),
    ("x_layers.gif", ["--gif"]),
])
def test_an_output_that_is_an_input_is_refused_before_anything_is_written(tmp_path, model, capsys, monkeypatch,
                                                                          victim, options):
    photo(40, 30).save(tmp_path / "x.jpg")
    photo(40, 30, seed=1).save(tmp_path / victim, format="PNG")  # an image the person also wants exported
    before = contents(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(attnviz.models, "load_model", never_load)  # refused before the model is even loaded
    code, err = run(["x.jpg", victim, "--out", ".", *options], capsys)
    assert code == 2 and len(err) == 1 and one_sentence(err[0]), err
    assert err[0].startswith("error: x.jpg's ") and f"would overwrite the input {victim} " in err[0]
    assert "nothing was exported" in err[0]
    assert contents(tmp_path) == before  # both inputs byte for byte, and not one file more


def test_links_do_not_hide_an_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(attnviz.models, "load_model", never_load)
    photos_dir = tmp_path / "photos"
    photos_dir.mkdir()
    photo(40, 30).save(photos_dir / "x.jpg")
    photo(40, 30, seed=1).save(photos_dir / "x_overlay.png")
    (tmp_path / "linked").symlink_to(photos_dir)  # --out names the photos' folder through a link
    before = contents(photos_dir)
    code, err = run([photos_dir / "x.jpg", photos_dir / "x_overlay.png", "--out", tmp_path / "linked"], capsys)
    assert code == 2 and "would overwrite the input" in err[0] and contents(photos_dir) == before

    out = tmp_path / "out"
    out.mkdir()
    (out / "x.npz").symlink_to(photos_dir / "x_overlay.png")  # an old output left as a link to an input
    code, err = run([photos_dir / "x.jpg", photos_dir / "x_overlay.png", "--out", out], capsys)
    assert code == 2 and f"{photos_dir / 'x_overlay.png'} ({out / 'x.npz'})" in err[0]
    os.link(photos_dir / "x_overlay.png", out / "y_overlay.png")  # a hard link: the same file by its inode
    (out / "x.npz").unlink()
    photo(40, 30).save(photos_dir / "y.jpg")
    code, err = run([photos_dir / "y.jpg", photos_dir / "x_overlay.png", "--out", out], capsys)
    assert code == 2 and "y.jpg's overlay would overwrite the input" in err[0]
    assert contents(photos_dir) == before | {"y.jpg": (photos_dir / "y.jpg").read_bytes()}


def test_the_checkpoint_is_an_input_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(attnviz.models, "load_model", never_load)
    photo(40, 30).save(tmp_path / "x.jpg")
    (tmp_path / "x.npz").write_bytes(b"my fine-tuned weights")  # oddly named, and precious
    code, err = run([tmp_path / "x.jpg", "--checkpoint", tmp_path / "x.npz", "--out", tmp_path], capsys)
    assert code == 2 and f"would overwrite the input {tmp_path / 'x.npz'}" in err[0]
    assert (tmp_path / "x.npz").read_bytes() == b"my fine-tuned weights"


def test_a_second_run_replaces_its_own_outputs_and_never_writes_through_a_link(tmp_path, model, capsys):
    photo(40, 30).save(tmp_path / "x.jpg")
    out = tmp_path / "out"
    assert run([tmp_path / "x.jpg", "--out", out], capsys) == (0, [])
    overlay = (out / "x_overlay.png").read_bytes()
    keep = tmp_path / "notes.txt"
    keep.write_text("not an input, not an output")
    (out / "x_overlay.png").unlink()
    (out / "x_overlay.png").symlink_to(keep)
    assert run([tmp_path / "x.jpg", "--out", out], capsys) == (0, [])
    assert sorted(contents(out)) == ["x.npz", "x_overlay.png"]  # the link replaced by the real overlay …
    assert (out / "x_overlay.png").read_bytes() == overlay
    assert keep.read_text() == "not an input, not an output"  # … not written through


# ---- whole files or none ----

def test_an_interrupted_export_leaves_no_half_file_and_keeps_the_old_one(tmp_path, model, capsys, monkeypatch):
    photo(40, 30).save(tmp_path / "x.jpg")
    photo(40, 30, seed=2).save(tmp_path / "y.jpg")
    out = tmp_path / "out"
    assert run([tmp_path / "x.jpg", "--out", out], capsys) == (0, [])
    old = (out / "x.npz").read_bytes()
    real = export._write_attention

    def cut(zf, cap, dtype):  # Ctrl-C halfway through the attention of the first photo
        with zf.open("attention.npy", "w") as f:
            f.write(b"\x93NUMPY half")
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "_write_attention", cut)
    code, err = run([tmp_path / "x.jpg", tmp_path / "y.jpg", "--out", out], capsys)
    assert code == 130 and err == ["interrupted after 0 of 2 images; every file written is whole, none was left "
                                   "half-written."]
    assert (out / "x.npz").read_bytes() == old  # the previous export, whole
    assert sorted(p.name for p in out.iterdir()) == ["x.npz", "x_overlay.png"]  # no .part, nothing of y

    monkeypatch.setattr(export, "_write_attention", real)
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    code, err = run([tmp_path / "y.jpg", "--out", out], capsys)
    assert (code, err) == (130, ["interrupted before any photo was exported."])


def test_every_written_file_goes_through_a_rename(tmp_path, model, capsys, monkeypatch):
    photo(40, 30).save(tmp_path / "x.jpg")
    renamed = []
    real = os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: renamed.append(Path(b).name) or real(a, b))
    assert run([tmp_path / "x.jpg", "--out", tmp_path / "out", "--html", "--gif"], capsys) == (0, [])
    assert renamed == ["x.npz", "x_overlay.png", "x.html", "x_layers.gif"]
    html.Page(attnviz.capture(model, Image.open(tmp_path / "x.jpg"))).save(tmp_path / "page.html")
    assert renamed[-1] == "page.html"


def test_replacing_keeps_the_target_on_failure_and_creates_files_as_open_does(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    with pytest.raises(OSError):
        with atomic.replacing(target) as f:
            f.write(b"new, but the disk fills up")
            raise OSError(28, "No space left on device")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]
    atomic.write_bytes(tmp_path / "b.bin", b"x")
    (tmp_path / "c.bin").write_bytes(b"x")
    assert (tmp_path / "b.bin").stat().st_mode == (tmp_path / "c.bin").stat().st_mode  # the umask applies
    long = tmp_path / ("n" * 250)  # a name near the file system's limit still gets a temporary file
    assert atomic.write_text(long, "é").read_bytes() == "é".encode()


# ---- one conversion for every picture ----

def grey16_png(path: Path) -> Path:
    ramp = (np.linspace(0, 65535, 40 * 30) ** 1.0).astype(np.uint16).reshape(30, 40)
    Image.fromarray(ramp).save(path)  # mode I;16, values all over 0 … 65535
    return path


def test_a_16_bit_png_gives_the_same_input_through_the_library_the_page_and_the_cli(tmp_path, model, capsys):
    path = grey16_png(tmp_path / "grey16.png")
    assert Image.open(path).mode in ("I;16", "I")
    library = attnviz.capture(model, Image.open(path))  # what the README's Library section shows
    page = attnviz.capture(model, attnviz.read_photo(path.read_bytes(), model, path.name).image)
    assert run([path, "--out", tmp_path / "out", "--format", "qk"], capsys) == (0, [])
    cli_input = np.load(tmp_path / "out" / "grey16.npz")["input"]
    assert np.array_equal(library.input.numpy(), page.input.numpy())
    assert np.array_equal(library.input.numpy(), cli_input)
    assert np.array_equal(library.cls_map(1, "mean"), page.cls_map(1, "mean"))
    # before, convert("RGB") clipped every value above 255 to white: the map was off
    white = model.view(Image.open(path))
    assert (np.asarray(white) == 255).mean() > 0.99
    saturated = attnviz.capture_tensor(model, model.to_input(white))
    assert np.abs(saturated.cls_map(1, "mean") - library.cls_map(1, "mean")).max() > 1e-4


def test_the_real_model_sees_a_16_bit_png_the_same_through_library_and_page(real_model, tmp_path):
    path = grey16_png(tmp_path / "grey16.png")
    library = attnviz.capture(real_model, Image.open(path))
    page = attnviz.capture(real_model, attnviz.load_photo(path, real_model).image)
    assert torch.equal(library.input, page.input)
    assert np.array_equal(library.cls_map(11, "mean"), page.cls_map(11, "mean"))
    saturated = attnviz.capture_tensor(real_model, real_model.to_input(real_model.view(Image.open(path))))
    assert np.abs(saturated.cls_map(11, "mean") - page.cls_map(11, "mean")).max() > 1e-3  # what the issue saw


def hidden_colour_rgba() -> bytes:
    a = np.zeros((30, 40, 4), np.uint8)
    a[..., 0] = 255  # red everywhere …
    a[:, :20, 3] = 255  # … but only the left half is opaque: the right half's red is hidden
    return encode(Image.fromarray(a), "PNG")


def float_tiff(values: np.ndarray) -> bytes:
    return encode(Image.fromarray(values.astype(np.float32)), "TIFF")


SPECIAL = {
    "hidden_colour.png": hidden_colour_rgba(),
    "float01.tif": float_tiff(np.tile(np.linspace(0, 1, 40), (30, 1))),
    "int32.tif": encode(Image.fromarray(np.tile(np.linspace(-5000, 90000, 40), (30, 1)).astype(np.int32)), "TIFF"),
    "grey16.tif": encode(Image.fromarray(np.tile(np.linspace(0, 65535, 40), (30, 1)).astype(np.uint16)), "TIFF"),
}


def test_every_picture_reaches_the_model_as_the_page_shows_it(tiny):
    """For every good corpus file the page does not shrink on decoding, and the special modes above:
    capture(model, Image.open(file)) gives exactly the input that the page's read_photo(bytes) gives."""
    cases = [(e.name, e.data) for e in CORPUS if e.ok] + list(SPECIAL.items())
    compared = 0
    for name, data in cases:
        checked = attnviz.read_photo(data, tiny, name)
        if checked.image.size != as_rgb(Image.open(io.BytesIO(data))).size:
            continue  # decoded at reduced size (large photos): only read_photo, from the bytes, does that
        library = attnviz.capture(tiny, Image.open(io.BytesIO(data)))
        page = attnviz.capture(tiny, checked.image)
        assert torch.equal(library.input, page.input), name
        compared += 1
    assert compared >= 30
    transparent = as_rgb(Image.open(io.BytesIO(SPECIAL["hidden_colour.png"])))
    assert transparent.getpixel((35, 15)) == (255, 255, 255) and transparent.getpixel((5, 15)) == (255, 0, 0)
    floats = as_rgb(Image.open(io.BytesIO(SPECIAL["float01.tif"])))
    assert floats.getpixel((0, 0)) == (0, 0, 0) and floats.getpixel((39, 0)) == (255, 255, 255)  # not all black


def test_the_conversion_is_idempotent_on_what_read_photo_gives(tiny):
    """read_photo's picture through capture's conversion again: unchanged (no second EXIF turn, HEIC too)."""
    for entry in CORPUS:
        if not entry.ok:
            continue
        image = attnviz.read_photo(entry.data, tiny, entry.name).image
        again = as_rgb(image)
        assert again.size == image.size and np.array_equal(np.asarray(again), np.asarray(image)), entry.name


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_infinite_pictures_are_one_sentence_everywhere(tiny, tmp_path, capsys, monkeypatch, bad):
    values = np.tile(np.linspace(0, 1, 40), (30, 1))
    values[3, 7] = bad
    with pytest.raises(ImageError) as library:
        attnviz.capture(tiny, Image.fromarray(values.astype(np.float32)))
    with pytest.raises(ImageError) as page:
        attnviz.read_photo(float_tiff(values), tiny, "scan.tif")
    assert str(page.value) == ("scan.tif holds values that are not numbers (NaN or infinite), so it cannot be "
                               "shown to the model.")
    assert library.value.key == page.value.key == "not_finite"
    x = torch.zeros(1, 3, 32, 32)
    x[0, 1, 5, 5] = bad
    with pytest.raises(ImageError, match=r"^the input holds values that are not numbers \(NaN or infinite\)"):
        attnviz.capture_tensor(tiny, x)
    (tmp_path / "scan.tif").write_bytes(float_tiff(values))
    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny)
    code, err = run([tmp_path / "scan.tif", "--out", tmp_path / "out"], capsys)
    assert code == 1 and err == [f"error: {page.value}"]


def test_empty_thin_and_cut_pictures_are_one_sentence(tiny, tmp_path):
    for size in ((0, 0), (0, 5), (7, 0)):
        with pytest.raises(ImageError, match=r"^the picture has no pixels\.$"):
            attnviz.capture(tiny, Image.new("RGB", size))
    with pytest.raises(ImageError, match=r"^the picture is 3000 × 2 pixels, too long and thin"):
        attnviz.capture(tiny, Image.new("RGB", (3000, 2)))
    data = encode(photo(64, 48), "PNG")
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match=r"^the picture is damaged or cut short"):
        attnviz.capture(tiny, Image.open(tmp_path / "cut.png"))


def test_a_wrong_tensor_is_one_sentence(tiny):
    with pytest.raises(TypeError, match=r"^the input is torch.float64 but tiny's weights are torch.float32: "
                                        r"pass x.to\(torch.float32\)$"):
        attnviz.capture_tensor(tiny, torch.zeros(1, 3, 32, 32, dtype=torch.float64))
    for shape in ((1, 1, 32, 32), (1, 4, 32, 32), (3, 32, 32)):
        with pytest.raises(ValueError, match=r"^capture_tensor\(\) takes a \(1, 3, 32, 32\) tensor, not one of shape"):
            attnviz.capture_tensor(tiny, torch.zeros(shape))
    assert tiny.tap.current is None  # refused before the forward pass: no capture left running


# ---- files checked before they are read ----

def finishes(fn, seconds: float = 10.0):
    """fn() run on a thread; its result or exception, or a failure if it does not end in time (a hang)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hung"
    return box


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_pipes_devices_and_huge_files_are_refused_without_reading(tiny, tmp_path, capsys, monkeypatch):
    fifo = tmp_path / "camera.jpg"
    os.mkfifo(fifo)
    got = finishes(lambda: photos.load_photo(fifo, tiny))
    assert isinstance(got.get("error"), ImageError) and got["error"].key == "not_regular"
    assert str(got["error"]) == "camera.jpg is not a regular file (a folder, a pipe or a device cannot be read as a photo)."
    if Path("/dev/zero").exists():
        got = finishes(lambda: photos.load_photo("/dev/zero", tiny))
        assert got["error"].key == "not_regular"
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.write(encode(photo(16, 16), "JPEG"))
        f.truncate(2**30)  # 1 GB, sparse: costs no disk, and must cost no memory
    tracemalloc.start()
    try:
        with pytest.raises(ImageError) as caught:
            photos.load_photo(huge, tiny)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value) == "huge.jpg is 1024 MB; attnviz reads photos of at most 50 MB."  # no "upload limit"
    assert peak < 1_000_000, peak  # bytes: refused by stat, not one megabyte of the gigabyte read

    monkeypatch.setattr(attnviz.models, "load_model", lambda *a, **k: tiny)
    photo(40, 30).save(tmp_path / "good.png")
    (tmp_path / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (tmp_path / "loop.jpg").symlink_to(tmp_path / "loop.jpg")
    got = finishes(lambda: run([fifo, huge, tmp_path / "gone.jpg", tmp_path / "loop.jpg", tmp_path / "good.png",
                                "--out", tmp_path / "out"], capsys), seconds=60)
    code, err = got["value"]
    assert code == 1 and err == [
        f"error: {fifo} is not a file.",
        "error: huge.jpg is 1024 MB; attnviz reads photos of at most 50 MB.",
        f"error: {tmp_path / 'gone.jpg'} is a link to nothing (its target is missing, or it loops).",
        f"error: {tmp_path / 'loop.jpg'} is a link to nothing (its target is missing, or it loops).",
    ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good.npz", "good_overlay.png"]


# ---- the HTML template ----

class Sequential:
    """The template filling before issue #25: one str.replace per placeholder, each over the last's result."""

    def sub(self, fill, template: str) -> str:
        for key in dict.fromkeys(re.findall(r"\{\{([A-Z_]+)\}\}", template)):
            value = fill(re.match(r"\{\{([A-Z_]+)\}\}", "{{" + key + "}}"))
            template = template.replace("{{" + key + "}}", value)
        return template


@pytest.fixture(scope="module")
def tiny_cap():
    return attnviz.capture(tiny_vit(), Image.open(ASSETS / "cat.jpg"))


def test_a_normal_page_is_byte_identical_to_before(tiny_cap, monkeypatch):
    now = html.page(tiny_cap, "en", source="cat.jpg", top=[("tabby", 0.5)])
    assert "{{" not in now  # every placeholder filled
    monkeypatch.setattr(html, "PLACEHOLDER", Sequential())
    assert html.page(tiny_cap, "en", source="cat.jpg", top=[("tabby", 0.5)]) == now


@pytest.mark.parametrize("name", ["{{PAYLOAD}}.jpg", "{{HEAD_OPTIONS}}.jpg", "{{TITLE}}{{FACTS}}.jpg"])
def test_a_photo_named_like_a_placeholder_stays_its_name(tiny_cap, monkeypatch, name):
    normal = html.page(tiny_cap, "en", source="cat.jpg")
    page = html.page(tiny_cap, "en", source=name)
    title = re.search(r"<title>(.*?)</title>", page, flags=re.S).group(1)
    heading = re.search(r"<h1>(.*?)</h1>", page, flags=re.S).group(1)
    assert title == heading == f"{name}: what the Vision Transformer looks at"
    assert "<option" not in title and "base64" not in title
    assert len(page) - len(normal) == page.count(name) * (len(name) - len("cat.jpg"))  # the name, nothing more
    monkeypatch.setattr(html, "PLACEHOLDER", Sequential())
    before = html.page(tiny_cap, "en", source=name)
    assert len(before) > len(page) or "<option" in re.search(r"<title>(.*?)</title>", before, re.S).group(1)


def test_the_cli_page_of_a_placeholder_named_photo(tmp_path, model, capsys):
    path = tmp_path / "{{PAYLOAD}}.jpg"
    photo(40, 30).save(path, format="JPEG")
    assert run([path, "--out", tmp_path / "out", "--html", "--format", "qk"], capsys) == (0, [])
    page = (tmp_path / "out" / "PAYLOAD.html").read_text(encoding="utf-8")
    assert "<title>{{PAYLOAD}}.jpg: what the Vision Transformer looks at</title>" in page
    assert len(page.encode()) < 200_000
