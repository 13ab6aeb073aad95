"""History, an extra: `gpuq history`, sacct for the queue. The jobs that ran or ended in a
window, filtered by owner, state, name and host, as a table of chosen columns or as JSON,
read from the event logs the workers keep (view.py reads them, cli.py shows them). The core's
`status` shows the latest few ended jobs; this shows all of them. README.md here is its page.

Every gpuq process imports this module, root's `gpuq` too: it imports nothing but the
registry's types; the verb's handler is loaded only when `gpuq history` runs.
"""

from __future__ import annotations

import argparse

from gpuq.hooks import Registry, Verb

# `gpuq history`'s columns (cli.py shows each) and its default window.
HISTORY_COLUMNS = (
    "id", "user", "name", "state", "exit", "start", "end", "elapsed", "where", "attempts", "preempted", "reason"
)  # fmt: skip
DEFAULT_HISTORY_COLUMNS = ("id", "user", "name", "state", "exit", "start", "elapsed", "where", "reason")
DEFAULT_SINCE = "1d"


def _arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "-S",
        "--since",
        "--starttime",
        metavar="WHEN",
        help=f"from this moment: yesterday, 7d, now-2h, 2026-11-01, '2026-11-01 14:00' (default: {DEFAULT_SINCE})",
    )
    sp.add_argument("-E", "--until", "--endtime", metavar="WHEN", help="up to this moment (default: now)")
    who = sp.add_mutually_exclusive_group()
    who.add_argument("--me", action="store_true", help="only my jobs")
    who.add_argument("-u", "--user", help="only these users' jobs (comma-separated)")
    sp.add_argument(
        "-s",
        "--state",
        help="only these states (comma-separated): done, failed, cancelled, timeout, lost, rejected, running; "
        "or sacct's CD, F, CA, TO, NF, R and their long names",
    )
    sp.add_argument("-n", "--name", help="only jobs of these names (comma-separated; shell patterns: 'train-*')")
    sp.add_argument("--host", help="only jobs that ran on these hosts (comma-separated)")
    sp.add_argument("-j", "--jobs", metavar="ID", help="only these jobs (comma-separated; a group's id: its members)")
    sp.add_argument(
        "-o",
        "--format",
        help=f"the columns, comma-separated, from: {', '.join(HISTORY_COLUMNS)} (default: "
        f"{', '.join(DEFAULT_HISTORY_COLUMNS)})",
    )
    sp.add_argument("--json", action="store_true", help="every column of every row, as JSON")
    sp.add_argument(
        "-w", "--wide", action="store_true", help="lines whole (default: cut to the terminal, 80 columns in a pipe)"
    )
    sp.add_argument("-P", "--parsable2", "--parsable", action="store_true", help="columns joined by | (sacct's -P)")
    sp.add_argument("-X", "--allocations", action="store_true", help="sacct's: taken as it is (gpuq has no job steps)")


def register(registry: Registry) -> None:
    registry.verbs.append(
        Verb(
            "history",
            "the jobs that ran or ended in a window (sacct): who, what, how it ended, where, how long",
            _arguments,
            "extras.history.cli:cmd_history",
            slurm="sacct",
        )
    )
