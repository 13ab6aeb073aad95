"""No raw open, rename or link of a path in gpuq outside host/safefile.py and host/files.py
unless it provably follows no link or was reviewed (tools/file_calls.py says why each is)."""

from __future__ import annotations

from pathlib import Path

from tools.file_calls import REVIEWED, raw_calls, unreviewed


def test_every_raw_file_call_follows_no_link_or_was_reviewed() -> None:
    assert [f"{c.module}:{c.line} {c.function} os.{c.call}" for c in unreviewed(raw_calls())] == []


def test_every_reviewed_call_is_still_there() -> None:
    """A reason left for a call that moved or went would approve the next one made there unread.
    An extra's folder deleted (tests/test_extras.py) takes its calls and their reasons with it."""
    found = {c.key for c in raw_calls()}
    extras = Path(__file__).resolve().parent.parent / "gpuq" / "extras"
    gone = {k for k in REVIEWED if k[0].startswith("gpuq.extras.") and not (extras / k[0].split(".")[2]).is_dir()}
    assert sorted(set(REVIEWED) - found - gone) == []


def test_a_new_raw_open_is_caught_and_one_without_following_links_is_not(tmp_path: Path) -> None:
    package = tmp_path / "gpuq"
    (package / "spool").mkdir(parents=True)
    (package / "spool" / "new.py").write_text(
        "import os\n"
        "def careless(path):\n"
        "    return os.open(path, os.O_RDONLY)\n"
        "def careful(path):\n"
        "    flags = os.O_RDONLY | os.O_NOFOLLOW\n"
        "    return os.open(path, flags)\n"
        "def moved(a, b):\n"
        "    os.rename(a, b)\n"
    )
    calls = raw_calls(package)
    assert [(c.function, c.call) for c in unreviewed(calls)] == [("careless", "open"), ("moved", "rename")]
    assert [c.function for c in calls if c.no_follow] == ["careful"]
