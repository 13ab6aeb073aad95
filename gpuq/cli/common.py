"""What every verb's handler needs: the queue root it works on, its config, the one job id rule
for ids typed on the command line, and the command after `--`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NamedTuple

from gpuq.host import privsep, rootorders
from gpuq.host.owners import writable_by_others
from gpuq.host.wire import Refused
from gpuq.model.config import Config, load
from gpuq.model.names import ID_RULE, JOB_ID_RE
from gpuq.model.text import safe_text
from gpuq.spool import strictmodes
from gpuq.spool.layout import Layout, RootError, resolve_root


def verbs_of(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    """The CLI parser's verbs: each one's parser by name (`choices`)."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


class CannotDrop(NamedTuple):
    """Why root's gpuq will not act as the queue's account here: doctor's check and fix."""

    check: str
    message: str
    fix: str


def act_as_queue_account(args: argparse.Namespace) -> CannotDrop | None:
    """Root's gpuq on a team root acts as the queue's account (the owner of state/): it reads
    members' specs and logs and writes the spool as the workers do, never as root, with a
    root part beside it for what needs root (docs/security.md). Returns why it cannot, before
    anything was done; None once it acts as the queue's account (or has no need to)."""
    try:
        layout = Layout(resolve_root(args.root, args.launcher_dir))
        account = privsep.Account.of_root(str(layout.root))
    except (RootError, Refused, OSError):
        return None  # the verb says what is wrong with the root (or why this root cannot read it)
    team_root = layout.jobs.is_dir() and writable_by_others(os.stat(layout.jobs).st_mode)
    if problem := strictmodes.queue_account_problem(layout, account.uid, person_ok=not team_root):
        message, fix = problem.rsplit(" Fix: ", 1)
        return CannotDrop("permissions", message, fix)
    try:
        fd = privsep.split(account)
    except OSError as e:  # a root that cannot change its identity: a user namespace's
        return CannotDrop(
            "permissions",
            f"root cannot become the queue's account (uid {account.uid}) here: {e.strerror or e}",
            "run gpuq as the box's real root, or as a member",
        )
    if fd is not None:
        rootorders.connect(fd)
    for needed in (os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(__file__))):
        if not os.access(needed, os.R_OK | os.X_OK):
            return CannotDrop(
                "reachable",
                f"root acts as the queue's account (uid {account.uid}) in a team root, and that account cannot "
                f"read {needed}",
                "run gpuq from a venv every member can reach (README: On a GPU box)",
            )
    return None


def open_layout(args: argparse.Namespace) -> Layout:
    layout = Layout(resolve_root(args.root, args.launcher_dir))
    if not layout.jobs.is_dir():
        raise RootError(f"{layout.root} is not a gpuq root (no jobs/ directory); pass --root or set GPUQ_ROOT")
    try:
        layout.ensure()
    except PermissionError:
        pass  # a team member's CLI: the worker's account made the spool (docs/security.md)
    return layout


_SAID: set[str] = set()  # the config's problems already told, once per command


def read_config(layout: Layout) -> "Config":
    """The queue's config as the CLI reads it: a bad value is told on stderr and its default
    stands in (the team keeps its status and logs while the admin fixes it); the workers read
    it strictly, refuse to start and say why in their log, and `gpuq doctor` reports it."""
    problems: list[str] = []
    config = load(layout.config_file, problems)
    for problem in problems:
        if problem not in _SAID:
            _SAID.add(problem)
            print(
                f"gpuq: warning: {problem} (read here as its default; the workers do not start until an admin "
                "fixes it: gpuq doctor)",
                file=sys.stderr,
            )
    return config


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
