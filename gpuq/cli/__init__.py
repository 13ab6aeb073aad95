"""`python gpuq.py VERB ...` / `gpuq VERB ...`: a command run: its verb's parser (cli/verbs.py),
root's drop to the queue's account, and what a refusal says; one thin handler per verb."""

from __future__ import annotations

import gc
import os
import sys

from gpuq import hooks
from gpuq.cli.common import act_as_queue_account, verbs_of
from gpuq.cli.options import sbatch_only
from gpuq.cli.verbs import CORE_VERB_NAMES, build_parser
from gpuq.host.audit import install_if_asked
from gpuq.model.config import ConfigError
from gpuq.model.text import safe_text
from gpuq.spool.layout import RootError

__all__ = ["build_parser", "entry_point", "main"]


# A command reads thousands of records and specs and creates no reference cycles worth
# chasing meanwhile: the collector's default (a pass every 700 new objects) cost `status`
# of 10,000 pending jobs a tenth of its time. Longer-lived verbs (top, wait, logs -f) still
# collect, only less often.
GC_FIRST_GENERATION_THRESHOLD = 100_000


def _verb_in(argv: list[str]) -> str | None:
    """The verb a command line names, read past `--root DIR`; None where something else comes
    first (`--help`, `-V`, an abbreviated `--ro`): the whole parser reads those."""
    i = 0
    while i < len(argv) and (argv[i] == "--root" or argv[i].startswith("--root=")):
        i += 2 if argv[i] == "--root" else 1
    return argv[i] if i < len(argv) and not argv[i].startswith("-") else None


# Verbs that read other verbs' options: the completion script lists them all.
READS_EVERY_VERB = ("completion",)


def main(argv: list[str] | None = None, launcher_dir: str | None = None) -> int:
    gc.set_threshold(GC_FIRST_GENERATION_THRESHOLD, *gc.get_threshold()[1:])
    argv = sys.argv[1:] if argv is None else argv
    _say_what_of_the_extras_is_left_out()
    verb = _verb_in(argv)
    only = None if verb in READS_EVERY_VERB else verb
    parser = build_parser(only)
    if only is not None and only not in verbs_of(parser).choices:  # none of gpuq's: the whole parser says so
        parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.verb == "submit" and (instead := sbatch_only(unknown)):
        for line in instead:
            print(f"gpuq submit: {line}. Nothing was written.", file=sys.stderr)
        return 2
    if unknown:  # the verb's own usage, not the list of verbs (`submit --gpu-memory 8G`)
        verbs_of(parser).choices[args.verb].error(f"unrecognized arguments: {' '.join(unknown)}")
    args.launcher_dir = launcher_dir
    args.parser = parser  # for `gpuq completion`, which prints the verbs and options it holds
    args.by_root = os.geteuid() == 0  # before it acts as the queue's account: its requests say root
    if os.geteuid() == 0 and args.verb not in KEEPS_ROOT and (cannot := act_as_queue_account(args)):
        print(f"gpuq {args.verb}: {cannot.message}. Fix: {cannot.fix}", file=sys.stderr)
        return 2

    try:
        return args.handler(args)
    except (RootError, ConfigError) as e:
        print(f"gpuq {args.verb}: {e}", file=sys.stderr)
        return 2
    except PermissionError as e:  # the spool's modes said no: a refusal (docs/reference.md: exit 1), not bad input
        print(f"gpuq {args.verb}: {_permission_denied(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


def _say_what_of_the_extras_is_left_out() -> None:
    """Every command says it, whichever verb it runs: an extra that could not be loaded, and
    an extra's verb named as one of gpuq's own (the core's is kept)."""
    for name, why in hooks.registry().broken.items():
        print(f"gpuq: {why}; gpuq runs without it. Fix: {hooks.fix(name)}", file=sys.stderr)
    for extra in hooks.registry().verbs:
        if extra.name in CORE_VERB_NAMES:
            print(
                f"gpuq: an extra's verb {extra.name!r} ({extra.handler}) is one of gpuq's own: left out",
                file=sys.stderr,
            )


KEEPS_ROOT = ("init", "doctor")  # init makes the queue's account; doctor probes as root, then acts as it


def _permission_denied(e: PermissionError) -> str:
    """One line for a path the spool's modes keep from this user: someone outside the root's
    group cannot read it at all (nor anything under it); a member may read but not write it."""
    if e.filename is None:  # raised by gpuq itself, in its own words
        return e.strerror or str(e)

    path = os.fsdecode(e.filename)
    if os.geteuid() == 0:  # only a file system can refuse root: an NFS export squashing it
        return (
            f"root may not use {safe_text(path)}: its file system squashes root (an NFS export without "
            "no_root_squash). Fix: export the spool to the GPU boxes with no_root_squash "
            "(docs/security.md, Shared disks)"
        )
    there = path if os.path.lexists(path) else os.path.dirname(path)  # a file it meant to create
    if os.access(there, os.R_OK | (os.X_OK if os.path.isdir(there) else 0)):
        return f"cannot write {safe_text(path)}: permission denied (docs/security.md: who may write what)"
    return (
        f"cannot read {safe_text(path)}: permission denied. Fix: ask the root's owner to add you to its group "
        "(docs/security.md)"
    )


def entry_point() -> int:
    install_if_asked()  # the tests' proof of the privilege boundary; nothing otherwise
    return main()
