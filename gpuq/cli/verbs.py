"""The CLI's verbs: each one's handler (loaded only when it runs), help and arguments, and the
parser built from them, whole or for the one verb a command runs."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass
from importlib import import_module
from typing import Callable, NoReturn, TypeAlias

from gpuq import __version__, hooks
from gpuq.cli.common import verbs_of
from gpuq.cli.options import (
    add_environment_options,
    add_filter_options,
    add_limit_options,
    gpu_count,
    gres_count,
)


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace], int]:
    """A handler imported only when its verb runs: `gpuq status` loads none of the others."""

    def handler(args: argparse.Namespace) -> int:
        return getattr(import_module(f"gpuq.{module}"), name)(args)

    return handler


# Slurm's commands, typed as verbs by habit: what gpuq has for each ("Slurm's squeue is gpuq status").
# An extra's verb that stands for one (hooks.Verb.slurm: srun is gpuq run) is named instead.
SLURM_COMMANDS = {
    "sbatch": "is gpuq submit (it reads a script's #SBATCH lines: gpuq submit job.sbatch)",
    "squeue": "is gpuq status",
    "sacct": "is gpuq history (it comes with gpuq/extras/history; without it, gpuq status lists the latest ended jobs)",
    "scancel": "is gpuq cancel",
    "scontrol": "is gpuq show, hold, release",
    "sinfo": "is gpuq status (its HOSTS)",
    "sprio": "is gpuq status --shares",
    "sshare": "is gpuq status --shares",
    "seff": "is gpuq eff",
    "srun": "is gpuq submit, then logs -f ID (interactive sessions, gpuq run, come with gpuq/extras/interactive)",
    "salloc": "has nothing here: gpuq shell comes with gpuq/extras/interactive (or book GPUs, or submit and logs -f)",
}


class _Parser(argparse.ArgumentParser):
    """argparse, except that a mistyped verb gets one line with the nearest verbs, not a list
    of every choice (internal ones included)."""

    def error(self, message: str) -> NoReturn:
        bad = re.match(r"argument VERB: invalid choice: '(.*?)'", message)
        if bad is None:
            super().error(message)
        hidden = {verb.name for verb in CORE_VERBS if verb.help is None}  # the completion script's
        verbs = [v for v in verbs_of(self).choices if v not in hidden]
        by_extra = {v.slurm: v.name for v in hooks.registry().verbs if v.slurm and v.name in verbs}
        ours = f"is gpuq {by_extra[bad.group(1)]}" if bad.group(1) in by_extra else SLURM_COMMANDS.get(bad.group(1))
        if ours is not None:
            print(f"gpuq: Slurm's {bad.group(1)} {ours} (`gpuq --help` lists the verbs)", file=sys.stderr)
            sys.exit(2)
        near = difflib.get_close_matches(bad.group(1), verbs, n=3, cutoff=0.6)
        print(
            f"gpuq: unknown verb {bad.group(1)!r}"
            + (f"; did you mean {' or '.join(near)}?" if near else "")
            + " (`gpuq --help` lists the verbs)",
            file=sys.stderr,
        )
        sys.exit(2)


_Verbs: TypeAlias = "argparse._SubParsersAction[_Parser]"  # each verb's parser is a _Parser too
_Arguments: TypeAlias = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class _Verb:
    """One of gpuq's own verbs: its handler (loaded when it runs), its help (None: hidden,
    never listed) and what adds its arguments."""

    name: str
    handler: Callable[[argparse.Namespace], int]
    help: str | None
    arguments: _Arguments


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The CLI's parser: every verb, or (`only`) that verb alone, as a command that runs it
    needs (every command used to build all the verbs' arguments first: 20 ms of each start)."""
    p = _Parser(prog="gpuq", description="A GPU job queue in a shared directory.")
    p.add_argument("--root", help="queue root (default: $GPUQ_ROOT, else the checkout of `python gpuq.py`)")
    p.add_argument("-V", "--version", action="version", version=f"gpuq {__version__}")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in CORE_VERBS:  # in this order: `gpuq --help` lists the verbs as they are added
        if only is None or verb.name == only:
            verb.arguments(_add_verb(sub, verb.name, verb.handler, verb.help))
    # Last: a name any core verb has is the core's (main says an extra's is left out).
    for extra in hooks.registry().verbs:
        if (only is None or extra.name == only) and extra.name not in CORE_VERB_NAMES:
            extra.setup(_add_verb(sub, extra.name, _lazy(*extra.handler.split(":", 1)), extra.help))
    return p


def _add_verb(
    sub: _Verbs, name: str, handler: Callable[[argparse.Namespace], int], help: str | None
) -> argparse.ArgumentParser:
    if name == "fake-use":  # it reads its own arguments, --help too (host/fake_use.py)
        sp = sub.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    elif help is None:
        sp = sub.add_parser(name)
    else:
        sp = sub.add_parser(name, help=help, description=help)
    sp.set_defaults(handler=handler)
    return sp


def _status_arguments(sp: argparse.ArgumentParser) -> None:
    """`gpuq status`: the queue at a glance, with what it may be narrowed to."""
    sp.add_argument("--json", action="store_true", help="the documented JSON document")
    sp.add_argument("--all", action="store_true", help="list every pending job")
    sp.add_argument(
        "-w", "--wide", action="store_true", help="lines whole (default: cut to the terminal, 80 columns in a pipe)"
    )
    sp.add_argument(
        "-o",
        "--format",
        metavar="COLS",
        help="one line per job in these columns (squeue's -o): position, id, user, state, gpus, gpu_mem, where, "
        "time, priority, start, reason, command (comma-separated)",
    )
    sp.add_argument(
        "--shares",
        action="store_true",
        help="each user's usage and fair-share factor, and why each pending job ranks where it does (sprio)",
    )
    who = sp.add_mutually_exclusive_group()
    who.add_argument("--me", action="store_true", help="only my jobs")
    who.add_argument("-u", "--user", help="only this user's jobs (squeue's -u)")
    sp.add_argument(
        "-t",
        "--state",
        metavar="STATES",
        help="only running, pending, held, finished or rejected jobs, or finished ones in a final state (failed, "
        "done, ...); comma-separated; squeue's PD, R, CD, F, CA, TO too",
    )
    sp.add_argument("-j", "--jobs", metavar="ID", help="only these jobs (comma-separated; a group's id: its members)")
    sp.add_argument("-n", "--name", help="only jobs of these names or ids (comma-separated; shell patterns: 'train-*')")
    sp.add_argument("ids", nargs="*", metavar="ID", help="only these jobs, as -j")


def _submit_arguments(sp: argparse.ArgumentParser) -> None:
    """`gpuq submit`: what a job asks for, and the command after --."""
    sp.add_argument("-G", "--gpus", type=gpu_count, help="GPUs on one host (0: CPU only); default 1 (sbatch's -G)")
    sp.add_argument("--gres", dest="gpus", type=gres_count, metavar="gpu:N", help="sbatch's spelling of --gpus N")
    sp.add_argument("--gpu-mem", help="memory per GPU, e.g. 20GiB (default: whole GPUs)")
    sp.add_argument("-J", "--name", "--job-name", dest="name", help="label, and the stem of the id (sbatch's -J)")
    sp.add_argument("--id", help="exact job id (default: <name>-<n>)")
    sp.add_argument(
        "--parsable", action="store_true", help="sbatch's: taken as it is (submit prints only the id on stdout)"
    )
    sp.add_argument("--priority", help="high, normal, low, or an integer")
    sp.add_argument("--hosts", help="comma-separated hosts it may run on")
    sp.add_argument(
        "-D", "--workdir", "--chdir", dest="workdir", help="directory to run in (default: the current one; sbatch's -D)"
    )
    sp.add_argument("--env", action="append", metavar="NAME=VALUE", help="extra variable (repeatable)")
    sp.add_argument(
        "--array",
        metavar="INDICES",
        help="one job per index (0-9, 1-9:2, 1,4,7; 0-9%%2: at most 2 at once), each with GPUQ_ARRAY_INDEX; "
        "ids <id>_<index>",
    )
    sp.add_argument(
        "-b",
        "--begin",
        metavar="WHEN",
        help="start no earlier than this (sbatch's --begin): now+1hour, 2h, 16:00 (tomorrow once past), "
        "tomorrow, 2026-12-24T08:00",
    )
    sp.add_argument("--after", action="append", metavar="ID[,ID]", help="start after these jobs succeeded")
    sp.add_argument(
        "--after-any", action="append", metavar="ID[,ID]", help="start after these jobs ended, whatever the result"
    )
    sp.add_argument(
        "-d",
        "--dependency",
        action="append",
        metavar="afterok:ID[:ID],afterany:ID",
        help="sbatch's spelling of --after (afterok) and --after-any (afterany)",
    )
    sp.add_argument(
        "--sweep",
        action="append",
        metavar="NAME=V1,V2",
        help="one job per combination of the values, each in the command as {NAME} (repeatable)",
    )
    sp.add_argument(
        "--spec",
        metavar="FILE",
        help="submit this spec file (checked as a worker would), with the options given over its fields",
    )

    add_limit_options(sp)
    add_environment_options(sp)
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")


def _show_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("id")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--env", action="store_true", help="list the whole environment (folded when long)")


def _logs_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("id")
    sp.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing until the job ends; then exit with its exit status (a group's: 0 if all are done)",
    )
    sp.add_argument("-n", "--lines", type=_count, metavar="N", help="only the last N lines (and on, with -f)")


def _wait_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ids", nargs="+", metavar="ID", help="job ids (a sweep's or array's id: its members)")
    sp.add_argument("--timeout", help="give up after this long (90s, 10m, 2h); default: wait as long as it takes")


def _fake_use_arguments(sp: argparse.ArgumentParser) -> None:
    """Its own parser reads its arguments (host/fake_use.py: the launcher runs it without the
    CLI); this one passes them on whole, and loads it only when it runs (not as root's CLI)."""
    sp.add_argument("arguments", nargs=argparse.REMAINDER)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines; give one like 20")
    return int(text)


def _top_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (default 2)")
    sp.add_argument("--iterations", type=int, help="stop after this many screens")


def _edit_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ids", nargs=1, metavar="ID")


def _dismiss_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("ids", nargs="+", metavar="ID")


def _host_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("host")


def _drain_arguments(sp: argparse.ArgumentParser) -> None:
    _host_arguments(sp)
    sp.add_argument("--reason", help="shown in status, e.g. 'driver update at 18:00'")


def _init_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("dir")
    sp.add_argument("--group", help="the team's group: the root is made theirs (setgid, sticky jobs/)")
    sp.add_argument(
        "--queue-user",
        default="gpuq",
        metavar="NAME",
        help="with --group, as root: the queue's own account, which owns the spool and runs the workers "
        "(made when missing; default gpuq)",
    )


def _json_argument(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--json", action="store_true")


def _cancel_arguments(sp: argparse.ArgumentParser) -> None:
    add_filter_options(sp)
    sp.add_argument(
        "--now",
        action="store_true",
        help="kill running jobs at once (SIGKILL), without their grace; also a job already stopping",
    )


def _completion_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("shell", choices=("bash", "zsh"))


def _prefix_argument(sp: argparse.ArgumentParser) -> None:
    """The completion script's `_ids`: what was typed of the id so far."""
    sp.add_argument("prefix", nargs="?", default="")


def _no_arguments(sp: argparse.ArgumentParser) -> None:
    pass


def _demo_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--dir", help="queue root to create (default: a new temp dir)")
    sp.add_argument("--quick", action="store_true", help="shorter jobs")
    sp.add_argument(
        "--keep", action="store_true", help="keep the temp queue root to look around (--dir is always kept)"
    )


_MOVE = _lazy("cli.workflow", "cmd_move")
_DRAIN = _lazy("cli.workflow", "cmd_drain")
# gpuq's own verbs, in the order `gpuq --help` lists them; the extras' follow.
CORE_VERBS = (
    _Verb(
        "status",
        _lazy("cli.status", "cmd_status"),
        "hosts, GPUs, running, pending (with reasons), finished",
        _status_arguments,
    ),
    _Verb(
        "submit",
        _lazy("cli.submit", "cmd_submit"),
        "write a spec into jobs/; prints the job id last",
        _submit_arguments,
    ),
    _Verb("show", _lazy("cli.show", "cmd_show"), "everything known about one job", _show_arguments),
    _Verb("logs", _lazy("cli.logs", "cmd_logs"), "print a job's log", _logs_arguments),
    _Verb(
        "cancel",
        _lazy("cli.workflow", "cmd_cancel"),
        "cancel pending or running jobs, from any host",
        _cancel_arguments,
    ),
    _Verb(
        "wait",
        _lazy("cli.waiting", "cmd_wait"),
        "wait until jobs have ended; exit 0 when all are done, 1 when one is not, 3 on --timeout",
        _wait_arguments,
    ),
    _Verb(
        "fake-use",
        _lazy("host.fake_use", "cmd_fake_use"),
        "inside a job on fake GPUs: use fake GPU memory (gpuq fake-use --help)",
        _fake_use_arguments,
    ),
    _Verb("top", _lazy("cli.status", "cmd_top"), "the status screen, refreshed live", _top_arguments),
    _Verb("hold", _MOVE, "keep pending jobs from starting (they keep their place)", add_filter_options),
    _Verb("release", _MOVE, "put held jobs back at their place in the queue", add_filter_options),
    _Verb("retry", _MOVE, "put ended jobs back in the queue as their next attempt", add_filter_options),
    _Verb("edit", _MOVE, "open a pending job's spec in $EDITOR; it waits out of the queue meanwhile", _edit_arguments),
    _Verb(
        "dismiss",
        _MOVE,
        "take refused specs' lines off REJECTED (their files in state/rejected/ go)",
        _dismiss_arguments,
    ),
    _Verb("drain", _DRAIN, "let a host's running jobs finish and start nothing new there", _drain_arguments),
    _Verb("resume", _DRAIN, "let a drained host take jobs again", _host_arguments),
    _Verb(
        "forget",
        _DRAIN,
        "stop listing a host taken out of the team (admins; its worker stopped, no job left there)",
        _host_arguments,
    ),
    _Verb("init", _lazy("cli.workflow", "cmd_init"), "make a new queue root and print the cron line", _init_arguments),
    _Verb(
        "doctor",
        _lazy("cli.workflow", "cmd_doctor"),
        "check NVML, hosts, permissions, file systems, clocks, cron and versions; each finding with its fix",
        _json_argument,
    ),
    _Verb(
        "completion",
        _lazy("cli.completion", "cmd_completion"),
        'print the shell completion script: eval "$(gpuq completion bash)"',
        _completion_arguments,
    ),
    _Verb("_ids", _lazy("cli.completion", "cmd_completion"), None, _prefix_argument),
    _Verb("_hosts", _lazy("cli.completion", "cmd_completion"), None, _no_arguments),
    _Verb(
        "demo",
        _lazy("cli.demo", "cmd_demo"),
        "the whole flow on fake GPUs: two boxes, a dozen jobs, the status screen",
        _demo_arguments,
    ),
)
CORE_VERB_NAMES = frozenset(verb.name for verb in CORE_VERBS)
