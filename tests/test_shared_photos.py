"""The presenter's photo on the class's phones: the store it is shared through (attnviz/shared_photos.py), and a
link naming it opening it on another session's page (AppTest)."""
from __future__ import annotations

import threading

import pytest
from streamlit.testing.v1 import AppTest

from attnviz import i18n, photos
from attnviz.shared_photos import NAME, SharedPhotos
from conftest import APP


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_photo_is_opened_by_its_unguessable_name_and_keeps_it_while_kept():
    shelf = SharedPhotos()
    name = shelf.share(b"photo one", "one.jpg")
    assert NAME.fullmatch(name) and shelf.open(name).data == b"photo one" and shelf.open(name).filename == "one.jpg"
    assert shelf.share(b"photo one", "again.jpg") == name  # the same bytes: the same link while kept
    import hashlib  # the page passes the digest it keys its captures by: the same name, no second hash

    assert shelf.share(b"photo one", "again.jpg", digest=hashlib.sha256(b"photo one").hexdigest()) == name
    other = shelf.share(b"photo two", "two.jpg")
    assert other != name and shelf.open(other).data == b"photo two" and len(shelf) == 2
    names = {shelf.share(bytes([i]), "x.png") for i in range(50)}
    assert len(names) == 50 and len({n[:8] for n in names}) == 50  # random, not a counter or a digest's prefix


@pytest.mark.parametrize("name", ["", "../../etc/passwd", "cat", "A" * 21, "A" * 23, "A" * 21 + "/", None])
def test_a_name_that_was_never_given_opens_nothing(name):
    shelf = SharedPhotos()
    shelf.share(b"photo", "p.jpg")
    assert shelf.open(name) is None


def test_the_store_is_bounded_in_photos_bytes_and_time():
    clock = Clock()
    shelf = SharedPhotos(max_photos=3, max_bytes=100, keep_s=60, clock=clock)
    a, b, c = (shelf.share(bytes([i]) * 10, f"{i}.jpg") for i in range(3))
    clock.now = 1
    assert shelf.open(a) is not None  # opened: now the newest
    d = shelf.share(b"d" * 10, "d.jpg")  # a fourth: the least recently used (b) goes
    assert shelf.open(b) is None and all(shelf.open(n) is not None for n in (a, c, d)) and len(shelf) == 3
    e = shelf.share(b"e" * 75, "e.jpg")  # 75 + 3 × 10 > 100 bytes: the oldest go until it fits
    assert shelf.nbytes <= 100 and shelf.open(e) is not None and len(shelf) == 3
    clock.now = 1 + 60.5  # a lesson later: everything not used since is forgotten
    assert shelf.open(e) is None and len(shelf) == 0 and shelf.nbytes == 0
    with pytest.raises(ValueError):
        shelf.share(b"x" * 101, "big.jpg")
    assert shelf.share(bytes([0]) * 10, "0.jpg") != a  # forgotten, then shared again: a new name


def test_many_sessions_share_and_open_at_once():
    shelf = SharedPhotos(max_photos=1000)
    got: dict[int, str] = {}

    def share(i: int) -> None:
        for _ in range(20):
            got[i] = shelf.share(i.to_bytes(2, "big"), f"{i}.png")
            assert shelf.open(got[i]).data == i.to_bytes(2, "big")

    threads = [threading.Thread(target=share, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(set(got.values())) == 16 and len(shelf) == 16


def test_a_link_to_a_shared_photo_opens_it_and_a_forgotten_one_says_so():
    from attnviz_app import ui

    data = photos.sample("rocket").read_bytes()
    name = ui.shared_photos().share(data, "teacher.jpg")  # as the presenter's page does (one server process)
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.query_params.update({"photo": name, "layer": "7", "lang": "zh-TW"})
    at.run()
    assert not at.exception and not at.warning
    assert at.radio(key="source").value == "shared" and at.slider(key="layer").value == 7
    assert i18n.text("zh-TW", "input.shared") in at.radio(key="source").options
    assert at.query_params["photo"] == name  # the phone's own address still names it
    rocket = AppTest.from_file(str(APP), default_timeout=180)
    rocket.query_params.update({"photo": "rocket", "layer": "7", "lang": "zh-TW"})
    rocket.run()
    assert [s.value for s in at.subheader] == [s.value for s in rocket.subheader]
    assert at.image[0].value == rocket.image[0].value  # the same heatmap: the same photo, model, layer and head

    gone = AppTest.from_file(str(APP), default_timeout=180)
    gone.query_params["photo"] = "Z" * 22  # well formed, never shared (or forgotten since)
    gone.run()
    assert not gone.exception
    assert [w.value for w in gone.warning] == [i18n.text("en", "input.shared_gone", hours=4)]
