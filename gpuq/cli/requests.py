"""The CLI's half of a request (spool/inbox.py): send it, then wait for the reply and print it.

Run by the spool's own account (root, acting as the queue's account, or the one user of a
private queue) the CLI applies its request itself, through the same code a worker uses;
anyone else's request waits for a worker, which every box runs, and the CLI says so when
none is live. Exit status: 0 done,
1 refused or failed, 3 still waiting for a worker (docs/security.md)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from gpuq.cli.common import open_layout, read_config
from gpuq.host import rootorders
from gpuq.host.owners import writable_by_others
from gpuq.host.wake import poke
from gpuq.model.text import safe_text
from gpuq.single_instance import this_host
from gpuq.spool.applying import apply_one
from gpuq.spool.inbox import RequestError, read_reply, send
from gpuq.spool.teamstate import heartbeat_alive, load_heartbeats

WAITING = 3


def run_request(
    args: argparse.Namespace,
    verb: str,
    ids: tuple[str, ...] = (),
    shown_as: str | None = None,
    quiet: bool = False,
    **request_args: object,
) -> int:
    """Send one request and print its outcome, one line per id (`quiet`: only the refusals,
    for a request the person did not type: edit's hold and release around the editor)."""
    said = shown_as or verb  # the verb the person typed (edit sends a hold first)
    layout = open_layout(args)
    config = read_config(layout)
    host = this_host()
    try:
        name = send(layout, verb, ids, host, getattr(args, "by_root", False), **request_args)
    except RequestError as e:
        print(f"gpuq {said}: {e}", file=sys.stderr)
        return 1
    except PermissionError:
        print(
            f"gpuq {said}: cannot write {layout.requests}/. Fix: team members need to be in the "
            "queue's group (docs/security.md: `gpuq init DIR --group TEAM`)",
            file=sys.stderr,
        )
        return 1
    reply = None
    if _owns_spool(layout):
        reply = apply_one(layout, config, host, name)  # None: a worker took it first
    else:
        poke(layout.local_dir(host, config.local_dir))
    if reply is None:
        if not live_workers(layout):
            print(
                f"gpuq {said}: no worker is running on any host; request {name} waits in requests/ and "
                "is applied when one starts (cron starts one each minute; `gpuq doctor`)",
                file=sys.stderr,
            )
            return WAITING
        deadline = time.monotonic() + config.request_timeout_s
        while (reply := read_reply(layout, name, os.geteuid())) is None and time.monotonic() < deadline:
            time.sleep(0.02)
    if reply is None:
        print(
            f"gpuq {said}: no worker answered within {config.request_timeout_s:g}s (config "
            f"request_timeout_s); request {name} waits and is applied at a worker's next pass "
            f"(live: {', '.join(live_workers(layout))})",
            file=sys.stderr,
        )
        return WAITING

    for done, message in reply.outcomes:  # a note or a spec's text may carry a member's escapes
        if done and quiet:
            continue
        if not done and not message.startswith("gpuq "):  # every error names the verb the person typed
            message = f"gpuq {said}: {message}"
        print(safe_text(message), file=sys.stdout if done else sys.stderr)
    return 0 if reply.ok else 1


def _owns_spool(layout) -> bool:
    """Whether this process may apply its request itself: it is the account that owns state/,
    and has what a change may need in a team root (jobs/ writable by others): the root part,
    which gives a retried spec to its owner. Root's gpuq has both (it acts as the queue's
    account, with a root part beside it); the queue's account alone sends its requests to a
    worker."""
    try:
        if os.geteuid() != os.stat(layout.state).st_uid:
            return False
        return rootorders.orders() is not None or not writable_by_others(os.stat(layout.jobs).st_mode)
    except OSError:
        return False


def live_workers(layout) -> list[str]:
    now = time.time()
    return sorted(str(hb.get("host")) for hb in load_heartbeats(layout) if heartbeat_alive(hb, now))
