"""The workflow verbs: hold / release / retry / edit, drain / resume, and sweeps and arrays
handled as one group (submit --array, show GROUP, cancel GROUP)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

from gpuq.cli.common import act_as_queue_account, open_layout, refuse_bad_id
from gpuq.cli.completion import did_you_mean
from gpuq.cli.doctor import Finding, as_json, check_reachable, check_squashing, diagnose
from gpuq.cli.initroot import InitError, cron_line, init_root
from gpuq.cli.placeable import check_placeable
from gpuq.cli.requests import WAITING, run_request
from gpuq.model.config import load as load_config
from gpuq.model.errors import SpecError
from gpuq.model.spec import parse_spec_text
from gpuq.model.text import safe_text
from gpuq.spool.deps import FINAL, DependencyStates
from gpuq.spool.holds import held_spec
from gpuq.spool.inbox import MAX_IDS
from gpuq.spool.intake import read_spec_file
from gpuq.spool.layout import Layout
from gpuq.spool.submit import SubmitError
from gpuq.spool.sweeps import being_expanded, read_group
from gpuq.spool.teamstate import load_heartbeats
from gpuq.views.selection import JobFilter, matching, states_asked


def show_group(layout, args: argparse.Namespace) -> int:
    """`gpuq show GROUP`: a sweep's or array's members and where each stands."""
    group = read_group(layout, args.id)
    if group is None:
        print(f"gpuq show: no job or group {args.id!r}{did_you_mean(layout, args.id)}", file=sys.stderr)
        return 1
    states = DependencyStates(layout).lookup(group["members"])
    if args.json:
        print(
            json.dumps(
                {
                    "group": group["id"],
                    "kind": group["kind"],
                    "members": [{"id": m, "state": states[m]} for m in group["members"]],
                },
                indent=1,
            )
        )
        return 0
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    print(
        f"{safe_text(group['kind'])} {safe_text(group['id'])}: {len(states)} jobs ("
        + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        + ")"
    )
    for member in group["members"]:
        print(f"  {safe_text(member):<40} {states[member]}")
    return 0


def with_group_members(layout, ids: list[str]) -> list[str]:
    """A sweep's or array's id stands for its members (a group's id is never a job's: a spec
    dropped under it is rejected)."""
    out: list[str] = []
    for job_id in ids:
        group = read_group(layout, job_id)
        out += group["members"] if group else [job_id]
    return out


def checked_ids(verb: str, ids: list[str]) -> list[str] | None:
    """The ids as given, or None after saying which one is not a job id."""
    return None if any(refuse_bad_id(verb, i) for i in ids) else ids


def cmd_move(args: argparse.Namespace) -> int:
    """hold / release / retry / edit: one request; one message per id; exit 1 if any was refused."""
    if args.verb in ("edit", "dismiss"):
        ids = checked_ids(args.verb, args.ids)
        if ids is None:
            return 1
        return edit(args, ids[0]) if args.verb == "edit" else run_request(args, "dismiss", tuple(ids))
    return act_on_selected(args)


def cmd_cancel(args: argparse.Namespace) -> int:
    return act_on_selected(args)


def act_on_selected(args: argparse.Namespace) -> int:
    """cancel / hold / release / retry on the ids given, or on the jobs the filters select
    (with ids as well: those of them the filters keep), in one request."""
    filtered = args.me or args.user or args.state or args.name
    if not args.ids and not filtered:
        print(
            f"gpuq {args.verb}: name the jobs: ids, or filters such as --me --state pending --name 'sweep-*'",
            file=sys.stderr,
        )
        return 2
    ids = checked_ids(args.verb, args.ids)
    if ids is None:
        return 1
    layout = open_layout(args)
    members = with_group_members(layout, ids)
    if args.verb == "cancel" and (ended := _ended_members(layout, ids, members)):
        # scancel of an array whose tasks partly ended: those are not refusals, and say so once.
        print(
            f"gpuq cancel: {len(ended)} of its jobs had ended already: {', '.join(ended[:5])}"
            + (" ..." if len(ended) > 5 else ""),
            file=sys.stderr,
        )
        gone = frozenset(ended)
        members = [m for m in members if m not in gone]
        if not members:
            return 0
    ids = members
    if filtered:
        try:
            wanted = JobFilter(
                # A filter alone takes the caller's own jobs, never the team's by accident.
                frozenset(u.strip() for u in args.user.split(",")) if args.user else frozenset({_me()}),
                states_asked(args.verb, args.state),
                tuple(n.strip() for n in args.name.split(",")) if args.name else None,
            )
        except ValueError as e:
            print(f"gpuq {args.verb}: {e}", file=sys.stderr)
            return 2
        _settle_expansions(args.verb, layout)
        selected = matching(layout, wanted)
        chosen = frozenset(selected)
        ids = [i for i in ids if i in chosen] if ids else selected
        if not ids:
            print(f"gpuq {args.verb}: no job matches {_described(args)}", file=sys.stderr)
            return 1
        if len(ids) > MAX_IDS:
            print(
                f"gpuq {args.verb}: {len(ids)} jobs match {_described(args)}, over the {MAX_IDS} one request takes; "
                "narrow it (--name, --state) and run it again",
                file=sys.stderr,
            )
            return 2
    if getattr(args, "now", False):
        return run_request(args, args.verb, tuple(ids), now=True)
    return run_request(args, args.verb, tuple(ids))


EXPANSION_WAIT_S = 5.0


def _settle_expansions(verb: str, layout: Layout) -> None:
    """Wait (a few seconds at most) for the arrays and sweeps a worker is writing the members
    of: a filter read meanwhile took only the members already written (`cancel --me -t PD`
    right after `submit --array 0-7` left three running). A worker that died mid-way finishes
    at its restart; the filter then takes what is there, and says so."""
    deadline = time.monotonic() + EXPANSION_WAIT_S
    while (writing := being_expanded(layout, time.time())) and time.monotonic() < deadline:
        time.sleep(0.05)
    if writing:
        print(
            f"gpuq {verb}: {', '.join(writing)} still being written by a worker: only its members already "
            f"in the queue match; run this again once `gpuq show {writing[0]}` lists them all",
            file=sys.stderr,
        )


def _ended_members(layout: Layout, named: list[str], members: list[str]) -> list[str]:
    """The members of the groups named (not the jobs named themselves) that have ended."""
    named_ones = frozenset(named)
    from_groups = [m for m in members if m not in named_ones]
    states = DependencyStates(layout).lookup(from_groups)
    return [m for m in from_groups if states[m] in FINAL]


def _me() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def _described(args: argparse.Namespace) -> str:
    """The filters as typed, for a message."""
    parts = [f"--user {args.user}" if args.user else "--me (yours)"]
    parts += [f"--state {args.state}"] if args.state else []
    parts += [f"--name {args.name}"] if args.name else []
    parts += [f"among {' '.join(args.ids)}"] if args.ids else []
    return " ".join(parts)


def edit(args: argparse.Namespace, job_id: str) -> int:
    """$EDITOR (else $VISUAL, else vi) on a pending job's spec, held meanwhile; the worker
    then puts the new text in place (checked again) and releases the job at its old place.
    An edit that ends without a valid text (refused, Ctrl-C, its terminal hung up, a TERM)
    releases the job it held: a dropped ssh session left a job held "being edited" for good."""
    layout = open_layout(args)
    was_held = held_spec(layout, job_id).exists()
    why = f"being edited (no gpuq edit open? gpuq release {job_id})"
    text: str | int = 1  # the new text, or the exit status of an edit that made none
    asked = False  # whether a hold was asked for: from then on, an edit that ends without a text releases
    try:
        with _hangup_ends_the_edit():  # from the hold on: a hang-up while it waits for the reply, too
            if not was_held:
                asked = True
                if (rc := run_request(args, "hold", (job_id,), shown_as="edit", quiet=True, why=why)) != 0:
                    asked = rc == WAITING  # refused: nothing to release; waiting: a worker holds it later
                    return rc
            text = _edited_text(layout, job_id)
    except KeyboardInterrupt:
        text = 130  # as a shell reports Ctrl-C, without a traceback
    finally:
        if isinstance(text, int) and asked:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):  # the release must not be cut short in turn
                signal.signal(sig, signal.SIG_IGN)
            run_request(args, "release", (job_id,), shown_as="edit", quiet=True)
    if isinstance(text, int):
        return text
    return run_request(args, "edit", (job_id,), text=text, release=not was_held)


@contextlib.contextmanager
def _hangup_ends_the_edit() -> Iterator[None]:
    """SIGHUP (the terminal gone) and SIGTERM end the edit as Ctrl-C does: by an exception,
    so that the caller's release runs (subprocess.run kills the editor on the way out)."""

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    before = {sig: signal.signal(sig, leave) for sig in (signal.SIGHUP, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _edited_text(layout: Layout, job_id: str) -> str | int:
    """The held spec through the person's editor until it is valid: its new text, or the exit
    status of an edit that made none (the reason said on stderr)."""
    try:
        original, _ = read_spec_file(held_spec(layout, job_id), f"jobs/{job_id}.yaml")
    except (OSError, SpecError) as e:
        print(f"gpuq edit: cannot read {job_id}'s spec: {e}", file=sys.stderr)
        return 1
    editor = os.environ.get("EDITOR") or os.environ.get("VISUAL") or "vi"
    with tempfile.TemporaryDirectory(prefix="gpuq-edit-") as tmp:
        # A path write, safely: mkdtemp's directory is this user's, mode 0700, so no other
        # member can plant a link in it; and the CLI runs with this user's rights only.
        copy = Path(tmp) / f"{job_id}.yaml"
        copy.write_bytes(original)
        while True:
            subprocess.run([*shlex.split(editor), str(copy)], check=False)
            text = copy.read_bytes()
            try:  # as strictly as submit checks a spec (a size no GPU has is refused, not kept)
                check_placeable(layout, parse_spec_text(text, f"jobs/{job_id}.yaml", new=True), as_fields=True)
                break
            except (SpecError, SubmitError) as e:
                print(f"gpuq edit: {e}", file=sys.stderr)
                if not (sys.stdin.isatty() and input("edit again? [Y/n] ").strip().lower() in ("", "y", "yes")):
                    print(f"gpuq edit: {job_id}: the edit was not valid; the spec is unchanged", file=sys.stderr)
                    return 1
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        print(f"gpuq edit: {job_id}: the spec must be UTF-8 text; it is unchanged", file=sys.stderr)
        return 1


def cmd_drain(args: argparse.Namespace) -> int:
    if args.verb in ("resume", "forget"):
        return run_request(args, args.verb, host=args.host)
    hosts = sorted(str(hb.get("host")) for hb in load_heartbeats(open_layout(args)))
    if args.host not in hosts:
        print(
            f"gpuq drain: no host named {args.host!r} has run a worker here (hosts: {', '.join(hosts) or 'none'})",
            file=sys.stderr,
        )
        return 1  # not found (docs/reference.md: exit codes)
    return run_request(args, "drain", host=args.host, reason=args.reason)


def cmd_init(args: argparse.Namespace) -> int:

    try:
        done = init_root(Path(args.dir), args.group, args.queue_user)
    except (InitError, OSError) as e:
        print(f"gpuq init: {e}", file=sys.stderr)
        return 2
    root = Path(args.dir).resolve()
    print("\n".join(done))
    print(
        f"\nOn each box, `crontab -e` and add:\n  {cron_line(root)}\n"
        f"Then every member: export GPUQ_ROOT={root} (in ~/.profile, so that every gpuq command finds it),\n"
        f"and run gpuq as {member_command(args.launcher_dir)} (or put it on PATH):\n"
        "  gpuq submit --gpus 1 --gpu-mem 8GiB -- python train.py; gpuq status; gpuq doctor"
    )

    for finding in check_reachable(Layout(root)):  # members run this very interpreter and code
        if finding.level != "ok":
            print(f"\nWARNING: {finding.message}.\n  Fix: {finding.fix}")
    return 0


def member_command(launcher_dir: str | None) -> str:
    """The gpuq command members run, by its full path: this checkout's gpuq.py with this
    interpreter, else the gpuq installed beside this interpreter."""
    if launcher_dir:
        return f"{sys.executable} {Path(launcher_dir) / 'gpuq.py'}"
    beside = Path(sys.executable).parent / "gpuq"
    return str(beside) if beside.exists() else "gpuq"


def cmd_doctor(args: argparse.Namespace) -> int:
    layout = open_layout(args)
    # What only root can tell (whether the export squashes root), then as the queue's account.
    squash = check_squashing(layout) if os.geteuid() == 0 else []
    if os.geteuid() == 0 and (cannot := act_as_queue_account(args)):
        findings = [*squash, Finding("fail", cannot.check, cannot.message, cannot.fix)]
    else:
        problems: list[str] = []  # a finding each, not a crash of doctor (the workers refuse them)
        config = load_config(layout.config_file, problems)
        bad = [Finding("fail", "config", p, "an admin fixes config.yaml; the workers refuse it") for p in problems]
        findings = diagnose(layout, config, time.time(), [*squash, *bad])
    if args.json:
        print(json.dumps({"findings": as_json(findings)}, indent=1))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for f in findings:
            print(f"{marks[f.level]} {f.check:<12} {f.message}")
            if f.fix and f.level != "ok":
                print(f"     {'':<12} fix: {f.fix}")
    return 1 if any(f.level == "fail" for f in findings) else 0
