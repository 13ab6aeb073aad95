"""What every verb's handler needs: the queue root it works on, its config, the one job id rule
for ids typed on the command line, and the command after `--`."""

from __future__ import annotations

import argparse
import sys

from gpuq.model.config import Config, load
from gpuq.model.names import ID_RULE, JOB_ID_RE
from gpuq.model.text import safe_text
from gpuq.spool.layout import Layout, RootError, resolve_root


def open_layout(args: argparse.Namespace) -> Layout:
    layout = Layout(resolve_root(args.root, args.launcher_dir))
    if not layout.jobs.is_dir():
        raise RootError(f"{layout.root} is not a gpuq root (no jobs/ directory); pass --root or set GPUQ_ROOT")
    try:
        layout.ensure()
    except PermissionError:
        pass  # a team member's CLI: the worker's account made the spool (docs/security.md)
    return layout


def read_config(layout: Layout) -> "Config":
    return load(layout.config_file)


def refuse_bad_id(verb: str, job_id: str) -> bool:
    """True, after one line on stderr, when `job_id` breaks the one id rule: ids become file
    names, so `../x`, `*` or 5,000 characters must not reach a path."""
    if JOB_ID_RE.fullmatch(job_id):  # fullmatch: the rule's `$` would let a trailing newline by
        return False

    shown = safe_text(job_id if len(job_id) <= 40 else f"{job_id[:40]}… ({len(job_id)} characters)")
    print(
        f"gpuq {verb}: '{shown}' is not a job id (ids are {ID_RULE}); gpuq status lists the jobs",
        file=sys.stderr,
    )
    return True


def command_after_dashdash(command: list[str]) -> list[str]:
    """argparse's REMAINDER keeps the `--` that separates gpuq's options from the command."""
    return command[1:] if command[:1] == ["--"] else command
