"""`gpuq book HOST:GPUS --from --to [--for] [--note]` and `gpuq unbook ID`: checked here for a
quick answer, then sent as a request (requests.py: the worker checks again and decides)."""

from __future__ import annotations

import argparse
import sys
import time

from gpuq.cli.common import open_layout
from gpuq.cli.requests import run_request
from gpuq.extras.bookings.model import BookingError
from gpuq.extras.bookings.store import parse_target, parse_when
from gpuq.spool.teamstate import load_heartbeats


def cmd_unbook(args: argparse.Namespace) -> int:
    return run_request(args, "unbook", id=args.id)


def cmd_book(args: argparse.Namespace) -> int:
    layout = open_layout(args)
    now = time.time()
    try:
        host, gpus = parse_target(args.target)
        offered = {hb["host"]: sorted(g["index"] for g in hb.get("gpus", [])) for hb in load_heartbeats(layout)}
        if host not in offered:
            raise BookingError(
                f"no host named {host!r} has run a worker here (hosts: {', '.join(sorted(offered)) or 'none'})"
            )
        missing = sorted(set(gpus or ()) - set(offered[host]))
        if missing:
            raise BookingError(f"{host} has no GPU {missing[0]} (it offers {offered[host]})")
        start = parse_when(args.start, now)
        end = parse_when(args.end, now, after=start)
    except BookingError as e:
        print(f"gpuq {args.verb}: {e}", file=sys.stderr)
        return 2
    return run_request(
        args,
        "book",
        host=host,
        gpus=list(gpus or offered[host]),
        start=start,
        end=end,
        owner=args.owner,
        note=args.note or "",
    )
