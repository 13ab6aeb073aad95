"""The CLI builds the parser of the verb a command runs, not every verb's: each command's start
(20 ms of building all of them) is what the team waits for in `gpuq status`. What a user sees
of the parser stays as it was: the verb's own usage and errors, the whole list for `--help`
and a mistyped verb, every verb and option in the completion script, `gpuq run` submitting
through submit's options."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import gpuq

import gpuq.cli as cli
from gpuq import hooks

EXTRAS_VERBS = [verb.name for verb in hooks.registry().verbs]  # none where every extra is deleted


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        (["status"], "status"),
        (["--root", "/q", "status", "--json"], "status"),
        (["--root=/q", "submit", "--", "true"], "submit"),
        (["--root", "/q"], None),
        (["--help"], None),
        (["-V"], None),
        (["--ro", "/q", "status"], None),  # argparse's abbreviation: the whole parser reads it
        ([], None),
    ],
)
def test_the_verb_is_read_past_the_root_option(argv: list[str], verb: str | None):
    assert cli._verb_in(argv) == verb


@pytest.fixture
def root(tmp_path: Path) -> Path:
    made = tmp_path / "root"
    assert gpuq(tmp_path, "init", str(made)).returncode == 0
    return made


@pytest.fixture
def built(root: Path, monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The `only` of every parser a command builds, in order."""
    asked: list[str | None] = []
    real = cli.build_parser

    def recording(only: str | None = None):
        asked.append(only)
        return real(only)

    monkeypatch.setattr(cli, "build_parser", recording)
    return asked


def test_a_command_builds_its_verbs_parser_alone(root: Path, built: list[str | None]):
    assert gpuq(root, "status").returncode == 0
    assert built == ["status"]
    parser = cli.build_parser("status")
    assert list(cli._verbs_of(parser).choices) == ["status"]


def test_a_mistyped_verb_gets_the_nearest_from_the_whole_list(root: Path, built: list[str | None]):
    typo = gpuq(root, "stauts", check=False)
    assert typo.returncode == 2 and "unknown verb 'stauts'; did you mean status?" in typo.stderr, typo
    assert built == ["stauts", None]
    habit = gpuq(root, "squeue", check=False)
    assert habit.returncode == 2 and "Slurm's squeue is gpuq status" in habit.stderr, habit


def test_the_verbs_own_usage_and_the_whole_help_are_as_before(root: Path, built: list[str | None]):
    bad = gpuq(root, "status", "--bogus", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("usage: gpuq status ") and "--bogus" in bad.stderr, bad
    whole = gpuq(root, "--help", check=False)
    listed = ("status", "submit", "cancel", *EXTRAS_VERBS)
    assert whole.returncode == 0 and all(f"    {verb} " in whole.stdout for verb in listed), whole.stdout


def test_the_completion_script_still_lists_every_verb_and_its_options(root: Path, built: list[str | None]):
    script = gpuq(root, "completion", "bash").stdout
    assert built == [None]
    for word in ("status", "submit", "cancel", "--gpu-mem", "--shares", *EXTRAS_VERBS):
        assert word in script, word


def test_an_extras_verb_builds_alone_too(root: Path, built: list[str | None]):
    if not EXTRAS_VERBS:
        pytest.skip("no extra that adds a verb is installed (the core-alone copy)")
    verb = EXTRAS_VERBS[0]
    usage = gpuq(root, verb, "--help", check=False)
    assert usage.returncode == 0 and usage.stdout.startswith(f"usage: gpuq {verb}"), usage
    assert built == [verb]
