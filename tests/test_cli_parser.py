"""The CLI builds the parser of the verb a command runs, not every verb's: each command's start
(20 ms of building all of them) is what the team waits for in `gpuq status`. What a user sees
of the parser stays as it was: the verb's own usage and errors, the whole list for `--help`
and a mistyped verb, every verb and option in the completion script, and what is said of the
extras on every command. (`gpuq run` submitting through submit's parser: the interactive
extra's tests.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import gpuq

import gpuq.cli as cli
from gpuq import hooks
from gpuq.cli.common import verbs_of

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


@pytest.mark.parametrize("verb", sorted(cli.CORE_VERB_NAMES | set(EXTRAS_VERBS)))
def test_each_verb_builds_alone(verb: str):
    assert list(verbs_of(cli.build_parser(verb)).choices) == [verb]


def test_a_mistyped_verb_gets_the_nearest_from_the_whole_list(root: Path, built: list[str | None]):
    typo = gpuq(root, "stauts", check=False)
    assert typo.returncode == 2 and "unknown verb 'stauts'; did you mean status?" in typo.stderr, typo
    assert built == ["stauts", None]
    habit = gpuq(root, "squeue", check=False)
    assert habit.returncode == 2 and "Slurm's squeue is gpuq status" in habit.stderr, habit


def test_the_verbs_own_usage_and_the_whole_help_are_as_before(root: Path):
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


def test_an_extras_verb_is_set_up_only_when_it_runs_and_what_is_left_out_is_said_every_time(
    root: Path, monkeypatch: pytest.MonkeyPatch
):
    """An extra's verb setup runs only where its verb is built (one that reads its parser, or
    breaks, no longer touches other verbs); a verb named as one of gpuq's own is left out, and
    every command says so once, whichever verb it runs."""
    set_up: list[str] = []

    def setup(parser) -> None:
        set_up.append(parser.prog)
        parser.add_argument("--mine", action="store_true", help=(parser.description or "") + " (an extra's)")

    extra_verbs = [
        hooks.Verb("mine", "an extra's own verb", setup, "cli.status:cmd_status"),
        hooks.Verb("status", "an extra's status", setup, "cli.status:cmd_status"),
    ]
    monkeypatch.setattr(hooks.registry(), "verbs", [*hooks.registry().verbs, *extra_verbs])
    said = "an extra's verb 'status' (cli.status:cmd_status) is one of gpuq's own: left out"
    shown = gpuq(root, "show", "nosuch", check=False)
    assert shown.returncode == 1 and shown.stderr.count(said) == 1, shown
    assert set_up == []
    mine = gpuq(root, "mine", "--help")
    assert "--mine" in mine.stdout and mine.stderr.count(said) == 1 and set_up == ["gpuq mine"], mine
    status = gpuq(root, "status", "--help")
    assert "--mine" not in status.stdout and status.stderr.count(said) == 1, status
