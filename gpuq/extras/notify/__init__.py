"""Notify, an extra: a spec's `notify:` (or `gpuq submit --notify`) asks for a message when
its job starts, ends or fails (events.py); each worker tails its own host's event log and,
for each such event, once, hands one delivery to the root part (watch.py, a publisher),
which runs the deliverer (deliver.py) as the job's owner: it reads the owner's own
~/.config/gpuq/notify.yaml (memberfile.py) and posts to a webhook, mails through sendmail,
or runs a command. No destination is ever in a spec or a file the team reads. README.md here
is its page.

Every gpuq process imports this module, root's `gpuq` too: it imports nothing but the
registry's types, and names the rest by "module:function".
"""

from __future__ import annotations

import argparse

from gpuq.hooks import BoxPublisher, Registry, SpecField


def _submit_options(sp: argparse.ArgumentParser) -> None:
    """`gpuq submit --notify start,end,fail,all` (argparse only)."""
    sp.add_argument(
        "--notify",
        metavar="WHEN",
        help="send a message when the job starts, ends or fails: start, end, fail, all, or a comma list; "
        "where to is your own ~/.config/gpuq/notify.yaml (the notify extra)",
    )


NOTIFY = SpecField(
    "notify",
    "start, end, fail, all, or a list of them",
    "your notify.yaml's `on:`, else none",
    "Send a message when the job starts (start), reaches any final state (end: done, failed, "
    "cancelled, timeout, lost) or fails (fail: failed, timeout, lost); all is start and end. "
    "Where to is only in your own ~/.config/gpuq/notify.yaml (webhook, mail, command), never in "
    "the spec: gpuq/extras/notify/README.md.",
    "[end, fail]",
    "extras.notify.events:parse_field",
    options=_submit_options,
    from_options="extras.notify.memberfile:from_options",
    submit_default="extras.notify.memberfile:submit_default",
)


def register(registry: Registry) -> None:
    registry.spec_fields["notify"] = NOTIFY
    registry.publishers.append(BoxPublisher("notify", "extras.notify.watch:start"))
    registry.member_programs["notify"] = "extras.notify.deliver"
