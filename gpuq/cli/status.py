"""`gpuq status` and `gpuq top`: where the team stands, from the spool as it is."""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import sys
import time

from gpuq.cli.common import open_layout, read_config
from gpuq.model.states import FINAL_STATES, State, states_named
from gpuq.views.joblist import column_names, jobs_table
from gpuq.views.render import PENDING_SHOWN, clip, shares_text, status_text, top_screen
from gpuq.views.status import SECTIONS, narrowed, status


def cmd_status(args: argparse.Namespace) -> int:
    try:
        columns = column_names(args.format) if args.format else None
        states = _states(args.state) if args.state else None
    except ValueError as e:
        print(f"gpuq status: {e}", file=sys.stderr)
        return 2
    layout = open_layout(args)
    user = pwd.getpwuid(os.getuid()).pw_name if args.me else args.user
    if user is not None and not args.me and not _known_user(user):
        print(f"gpuq status: warning: no user named {user!r} on this box", file=sys.stderr)
    ids = _listed(args.jobs, *args.ids)
    names = _listed(args.name)
    narrow = user is not None or states is not None or ids is not None or names is not None
    rows = None if args.json or args.all or narrow or args.format else PENDING_SHOWN
    final = states - set(SECTIONS) if states is not None and "finished" not in states else None
    view = status(layout, read_config(layout), pending_rows=rows, ended=final or None, ended_user=user)
    if narrow:
        view = narrowed(view, user, states, ids, names)
    if args.json:
        print(json.dumps(view, separators=(",", ":")))  # 10,000 pending jobs: compact is twice as fast
        return 0
    if columns:
        text = jobs_table(view, columns)
    elif args.shares:
        text = shares_text(view)
    else:
        sections = None if states is None else frozenset(s if s in SECTIONS else "finished" for s in states)
        text = status_text(view, show_all=args.all, only=sections)
    # As wide as the terminal ($COLUMNS, else 80 into a pipe); --wide: every line whole.
    width = shutil.get_terminal_size((80, 24)).columns
    lines = text.split("\n")
    if not args.wide and any(len(line) > width for line in lines):
        lines = [clip(line, width) for line in lines] + [
            f"(lines cut at {width} columns: gpuq status -w shows them whole)"
        ]
    print("\n".join(lines))
    return 0


STATUS_STATES = (*SECTIONS, *sorted(s.value for s in FINAL_STATES - {State.REJECTED}))


def _listed(*texts: str | None) -> tuple[str, ...] | None:
    """Comma-separated values given (to -j, -n, or as words), None for none."""
    values = tuple(v.strip() for text in texts if text for v in text.split(",") if v.strip())
    return values or None


def _states(text: str) -> frozenset[str]:
    """--state's sections or final states, Slurm's codes too (PD: pending and held)."""
    states = frozenset(states_named(text))
    if unknown := sorted(states - set(STATUS_STATES)):
        raise ValueError(
            f"--state {', '.join(unknown)}: choose from {', '.join(STATUS_STATES)} or Slurm's PD, R, CD, F, CA, TO"
        )
    return states


def _known_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def cmd_top(args: argparse.Namespace) -> int:
    """`gpuq top`: the status screen, redrawn every --interval seconds until Ctrl-C."""

    layout = open_layout(args)
    config = read_config(layout)
    shown = 0
    try:
        while args.iterations is None or shown < args.iterations:
            text = status_text(status(layout, config), show_all=False)
            title = f"gpuq top · {time.strftime('%H:%M:%S')} · every {args.interval:g}s · Ctrl-C quits"
            if sys.stdout.isatty():  # fitted to the terminal, as it is now (it may have been resized;
                size = os.get_terminal_size(sys.stdout.fileno())  # an exported COLUMNS would not say)
                sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(top_screen(title, text, size.columns, size.lines)))
                sys.stdout.flush()
            else:  # into a pipe or a file: all of it
                print(f"{title}\n{text}", flush=True)
            shown += 1
            if args.iterations is None or shown < args.iterations:
                time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    return 0
