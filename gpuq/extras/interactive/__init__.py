"""Interactive sessions, an extra: `gpuq run` (srun-like: a command that waits in the queue,
then runs attached to the member's terminal on the box they are on) and `gpuq shell`
(salloc-like: a shell with the job's GPUs, released when it exits or after config
`shell_idle_timeout` idle). client.py is the member's side, attach.py the job's (wrapped around
the spec's command by wrapper.py's launch wrapper, for a spec with `attach:`), wire.py what
travels between them, view.py the SESSIONS section of `gpuq status`. README.md here is its page.

Every gpuq process imports this module, root's `gpuq` too: it imports nothing but the
registry's types, and names the rest by "module:function".
"""

from __future__ import annotations

import argparse

from gpuq.hooks import LaunchWrapper, Registry, SpecField, StatusSection, Verb


def _asks(sp: argparse.ArgumentParser) -> None:
    """What the session asks of the queue: as `gpuq submit`'s options of the same names."""
    sp.add_argument("-G", "--gpus", type=int, help="GPUs (default 1; 0: CPU only)")
    sp.add_argument("--gpu-mem", help="memory per GPU, e.g. 10GiB (default: whole GPUs)")
    sp.add_argument("-t", "--time-limit", "--time", dest="time_limit", help="stop it after this long (2h, 90m)")
    sp.add_argument("-c", "--cpus", help="CPU cores held for it")
    sp.add_argument("--mem", help="host memory, e.g. 16GiB")
    sp.add_argument("--priority", help="high, normal, low, or an integer")
    sp.add_argument("-J", "--name", "--job-name", dest="name", help="its label and id stem (default: run or shell)")


def _run_arguments(sp: argparse.ArgumentParser) -> None:
    _asks(sp)
    sp.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")


def _submit_attach(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--attach", help=argparse.SUPPRESS)  # gpuq run's and gpuq shell's own


ATTACH = SpecField(
    "attach",
    "mapping: socket, idle_s",
    "none",
    "Written by `gpuq run` and `gpuq shell`: the job runs attached to the member's terminal through "
    "this socket on its box (gpuq/extras/interactive/README.md). Not for specs written by hand.",
    "{socket: /run/user/1000/gpuq/5f3a9c.sock, idle_s: null}",
    "extras.interactive.wrapper:parse_field",
    options=_submit_attach,
    from_options="extras.interactive.wrapper:from_options",
)


def register(registry: Registry) -> None:
    registry.verbs.append(
        Verb(
            "run",
            "run a command attached to this terminal once the queue gives it a GPU on this box (srun)",
            _run_arguments,
            "extras.interactive.client:cmd_run",
            slurm="srun",
        )
    )
    registry.verbs.append(
        Verb(
            "shell",
            "a shell with a GPU of this box, released when it exits or sits idle (salloc)",
            _asks,
            "extras.interactive.client:cmd_shell",
            slurm="salloc",
        )
    )
    registry.spec_fields["attach"] = ATTACH
    registry.launch_wrappers.append(LaunchWrapper("attach", "attach", "extras.interactive.wrapper:wrap"))
    registry.views.append(
        StatusSection(
            "sessions", "SESSIONS", "extras.interactive.view:read", "extras.interactive.view:render", after="RUNNING"
        )
    )
