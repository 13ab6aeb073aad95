"""`gpuq history`: sacct for the queue. The jobs that ran or ended in a window, filtered by
owner, state, name and host, as a table of chosen columns or as JSON (view.py)."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import sys
import time
from typing import Any, Callable

from gpuq.cli.common import open_layout
from gpuq.extras.history import DEFAULT_HISTORY_COLUMNS, DEFAULT_SINCE, HISTORY_COLUMNS
from gpuq.extras.history.view import ROW_STATES, HistoryFilter, history
from gpuq.model.moments import parse_moment
from gpuq.model.states import states_named
from gpuq.model.text import safe_text
from gpuq.model.units import format_clock
from gpuq.views.render import clip, stamp, table, where


def _when(t: Any) -> str:
    return stamp(t, "%m-%d %H:%M") if t is not None else "-"


# Each column: its heading and how a row shows in it. The last column is never padded.
COLUMNS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "id": ("ID", lambda r: r["id"]),
    "user": ("USER", lambda r: r["user"] or "?"),
    "name": ("NAME", lambda r: r["name"]),
    "state": ("STATE", lambda r: r["state"]),
    "exit": (
        "EXIT",
        lambda r: f"sig{r['signal']}" if r["signal"] else "-" if r["exit_code"] is None else str(r["exit_code"]),
    ),
    "start": ("START", lambda r: _when(r["start"])),
    "end": ("END", lambda r: _when(r["end"]) if r["end"] is not None else "-"),
    "elapsed": ("ELAPSED", lambda r: format_clock(int(r["elapsed_s"])) if r["elapsed_s"] is not None else "-"),
    "where": ("HOST:GPUS", lambda r: where(r["host"], r["gpus"])),
    "attempts": ("ATT", lambda r: str(r["attempts"])),
    "preempted": ("PRE", lambda r: str(r["preemptions"])),
    "reason": ("REASON", lambda r: r["reason"] or ""),
}
assert tuple(COLUMNS) == HISTORY_COLUMNS  # the names --help lists (__init__.py)
# sacct's --format names, read as the columns they are.
SLURM_COLUMNS = {"jobid": "id", "jobname": "name", "exitcode": "exit", "nodelist": "where", "restarts": "attempts"}


def cmd_history(args: argparse.Namespace) -> int:
    try:
        wanted = _filter(args, time.time())
        columns = _columns(args.format)
    except ValueError as e:
        print(f"gpuq history: {e}", file=sys.stderr)
        return 2
    found = history(open_layout(args), wanted, time.time())
    if args.json:
        print(json.dumps(found, separators=(",", ":")))
        return 0
    jobs = found["jobs"]
    rows = [[heading for heading, _ in columns], *([safe_text(show(row)) for _, show in columns] for row in jobs)]
    if args.parsable2:  # sacct -P: every value whole, | between (one in a value, a name, is shown as ¦)
        print("\n".join("|".join(value.replace("|", "¦") for value in row) for row in rows))
        return 0
    if jobs:
        width = shutil.get_terminal_size((80, 24)).columns  # as status: the terminal's, 80 in a pipe
        print(
            "\n".join(clip(line.rstrip(), width) if not args.wide else line.rstrip() for line in table(rows, indent=""))
        )
    count = f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}"
    if wanted.ids is not None and not args.since:  # -j: the jobs whenever they ran, no window
        print(f"{count} of those named (-j), whenever they ran", file=sys.stderr)
    else:
        print(
            f"{count} from {stamp(wanted.since, '%Y-%m-%d %H:%M')} to {stamp(wanted.until, '%Y-%m-%d %H:%M')}"
            + ("" if args.since else " (the last day; --since 7d, --since 2026-11-01 for more)"),
            file=sys.stderr,
        )
    for log, n in sorted(found["skipped_events"].items()):
        print(f"gpuq history: skipped {n} line(s) of state/events/{log} that are not gpuq's events", file=sys.stderr)
    return 0


def _filter(args: argparse.Namespace, now: float) -> HistoryFilter:
    """The filter the options ask for; ValueError naming the option and its accepted forms."""
    since = _moment("--since", args.since or DEFAULT_SINCE, now)
    until = _moment("--until", args.until, now) if args.until else now
    if until < since:
        raise ValueError(f"--until ({args.until}) is before --since ({args.since or DEFAULT_SINCE}); swap them")
    users = frozenset({pwd.getpwuid(os.getuid()).pw_name}) if args.me else _listed(args.user)
    states = None
    if args.state:
        states = frozenset(states_named(args.state))
        if unknown := sorted(states - ROW_STATES):
            raise ValueError(
                f"--state {', '.join(unknown)}: not a state history lists; use {', '.join(sorted(ROW_STATES))}"
            )
    names = tuple(sorted(_listed(args.name) or ())) or None
    jobs = _listed(args.jobs)
    if jobs is not None and not args.since:  # sacct -j: the job whenever it ran
        since = 0.0
    return HistoryFilter(since, until, users, states, names, _listed(args.host), jobs)


def _moment(option: str, text: str, now: float) -> float:
    try:
        return parse_moment(text, now)
    except ValueError as e:
        raise ValueError(f"{option} {e}") from None


def _listed(text: str | None) -> frozenset[str] | None:
    return frozenset(part.strip() for part in text.split(",") if part.strip()) if text else None


def _columns(asked: str | None) -> list[tuple[str, Callable[[dict[str, Any]], str]]]:
    # sacct's widths (`jobname%30`) are read past: a column is as wide as what it holds.
    words = [n.strip().lower().partition("%")[0] for n in asked.split(",")] if asked else []
    names = [SLURM_COLUMNS.get(n, n) for n in words]
    if unknown := [n for n in names if n not in COLUMNS]:
        raise ValueError(f"--format {', '.join(unknown)}: no such column; choose from {', '.join(COLUMNS)}")
    return [COLUMNS[n] for n in names or DEFAULT_HISTORY_COLUMNS]
