"""`gpuq top` in a real terminal (tmux, 80x24 and 200x50): running and pending first, one line
per job, never wrapped, cut to the rows there are."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from conftest import PY, REPO, wait_until

pytestmark = pytest.mark.slow  # every test here starts processes

LONG = "python train.py " + " ".join(f"--option-{i}=value-{i}" for i in range(20))


@pytest.fixture
def tmux(tmp_path):
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed here")
    socket = str(tmp_path / "tmux.sock")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", socket, *args], capture_output=True, text=True, timeout=30)

    yield run
    run("kill-server")


def _screen(tmux, joined: bool = False) -> list[str]:
    out = tmux("capture-pane", "-p", *(["-J"] if joined else []), "-t", "top").stdout
    return out.rstrip("\n").split("\n")


def _frame(tmux) -> tuple[list[str], list[str]] | None:
    """One whole frame of top, captured plain and with wrapped lines joined; None while it is
    not to be had. top clears the screen and draws it again every 0.5 s, and a capture taken
    while it draws holds part of a frame: the plain captures before and after the joined one
    must agree (but for the clock in the title), and the joined one must end as they do."""
    before = _screen(tmux)
    joined = _screen(tmux, joined=True)
    after = _screen(tmux)
    if before[1:] != after[1:] or joined[-1] != before[-1] or not any(line.startswith("PENDING") for line in before):
        return None
    return before, joined


@pytest.mark.parametrize("columns,rows", [(80, 24), (200, 50)])
def test_top_fits_the_terminal_running_and_pending_first(queue, tmux, columns, rows):
    queue.start_worker("a", "2x80GiB")
    # Specs dropped into jobs/ (a submit each would cost a CLI start, 32 of them: top shows
    # jobs the same however they came).
    for i in range(2):
        queue.drop(f"run-{i}.yaml", f"command: {json.dumps(f'sleep 600; {LONG}')}\ngpus: 1\n")
    for i in range(30):
        queue.drop(f"wait-{i:02d}.yaml", f"command: {json.dumps(LONG)}\ngpus: 2\n")
    wait_until(
        lambda: all((queue.record(f"run-{i}") or {}).get("state") == "running" for i in range(2)),
        what="two jobs to run",
    )
    command = f"{PY} {REPO / 'gpuq.py'} --root {queue.root} top --interval 0.5"
    done = tmux("new-session", "-d", "-s", "top", "-x", str(columns), "-y", str(rows), command)
    assert done.returncode == 0, done.stderr
    screen, joined = wait_until(lambda: _frame(tmux), what="a whole frame of top's screen")
    assert len(screen) <= rows and all(len(line) <= columns for line in screen), screen
    assert len(joined) == len(screen), "a line wrapped"
    headers = [line.split(" ")[0] for line in screen if line[:1].isupper()]
    assert headers.index("RUNNING") < headers.index("PENDING"), screen
    assert "HOSTS" not in headers or headers.index("PENDING") < headers.index("HOSTS"), screen
    for job in ("run-0", "run-1"):  # each job on one line of RUNNING, its long command clipped
        (line,) = [line for line in screen if f" {job} " in f" {line} " and "sleep 600" in line]
        assert line.endswith("…"), line
    (line,) = [line for line in screen if " wait-00 " in line]
    assert "needs 2 GPUs" in line, line
    if rows == 24:  # 30 pending and two hosts' tables do not fit: cut, and said so
        assert screen[-1].startswith("... ") and "more lines" in screen[-1], screen
    else:
        assert "HOSTS" in headers and "FINISHED" in headers, "\n".join(screen)


def test_top_redraws_the_status_screen(queue):
    queue.start_worker("a", "1x80GiB")
    out = queue.gpuq("top", "--interval", "0.2", "--iterations", "2").stdout
    assert out.count("gpuq top · ") == 2 and out.count("HOSTS") == 2
