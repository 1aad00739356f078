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
