"""The workflow verbs: hold / release / retry / edit, drain / resume, and sweeps and arrays
handled as one group (submit --array, show GROUP, cancel GROUP)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from .cli import open_layout, read_config
from .single_instance import this_host


def submit_array(layout, data: dict, args: argparse.Namespace) -> str | None:
    """`gpuq submit --array 0-9`: one job per index, <id>_<index>, each with GPUQ_ARRAY_INDEX."""
    import os

    from .spec import validate_spec
    from .submit import check_dependencies, readable_base, reserve_group_id
    from .sweeps import GroupError, array_members, parse_array, place_members

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        indices = parse_array(args.array)
    except GroupError as e:
        print(f"gpuq submit: {e}", file=sys.stderr)
        return None
    check_dependencies(layout, validate_spec(data, "gpuq submit"))
    group = reserve_group_id(layout, args.id, readable_base(command, args.name))
    members = place_members(layout, group, "array", array_members(data, group, indices), os.geteuid(), time.time())
    print(f"{group}: {len(members)} jobs, {members[0]} ... {members[-1]} (gpuq show {group}; gpuq cancel {group})")
    return group


def show_group(layout, args: argparse.Namespace) -> int:
    """`gpuq show GROUP`: a sweep's or array's members and where each stands."""
    from .deps import DependencyStates
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
    print(f"{group['kind']} {group['id']}: {len(states)} jobs ("
          + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + ")")
    for member in group["members"]:
        print(f"  {member:<40} {states[member]}")
    return 0


def with_group_members(layout, ids: list[str]) -> list[str]:
    """A sweep's or array's id stands for its members."""
    from .spool import has_record, pending_spec_path
    from .sweeps import read_group

    out = []
    for job_id in ids:
        group = None if pending_spec_path(layout, job_id) or has_record(layout, job_id) else read_group(layout, job_id)
        out += group["members"] if group else [job_id]
    return out


def cmd_move(args: argparse.Namespace) -> int:
    """hold / release / retry / edit: one message per id; exit 1 if any was refused."""
    from . import holds

    layout = open_layout(args)
    admins, host = read_config(layout).admins, this_host()
    failed = False
    for job_id in args.ids:
        try:
            if args.verb == "hold":
                holds.hold(layout, job_id, host, admins)
                message = f"{job_id}: held (gpuq release {job_id} puts it back at its place)"
            elif args.verb == "release":
                holds.release(layout, job_id, host, admins)
                message = f"{job_id}: released, back at its place in the queue"
            elif args.verb == "retry":
                message = holds.retry(layout, job_id, host, admins)
            else:
                message = holds.edit(layout, job_id, host, admins)
        except (holds.HoldError, OSError) as e:
            print(f"gpuq {args.verb}: {e}", file=sys.stderr)
            failed = True
            continue
        print(message)
    if not failed and args.verb != "hold":
        from .wake import poke

        poke(read_config(layout).local_dir_for(layout, host))
    return 1 if failed else 0


def cmd_drain(args: argparse.Namespace) -> int:
    from .drain import drain, resume
    from .views import load_heartbeats

    layout = open_layout(args)
    hosts = sorted(hb["host"] for hb in load_heartbeats(layout))
    if args.verb == "resume":
        if not resume(layout, args.host):
            print(f"gpuq resume: {args.host} is not drained", file=sys.stderr)
            return 1
        print(f"{args.host}: resumed; its worker claims jobs again")
        return 0
    if args.host not in hosts:
        print(f"gpuq drain: no host named {args.host!r} has run a worker here (hosts: {', '.join(hosts) or 'none'})",
              file=sys.stderr)
        return 2
    drain(layout, args.host, args.reason)
    print(f"{args.host}: draining; running jobs finish, nothing new starts there (gpuq resume {args.host})")
    return 0


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
          f"Then: GPUQ_ROOT={root} gpuq submit --gpus 1 --gpu-mem 8GiB -- python train.py; gpuq status; "
          "gpuq doctor")
    return 0


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
    """`gpuq book HOST:GPUS --from --to [--for] [--note]` and `gpuq unbook ID`."""
    import getpass
    import os

    from . import bookings
    from .views import load_heartbeats

    layout = open_layout(args)
    now = time.time()
    try:
        if args.verb == "unbook":
            admins = read_config(layout).admins
            me = getpass.getuser()
            b = bookings.unbook(layout, args.id, lambda b: os.geteuid() == 0 or me in (b.owner, b.by, *admins))
            print(f"{b.id}: removed ({b.describe()})")
            return 0
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
        b = bookings.book(layout, host, tuple(gpus or offered[host]), start, end, args.owner, args.note or "", now)
    except bookings.BookingError as e:
        print(f"gpuq {args.verb}: {e}", file=sys.stderr)
        return 2
    print(f"{b.id}: {b.describe()}" + (f" · {b.note}" if b.note else ""))
    return 0
