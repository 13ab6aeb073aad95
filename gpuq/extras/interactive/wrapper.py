"""The spec field `attach` that `gpuq run` and `gpuq shell` write (client.py), and the launch
wrapper that puts the job's end of the session (attach.py) around such a job's command.

`attach: {socket: PATH, idle_s: SECONDS or null}`: the Unix socket the member's `gpuq run`
listens on, on the box it runs on (the spec's `hosts`), and for a shell the idle time after
which it is released. The path is no secret: the socket lives in a directory only its owner may
enter, and the job's end checks the listener is its own owner's.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpuq.hooks import module_argv
from gpuq.model.environments import ErrorFactory
from gpuq.run.launch import Start, Wrapped

MAX_IDLE_S = 7 * 86400.0


def wrap(start: Start) -> Wrapped | None:
    attach = start.spec.extras.get("attach")
    if not isinstance(attach, dict):
        return None
    idle = attach.get("idle_s")
    # The worker's interpreter (every member can run it: README, On a GPU box) and gpuq's code.
    argv = [
        *module_argv("extras.interactive.attach"),
        attach["socket"],
        "-" if idle is None else f"{idle:g}",
        "--",
        *start.argv,
    ]
    env = {**start.base_env, **start.variables, **(start.identity.environment() if start.identity else {})}
    seen = "the environment of your `gpuq run` (your shell's), then these"
    return Wrapped(argv, env, "attached", "gpuq run", dict(start.variables), seen)


def parse_field(value: Any, fail: ErrorFactory) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str):  # as `gpuq submit --attach` passes it
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if not isinstance(value, dict) or set(value) - {"socket", "idle_s"}:
        raise fail("attach", "is not a mapping of socket and idle_s", "let `gpuq run` or `gpuq shell` write it")
    path, idle = value.get("socket"), value.get("idle_s")
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 100 or any(c in path for c in "\0\n"):
        raise fail("attach", "socket is not an absolute path of at most 100 characters", "let `gpuq run` write it")
    number = isinstance(idle, (int, float)) and not isinstance(idle, bool)
    if idle is not None and (not number or not 0 < idle <= MAX_IDLE_S):
        raise fail("attach", f"idle_s {idle!r} is not a number of seconds up to 7 days", "let `gpuq shell` write it")
    return {"socket": path, "idle_s": idle}


def from_options(args: argparse.Namespace) -> Any:
    return getattr(args, "attach", None)
