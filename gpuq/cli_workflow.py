"""The workflow verbs: hold / release / retry / edit, drain / resume, and sweeps and arrays
handled as one group (submit --array, show GROUP, cancel GROUP)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .cli import open_layout, read_config


def submit_array(layout, data: dict, args: argparse.Namespace) -> str | None:
    """`gpuq submit --array 0-9`: one spec with `array: 0-9` in jobs/; the worker that reads
    it writes one job per index, <id>_<index>, each with GPUQ_ARRAY_INDEX (sweeps.py)."""
    from .submit import readable_base, write_spec
    from .sweeps import GroupError, array_members, parse_array

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        indices = parse_array(args.array)
    except GroupError as e:
        print(f"gpuq submit: {e}", file=sys.stderr)
        return None
    group = write_spec(layout, {**data, "array": args.array}, args.id, readable_base(command, args.name))
    members = [member for member, _ in array_members(data, group, indices)]
    print(f"{group}: {len(members)} jobs, {members[0]} ... {members[-1]} (gpuq show {group}; gpuq cancel {group})")
    return group


def show_group(layout, args: argparse.Namespace) -> int:
    """`gpuq show GROUP`: a sweep's or array's members and where each stands."""
    from .deps import DependencyStates
    from .render import safe_text
    from .sweeps import read_group

    group = read_group(layout, args.id)
    if group is None:
        print(f"gpuq show: no job or group {args.id!r}", file=sys.stderr)
        return 1
    states = DependencyStates(layout).lookup(group["members"])
    if args.json:
        print(json.dumps({"group": group["id"], "kind": group["kind"],
                          "members": [{"id": m, "state": states[m]} for m in group["members"]]}, indent=1))
        return 0
    counts: dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    print(f"{safe_text(group['kind'])} {safe_text(group['id'])}: {len(states)} jobs ("
          + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + ")")
    for member in group["members"]:
        print(f"  {safe_text(member):<40} {states[member]}")
    return 0


def with_group_members(layout, ids: list[str]) -> list[str]:
    """A sweep's or array's id stands for its members (a group's id is never a job's: a spec
    dropped under it is rejected)."""
    from .sweeps import read_group

    out = []
    for job_id in ids:
        group = read_group(layout, job_id)
        out += group["members"] if group else [job_id]
    return out


def checked_ids(verb: str, ids: list[str]) -> list[str] | None:
    """The ids as given, or None after saying which one is not a job id."""
    from .cli import refuse_bad_id

    return None if any(refuse_bad_id(verb, i) for i in ids) else ids


def cmd_move(args: argparse.Namespace) -> int:
    """hold / release / retry / edit: one request; one message per id; exit 1 if any was refused."""
    from .cli_requests import run_request

    ids = checked_ids(args.verb, args.ids)
    if ids is None:
        return 1
    if args.verb == "edit":
        return edit(args, ids[0])
    layout = open_layout(args)
    return run_request(args, args.verb, tuple(with_group_members(layout, ids)))


def edit(args: argparse.Namespace, job_id: str) -> int:
    """$EDITOR (else $VISUAL, else vi) on a pending job's spec, held meanwhile; the worker
    then puts the new text in place (checked again) and releases the job at its old place."""
    import os
    import shlex
    import subprocess
    import tempfile
    from pathlib import Path

    from .cli_requests import run_request
    from .holds import held_spec
    from .intake import read_spec_file
    from .spec import SpecError, parse_spec_text

    layout = open_layout(args)
    was_held = held_spec(layout, job_id).exists()
    if not was_held and (rc := run_request(args, "hold", (job_id,), shown_as="edit", why="being edited")) != 0:
        return rc
    try:
        original, _ = read_spec_file(held_spec(layout, job_id), f"jobs/{job_id}.yaml")
    except (OSError, SpecError) as e:
        print(f"gpuq edit: cannot read {job_id}'s spec: {e}", file=sys.stderr)
        if not was_held:
            run_request(args, "release", (job_id,))
        return 1
    editor = os.environ.get("EDITOR") or os.environ.get("VISUAL") or "vi"
    with tempfile.TemporaryDirectory(prefix="gpuq-edit-") as tmp:
        copy = Path(tmp) / f"{job_id}.yaml"
        copy.write_bytes(original)
        while True:
            subprocess.run([*shlex.split(editor), str(copy)], check=False)
            text = copy.read_bytes()
            try:
                parse_spec_text(text, f"jobs/{job_id}.yaml")
                break
            except SpecError as e:
                print(f"gpuq edit: {e}", file=sys.stderr)
                if not (sys.stdin.isatty() and input("edit again? [Y/n] ").strip().lower() in ("", "y", "yes")):
                    if not was_held:
                        run_request(args, "release", (job_id,))
                    print(f"gpuq edit: {job_id}: the edit was not valid; the spec is unchanged", file=sys.stderr)
                    return 1
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        decoded = None
    if decoded is None:
        if not was_held:
            run_request(args, "release", (job_id,))
        print(f"gpuq edit: {job_id}: the spec must be UTF-8 text; it is unchanged", file=sys.stderr)
        return 1
    return run_request(args, "edit", (job_id,), text=decoded, release=not was_held)


def cmd_drain(args: argparse.Namespace) -> int:
    from .cli_requests import run_request
    from .teamstate import load_heartbeats

    if args.verb in ("resume", "forget"):
        return run_request(args, args.verb, host=args.host)
    hosts = sorted(str(hb.get("host")) for hb in load_heartbeats(open_layout(args)))
    if args.host not in hosts:
        print(f"gpuq drain: no host named {args.host!r} has run a worker here (hosts: {', '.join(hosts) or 'none'})",
              file=sys.stderr)
        return 1  # not found (README: exit codes)
    return run_request(args, "drain", host=args.host, reason=args.reason)


def cmd_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .initroot import InitError, cron_line, init_root

    try:
        done = init_root(Path(args.dir), args.group)
    except (InitError, OSError) as e:
        print(f"gpuq init: {e}", file=sys.stderr)
        return 2
    root = Path(args.dir).resolve()
    print("\n".join(done))
    print(f"\nOn each box, `crontab -e` and add:\n  {cron_line(root)}\n"
          f"Then every member: export GPUQ_ROOT={root} (in ~/.profile, so that every gpuq command finds it),\n"
          f"and run gpuq as {member_command(args.launcher_dir)} (or put it on PATH):\n"
          "  gpuq submit --gpus 1 --gpu-mem 8GiB -- python train.py; gpuq status; gpuq doctor")
    from .doctor import check_reachable
    from .layout import Layout

    for finding in check_reachable(Layout(root)):  # members run this very interpreter and code
        if finding.level != "ok":
            print(f"\nWARNING: {finding.message}.\n  Fix: {finding.fix}")
    return 0


def member_command(launcher_dir: str | None) -> str:
    """The gpuq command members run, by its full path: this checkout's gpuq.py with this
    interpreter, else the gpuq installed beside this interpreter."""
    from pathlib import Path

    if launcher_dir:
        return f"{sys.executable} {Path(launcher_dir) / 'gpuq.py'}"
    beside = Path(sys.executable).parent / "gpuq"
    return str(beside) if beside.exists() else "gpuq"


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import as_json, diagnose

    layout = open_layout(args)
    findings = diagnose(layout, read_config(layout), time.time())
    if args.json:
        print(json.dumps({"findings": as_json(findings)}, indent=1))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
        for f in findings:
            print(f"{marks[f.level]} {f.check:<12} {f.message}")
            if f.fix and f.level != "ok":
                print(f"     {'':<12} fix: {f.fix}")
    return 1 if any(f.level == "fail" for f in findings) else 0


def cmd_book(args: argparse.Namespace) -> int:
    """`gpuq book HOST:GPUS --from --to [--for] [--note]` and `gpuq unbook ID`: checked here
    for a quick answer, then sent as a request (the worker checks again and decides)."""
    from . import bookings
    from .cli_requests import run_request
    from .teamstate import load_heartbeats

    if args.verb == "unbook":
        return run_request(args, "unbook", id=args.id)
    layout = open_layout(args)
    now = time.time()
    try:
        host, gpus = bookings.parse_target(args.target)
        offered = {hb["host"]: sorted(g["index"] for g in hb.get("gpus", [])) for hb in load_heartbeats(layout)}
        if host not in offered:
            raise bookings.BookingError(f"no host named {host!r} has run a worker here "
                                        f"(hosts: {', '.join(sorted(offered)) or 'none'})")
        missing = sorted(set(gpus or ()) - set(offered[host]))
        if missing:
            raise bookings.BookingError(f"{host} has no GPU {missing[0]} (it offers {offered[host]})")
        start = bookings.parse_when(args.start, now)
        end = bookings.parse_when(args.end, now, after=start)
    except bookings.BookingError as e:
        print(f"gpuq {args.verb}: {e}", file=sys.stderr)
        return 2
    return run_request(args, "book", host=host, gpus=list(gpus or offered[host]), start=start, end=end,
                       owner=args.owner, note=args.note or "")
