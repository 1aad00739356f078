"""Hostile files in and around dataset runs (issue #25): each gets one sentence, nothing hangs, nothing is
lost or doubled on disk, and the server's memory stays bounded while the Dataset page opens them all.

Every hostile file is made here, from a small clean run of the offline model at 56 px.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from streamlit.testing.v1 import AppTest

from attnviz import cli, dataset, i18n, runfiles
from attnviz.dataset import RunConfig, read_run, run_local
from attnviz.errors import RunFileError

from conftest import APP
from dataset_fixtures import SMALL, one_thread, photo_folder, same_tables  # noqa: F401 (autouse fixture)

CONFIG = RunConfig(size=SMALL)
ROWS_PER_IMAGE = 12 * 6  # the offline ViT-S/14: 12 layers × 6 heads


@pytest.fixture(scope="module")
def small_model():
    return CONFIG.load()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return photo_folder(tmp_path_factory.mktemp("photos"))


@pytest.fixture(scope="module")
def good(photos, small_model, tmp_path_factory):
    """A clean run in three batches: [cat, gradient], [noise, notes (not an image)], [rocket]."""
    out = tmp_path_factory.mktemp("good") / "good"
    run_local(photos, out, CONFIG, batch=2, progress=False, model=small_model)
    return out


def parts(run: Path, table: str) -> list[Path]:
    return sorted((run / table).glob("part-*.parquet"))


def hidden_files(run: Path) -> list[str]:
    return [str(p.relative_to(run)) for p in run.rglob(".*")]


def one_row_per_head(run: Path) -> None:
    """What any Parquet reader sees in the heads folder: exactly one row per (image, layer, head)."""
    heads = pads.dataset(run / "heads", format="parquet").to_table().to_pandas()
    images = pads.dataset(run / "images", format="parquet").to_table()
    assert len(heads) == images.num_rows * ROWS_PER_IMAGE
    assert not heads.duplicated(["path", "layer", "head"]).any()
    assert set(heads["path"]) == set(images["path"].to_pylist())


# --- Regular files only, of bounded size ----------------------------------------------------------------

def test_only_regular_files_are_read_and_never_more_than_the_bound(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    (tmp_path / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (tmp_path / "loop.jpg").symlink_to(tmp_path / "loop.jpg")
    (tmp_path / "folder.jpg").mkdir()
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 5000)
    cases = {fifo: ("file_not_regular", "fifo"), "/dev/zero": ("file_not_regular", "device"),
             tmp_path / "folder.jpg": ("file_not_regular", "folder"), tmp_path / "dangling.jpg": ("file_missing", None),
             tmp_path / "loop.jpg": ("file_loop", None), small: ("file_too_big", None)}
    refused = {}

    def read_each() -> None:  # opening the FIFO would wait for a writer forever: on a thread, so the test can say so
        for path in cases:
            try:
                runfiles.read_file(path, 4096, "that file")
            except RunFileError as error:
                refused[path] = error

    reader = threading.Thread(target=read_each, daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "read_file opened the FIFO and waits for a writer"
    for path, (key, kind) in cases.items():
        caught = refused[path]
        assert caught.key == key and caught.values.get("kind") == kind, path
        assert str(caught).startswith("that file ") and str(caught).endswith(" read.") == (
            key in ("file_not_regular", "file_too_big"))
    assert runfiles.read_file(small, 5000) == b"x" * 5000
    assert str(pytest.raises(RunFileError, runfiles.read_file, small, 4096, "small.bin").value) == (
        "small.bin is 5 KB; files over 4 KB are not read.")


def test_a_3_gb_sparse_photo_is_refused_by_its_size_without_being_read(photos, small_model, tmp_path):
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GB on paper, nothing on disk
    reset_peak()
    before = peak_mb()
    summary = run_local(tmp_path, tmp_path / "run", CONFIG, progress=False, model=small_model)
    grew = peak_mb() - before
    error = read_run(tmp_path / "run").errors.to_pylist()[0]
    print(f"3 GB sparse huge.jpg refused; peak resident memory grew {grew:.0f} MB")
    assert (summary.images, summary.errors) == (0, 1)
    assert error["error_key"] == "file_too_big" and error["digest"] is None
    assert error["error"] == f"{huge} is 3.0 GB; files over 50 MB are not read."
    assert "upload" not in error["error"]
    assert grew < 100  # reading it whole would have taken 3 GB


def test_fifos_devices_and_broken_links_get_a_reason_row_and_the_batch_goes_on(photos, small_model, tmp_path):
    folder = tmp_path / "in"
    shutil.copytree(photos / "more", folder)
    os.mkfifo(folder / "pipe.png")
    (folder / "dangling.jpg").symlink_to(folder / "gone.jpg")
    (folder / "loop.jpg").symlink_to(folder / "loop.jpg")
    (folder / "zero.jpg").symlink_to("/dev/zero")
    listing = tmp_path / "list.txt"
    listing.write_text("in/pipe.png\n/dev/null\nin/gradient.png\n")
    out = tmp_path / "run"
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(
        folder=run_local(folder, out, CONFIG, batch=8, progress=False, model=small_model),
        listed=run_local(listing, tmp_path / "listed", CONFIG, batch=8, progress=False, model=small_model)))
    worker.start()
    worker.join(120)
    if worker.is_alive():  # it blocked on the FIFO: let it go, then fail
        with open(folder / "pipe.png", "wb"):
            pass
        worker.join()
        pytest.fail("a FIFO blocked the run")
    assert (result["folder"].images, result["folder"].errors) == (2, 4)  # gradient and noise, in the same batch
    reasons = {Path(r["path"]).name: (r["error_key"], json.loads(r["error_values"]).get("kind"))
               for r in read_run(out).errors.to_pylist()}
    assert reasons == {"pipe.png": ("file_not_regular", "fifo"), "zero.jpg": ("file_not_regular", "device"),
                       "dangling.jpg": ("file_missing", None), "loop.jpg": ("file_loop", None)}
    listed = read_run(tmp_path / "listed")
    assert [Path(p).name for p in listed.images["path"].to_pylist()] == ["gradient.png"]
    assert sorted(r["error"] for r in listed.errors.to_pylist()) == [
        "/dev/null is a device, not a regular file, so it is not read.",
        f"{folder / 'pipe.png'} is a named pipe (FIFO), not a regular file, so it is not read."]


def test_a_name_with_a_newline_is_read(photos, small_model, tmp_path):
    shutil.copy(photos / "cat.jpg", tmp_path / "new\nline.jpg")
    run_local(tmp_path, tmp_path / "run", CONFIG, progress=False, model=small_model)
    tables = read_run(tmp_path / "run")
    assert tables.images["path"].to_pylist() == [str(tmp_path / "new\nline.jpg")] and tables.errors.num_rows == 0


# --- Clean on disk --------------------------------------------------------------------------------------

def test_a_resumed_run_holds_one_row_per_head_for_any_parquet_reader(photos, good, small_model, tmp_path):
    """Killed between a batch's heads and images parts (and mid-write, leaving a temporary file): the
    rerun removes the orphan heads part and the temporary file before it redoes that batch."""
    out = tmp_path / "run"
    shutil.copytree(good, out)
    last = parts(out, "images")[-1]
    last.unlink()  # rocket's batch: heads landed, images did not
    (out / "heads" / ".part-1.parquet.0123abcd.tmp").write_bytes(b"half a part")
    raw = pads.dataset(out / "heads", format="parquet").to_table()
    assert raw.num_rows == 4 * ROWS_PER_IMAGE  # rocket's heads are on disk without its images row
    resumed = run_local(photos, out, CONFIG, batch=2, progress=False, model=small_model)
    assert (resumed.skipped, resumed.images) == (4, 1)
    one_row_per_head(out)
    assert hidden_files(out) == []
    same_tables(read_run(out), read_run(good))


def test_ctrl_c_while_a_batch_is_written_leaves_no_part_of_it(photos, good, small_model, tmp_path, monkeypatch):
    out = tmp_path / "run"
    write_table, calls = pq.write_table, []

    def interrupted(table, where, *args, **kwargs):
        calls.append(where)
        if len(calls) == 5:  # the second batch's images part (batch 1: heads, images; batch 2: heads, errors, images)
            raise KeyboardInterrupt
        return write_table(table, where, *args, **kwargs)

    monkeypatch.setattr(dataset.pq, "write_table", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_local(photos, out, CONFIG, batch=2, progress=False, model=small_model)
    monkeypatch.setattr(dataset.pq, "write_table", write_table)
    assert hidden_files(out) == []  # no temporary file left
    assert [len(parts(out, t)) for t in ("heads", "images", "errors")] == [1, 1, 0]  # only the whole first batch
    one_row_per_head(out)
    run_local(photos, out, CONFIG, batch=2, progress=False, model=small_model)
    one_row_per_head(out)
    same_tables(read_run(out), read_run(good))


def test_ctrl_c_is_held_off_until_a_batchs_renames_have_landed():
    with pytest.raises(KeyboardInterrupt):
        with dataset._uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            landed = True  # reached: the interrupt waited for the block to end
    assert landed


# --- The command line -----------------------------------------------------------------------------------

def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    return err.strip()


def test_bad_arguments_are_one_sentence_and_exit_2(photos, tmp_path, capsys):
    a_file = tmp_path / "out.txt"
    a_file.write_text("")
    assert cli.main(["dataset", str(photos), "--out", str(a_file), "--quiet"]) == 2
    assert one_error_line(capsys) == (f"error: {a_file} is a file, not a folder; name a folder for the run's "
                                      "tables (it is created if missing).")
    latin1 = tmp_path / "list.txt"
    latin1.write_bytes("café.jpg\n".encode("latin-1"))
    assert cli.main(["dataset", str(latin1), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert one_error_line(capsys) == (f"error: {latin1} is not a UTF-8 text file (byte 3 is not UTF-8); a list "
                                      "file has one path a line, saved as UTF-8.")
    assert cli.main(["dataset", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert one_error_line(capsys).endswith("does not exist; name a folder of photos or a list file (one path a line).")
    for text, sentence in [("{not json", "is not valid JSON."),
                           ('{"fit": "../../etc"}', 'fit must be "crop" or "squash", not "../../etc".'),
                           ('{"model": null, "evil": 1}', 'has a setting that attnviz dataset never writes: "evil".')]:
        run = tmp_path / f"run{len(text)}"
        run.mkdir()
        (run / "run.json").write_text(text)
        assert cli.main(["dataset", str(photos), "--out", str(run), "--quiet"]) == 2
        assert one_error_line(capsys).endswith(sentence)
    assert not (tmp_path / "run").exists()  # nothing was created for arguments that cannot work


def test_ctrl_c_ends_with_one_line_and_the_same_command_continues(photos, good, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    analyse, batches = dataset.analyse, []

    def interrupted(*args, **kwargs):
        batches.append(1)
        if len(batches) == 2:
            raise KeyboardInterrupt
        return analyse(*args, **kwargs)

    monkeypatch.setattr(dataset, "analyse", interrupted)
    command = ["dataset", str(photos), "--out", str(out), "--size", str(SMALL), "--batch", "2", "--quiet"]
    assert cli.main(command) == 130
    assert one_error_line(capsys) == (f"interrupted: the batches already written to {out} are kept; run the same "
                                      "command again to continue.")
    monkeypatch.setattr(dataset, "analyse", analyse)
    assert cli.main(command) == 1  # notes.jpg is unusable
    assert "2 images and 1 unusable files" in (said := capsys.readouterr().out) and "2 already done" in said
    same_tables(read_run(out), read_run(good))


def test_a_real_ctrl_c_ends_with_one_line_and_leaves_whole_batches(photos, small_model, tmp_path):
    """SIGINT to a real `attnviz dataset` process once its first batch has landed."""
    import subprocess
    import sys

    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(60):
        shutil.copy(photos / "cat.jpg", folder / f"cat{i:02d}.jpg")
    out = tmp_path / "run"
    command = [sys.executable, "-m", "attnviz", "dataset", str(folder), "--out", str(out), "--size", str(SMALL),
               "--batch", "1", "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not parts(out, "images") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err == (f"interrupted: the batches already written to {out} are kept; run the same command again "
                   "to continue.\n")
    assert hidden_files(out) == [] and 1 <= len(parts(out, "images")) < 60
    one_row_per_head(out)
    run_local(folder, out, CONFIG, batch=8, progress=False, model=small_model)
    one_row_per_head(out)
    assert read_run(out).images.num_rows == 60


# --- Hostile run folders --------------------------------------------------------------------------------

def rewrite(part: Path, change) -> None:
    pq.write_table(change(pq.read_table(part)), part)


def set_value(table: pa.Table, column: str, row: int, value) -> pa.Table:
    values = table[column].to_pylist()
    values[row] = value
    return table.set_column(table.column_names.index(column), column, pa.array(values, table.schema.field(column).type))


def four_million_rows(part: Path) -> None:
    """A heads part of 4 000 000 rows, written a million at a time (it stays small on disk)."""
    n = 1_000_000
    chunk = pa.table({
        "path": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["/x.jpg"])),
        "digest": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array(["0" * 64])),
        **{c: pa.array(np.zeros(n, np.int32)) for c in ("layer", "head")},
        **{c: pa.array(np.zeros(n)) for c in ("entropy", "distance_px", "prefix_share")},
        "top_patch": pa.array(np.zeros(n, np.int32)), "mass60_fraction": pa.array(np.zeros(n)),
    })
    with pq.ParquetWriter(part, chunk.schema) as writer:
        for _ in range(4):
            writer.write_table(chunk)


def run_json(run: Path, **settings) -> None:
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, **settings}))


def add_layer(table: pa.Table) -> pa.Table:
    """Every photo of the part gets a 13th layer: a whole grid, but not the run's."""
    extra = table.filter(pc.equal(table["layer"], 11))
    return pa.concat_tables([table, extra.set_column(2, "layer", pa.array([12] * extra.num_rows, pa.int32()))])


def make_hostile(good: Path, root: Path) -> dict[str, tuple[str, str, int]]:
    """root/<case>: a copy of the good run with one hostile file; what each must say and keep:
    (the sentence's key, the file it names, the photos still shown)."""
    cases: dict[str, tuple[str, str, int]] = {}

    def case(name: str, key: str, table: str | None, kept: int = 2, index: int = 0) -> tuple[Path, Path | None]:
        run = root / name
        shutil.copytree(good, run)
        part = parts(run, table)[index] if table else None
        cases[name] = (key, f"{table}/{part.name}" if part else "run.json", kept)
        return run, part

    _, part = case("layer-3000000", "file_out_of_range", "heads")
    rewrite(part, lambda t: set_value(t, "layer", 5, 3_000_000))
    _, part = case("four-million-rows", "file_rows", "heads")
    four_million_rows(part)
    _, part = case("strings-in-numbers", "file_column_type", "heads")
    rewrite(part, lambda t: t.set_column(4, "entropy", pa.array([f"{v:.3f}" for v in t["entropy"].to_pylist()])))
    _, part = case("corrupt-parquet", "file_not_parquet", "heads")
    part.write_bytes(b"PAR1" + os.urandom(2000) + b"PAR1")
    _, part = case("wrong-schema", "file_column_missing", "images")
    rewrite(part, lambda t: t.drop_columns(["digest"]))
    _, part = case("part-is-a-fifo", "file_not_regular", "heads")
    part.unlink()
    os.mkfifo(part)
    _, part = case("part-is-dev-zero", "file_not_regular", "heads")
    part.unlink()
    part.symlink_to("/dev/zero")
    _, part = case("grid-with-a-hole", "file_grid", "heads")
    rewrite(part, lambda t: t.slice(1))
    _, part = case("thirteen-layers", "file_layout", "heads", kept=3, index=-1)  # rocket's batch
    rewrite(part, add_layer)
    _, part = case("errors-not-json", "file_bad_values", "errors", kept=4)
    rewrite(part, lambda t: set_value(t, "error_values", 0, "{not json"))
    _, part = case("bad-digest", "file_bad_values", "images")  # it would name captures/<digest>.npz
    rewrite(part, lambda t: set_value(t, "digest", 0, "../../../etc/passwd"))
    run, _ = case("run-json-broken", "file_not_json", None)
    (run / "run.json").write_text("{not json")
    run, _ = case("run-json-fit-escapes", "file_bad_setting", None)
    run_json(run, fit="../../etc")
    run, _ = case("run-json-size-huge", "file_bad_setting", None)
    run_json(run, size=10**9)
    run, _ = case("run-json-is-a-fifo", "file_not_regular", None)
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    run, _ = case("checkpoint-dev-zero", "file_not_regular", None, kept=4)
    cases["checkpoint-dev-zero"] = ("file_not_regular", "zero", 4)
    run_json(run, model="vit_tiny_patch16_224", checkpoint="/dev/zero")
    return cases


@pytest.fixture(scope="module")
def hostile(good, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    shutil.copytree(good, root / "a-good-run")
    return root, make_hostile(good, root)


RUN_LEVEL = {"file_not_json", "file_bad_setting", "file_not_regular"}


def test_each_hostile_file_is_one_sentence_naming_it_and_the_rest_of_the_run_opens(hostile):
    root, cases = hostile
    whole = runfiles.open_run(root / "a-good-run")
    assert (whole.images.num_rows, whole.num_layers, whole.num_heads, whole.left_out) == (4, 12, 6, ())
    assert whole.heads.num_rows == 4 * ROWS_PER_IMAGE and whole.errors.num_rows == 1
    for name, (key, named, kept) in cases.items():
        if named == "run.json":
            with pytest.raises(RunFileError) as caught:
                runfiles.open_run(root / name)
            problem = caught.value
        elif name == "checkpoint-dev-zero":  # the tables are fine; the model cannot be loaded (the page says so)
            run = runfiles.open_run(root / name)
            assert run.left_out == () and run.info.checkpoint == "/dev/zero"
            problem = pytest.raises(RunFileError, runfiles.check_file, run.info.checkpoint, None, "zero").value
        else:
            run = runfiles.open_run(root / name)
            assert [e.key for e in run.left_out] == [key], (name, [str(e) for e in run.left_out])
            problem = run.left_out[0]
            assert run.images.num_rows == kept, name  # the batch of the bad part is left out, the rest is shown
            assert run.heads.num_rows == kept * ROWS_PER_IMAGE and (run.num_layers, run.num_heads) == (12, 6)
        assert problem.key == key and str(problem).startswith(named), (name, str(problem))
        assert "\n" not in str(problem) and str(problem).endswith("."), str(problem)
    big = runfiles.open_run(root / "four-million-rows").left_out[0]
    assert str(big).endswith("has 4000000 rows; a part file may have at most 1000000.")
    fit = pytest.raises(RunFileError, runfiles.open_run, root / "run-json-fit-escapes").value
    assert str(fit) == 'run.json: fit must be "crop" or "squash", not "../../etc".'


def test_a_run_larger_than_the_page_opens_is_refused_in_one_sentence(good, monkeypatch):
    monkeypatch.setattr(runfiles, "MAX_RUN_ROWS", 3 * ROWS_PER_IMAGE)
    with pytest.raises(RunFileError, match=r"^good holds more than 216 rows, more than this page opens; "):
        runfiles.open_run(good)


def test_the_signature_of_a_hostile_run_never_fails(hostile):
    root, cases = hostile
    for name in cases:
        assert isinstance(runfiles.signature(root / name), tuple)
    assert runfiles.signature(root / "nowhere") == runfiles.signature(root / "nowhere")


def plain(text: str) -> str:
    return text.replace("\\", "")  # names are Markdown-escaped on the page


def peak_mb() -> float:
    """Peak resident memory of this process since the last reset_peak() (VmHWM), in MB."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
        return True
    except OSError:
        return False


@pytest.mark.parametrize("lang", ["en", "zh-TW"])
def test_the_page_opens_every_hostile_run_with_one_sentence_and_bounded_memory(hostile, monkeypatch, lang):
    root, cases = hostile
    monkeypatch.setenv("ATTNVIZ_DATASETS", str(root))
    # AppTest formats the translated widgets outside the page's run, in the default language: make it this one.
    monkeypatch.setattr(i18n, "DEFAULT", lang)
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = lang
    at.switch_page("screens/dataset.py").run()
    box = at.selectbox(key="dataset_run")
    assert box.value == str(root / "a-good-run") and len(box.options) == len(cases) + 1
    assert not at.exception and not at.error and not at.warning
    assert len([img for el in at.get("image") for img in el.proto.imgs]) == 4
    reset = reset_peak()
    before = peak_mb()
    for name, (key, named, kept) in cases.items():
        at.selectbox(key="dataset_run").select(str(root / name)).run()
        assert not at.exception, (name, [e.value for e in at.exception])
        said = [plain(m.value) for m in [*at.error, *at.warning]]
        assert len(said) == 1 and Path(named).name in said[0], (name, said)
        assert str(root) not in said[0] and "/dev/zero" not in said[0]
        if named.startswith(("heads/", "images/", "errors/")):  # left out: the rest of the run is shown
            assert len(at.get("vega_lite_chart")) == 1
            assert at.selectbox(key="dataset_layer").options == [str(n) for n in range(1, 13)]
            assert len([img for el in at.get("image") for img in el.proto.imgs]) == kept
        elif name == "checkpoint-dev-zero":
            assert said[0] == plain(i18n.text(lang, "dataset.map_model", reason=runfiles.sentence(
                lang, "file_not_regular", {"name": "zero", "kind": "device"})))
        else:
            assert said[0] == runfiles.sentence(lang, key, pytest.raises(
                RunFileError, runfiles.open_run, root / name).value.values)
    grew = peak_mb() - before
    print(f"{lang}: {len(cases)} hostile runs opened; peak resident memory {grew:+.0f} MB "
          f"({'peak reset' if reset else 'peak since start'})")
    assert grew < 300  # the 4-million-row part alone took +1.55 GB before it was checked by its footer
    at.selectbox(key="dataset_run").select(str(root / "a-good-run")).run()  # the good run still opens
    assert not at.exception and not at.error and not at.warning
    assert len([img for el in at.get("image") for img in el.proto.imgs]) == 4


def test_a_readable_file_that_is_not_an_image_is_not_called_unreadable(good, tmp_path, monkeypatch):
    """The images table of a run names a text file (with its true digest): the page says it is not an
    image, not that it is "no longer readable"."""
    root = tmp_path / "root"
    run = root / "text"
    shutil.copytree(good, run)
    text = tmp_path / "aaa-notes.jpg"  # first in path order: shown under every head
    text.write_text("not a picture")
    digest = hashlib.sha256(text.read_bytes()).hexdigest()
    old = parts(run, "images")[0]
    cat = pq.read_table(old)["path"][0].as_py()
    rewrite(old, lambda t: set_value(set_value(t, "path", 0, str(text)), "digest", 0, digest))
    heads = parts(run, "heads")[0]
    rewrite(heads, lambda t: t.set_column(0, "path", pa.array([str(text) if p == cat else p for p in t["path"].to_pylist()])))
    monkeypatch.setenv("ATTNVIZ_DATASETS", str(root))
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["lang"] = "en"
    at.switch_page("screens/dataset.py").run()
    assert not at.exception and not at.error
    assert [plain(w.value) for w in at.warning] == [
        i18n.text("en", "images.unreadable", name="aaa-notes.jpg", formats=i18n.text("en", "images.formats"))]
    assert "no longer" not in at.warning[0].value and str(tmp_path) not in at.warning[0].value
    assert len([img for el in at.get("image") for img in el.proto.imgs]) == 3
