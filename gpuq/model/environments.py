"""The software a job runs in: its virtualenv or conda environment, and its setup lines
(a container is the containers extra's: gpuq/extras/containers/). Parsing of those spec
fields (with messages that name the fix), and the shell prelude that activates them before
the command.

The prelude is plain /bin/sh, so it runs the same on the host and inside any image. It is
added only when a spec asks for it: every other job starts exactly as before.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Callable

ErrorFactory = Callable[[str, str, str], Exception]  # (field, problem, fix) -> SpecError
_CONDA_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,100}$")


def parse_venv(value: Any, fail: ErrorFactory) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in "\x00\n"):
        raise fail(
            "venv",
            f"{value!r} is not an absolute path",
            "give the virtualenv's directory, "
            "e.g. `venv: /shared/envs/proj` (made with `python -m venv /shared/envs/proj`)",
        )
    return value.rstrip("/") or "/"


def parse_conda(value: Any, fail: ErrorFactory) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and (
        _CONDA_NAME.match(value) or (value.startswith("/") and "\x00" not in value and "\n" not in value)
    ):
        return value
    raise fail(
        "conda",
        f"{value!r} is not a conda environment",
        "give its name (`conda: torch-2.3`) or its full path (`conda: /opt/conda/envs/torch`)",
    )


def parse_setup(value: Any, fail: ErrorFactory) -> tuple[str, ...]:
    if value is None:
        return ()
    lines = [value] if isinstance(value, str) else value
    if not isinstance(lines, list) or not lines or not all(isinstance(s, str) and s.strip() for s in lines):
        raise fail(
            "setup",
            "must be a shell line or a list of shell lines",
            "e.g. `setup: [export HF_HOME=/scratch/hf, ./fetch_data.sh]`",
        )
    if any("\x00" in s for s in lines):
        raise fail("setup", "contains a NUL byte", "remove it")
    return tuple(lines)


def prelude_lines(venv: str | None, conda: str | None, setup: tuple[str, ...]) -> list[str]:
    """Shell lines that activate the environment and run the setup, each failure ending the
    job with a line in its log that says what failed (exit 1, or the setup line's status)."""
    if not (venv or conda or setup):
        return []
    lines = ['_gpuq_fail() { printf \'==> gpuq: %s\\n\' "$2" >&2; exit "$1"; }']
    if venv:
        activate = shlex.quote(f"{venv}/bin/activate")
        missing = shlex.quote(f"venv {venv}: no bin/activate (make it with: python -m venv {venv})")
        lines += [
            f"[ -r {activate} ] || _gpuq_fail 1 {missing}",
            f". {activate} || _gpuq_fail 1 {shlex.quote(f'venv {venv}: activation failed')}",
        ]
    if conda:
        name = shlex.quote(conda)
        lines += [
            '_gpuq_conda="${CONDA_EXE:-$(command -v conda)}"',
            '[ -n "$_gpuq_conda" ] || _gpuq_fail 1 "conda: not found (set CONDA_EXE or put conda on PATH)"',
            f'_gpuq_hook="$("$_gpuq_conda" shell.posix activate {name})" || '
            f"_gpuq_fail 1 {shlex.quote(f'conda environment {conda} could not be activated')}",
            f'eval "$_gpuq_hook" || _gpuq_fail 1 {shlex.quote(f"conda environment {conda}: activation failed")}',
            "unset _gpuq_conda _gpuq_hook",
        ]
    for n, line in enumerate(setup, 1):
        what = shlex.quote(f"setup line {n} failed: {line.splitlines()[0][:80]}")
        lines += [f"{{ {line}\n}} || _gpuq_fail $? {what}"]
    return lines


PRELUDE_FAILURES = ("venv ", "conda", "setup line ")  # how each of the prelude's own lines begins
_FAILED_LINE = "==> gpuq: "


def prelude_failure(log_tail: bytes) -> str | None:
    """What the prelude said failed (a venv without bin/activate, a conda environment that
    would not activate, a setup line's status), from the last lines of the job's log; None
    when the job's own command failed. The log is the job's: only a line of the prelude's
    form is taken, at most 200 characters (the caller escapes it where it is shown)."""
    for raw in reversed(log_tail.decode("utf-8", "replace").splitlines()):
        if raw.startswith(_FAILED_LINE) and raw[len(_FAILED_LINE) :].startswith(PRELUDE_FAILURES):
            return raw[len(_FAILED_LINE) :][:200]
    return None


def command_argv(command: str | tuple[str, ...], prelude: list[str]) -> list[str]:
    """The argv that runs the command after the prelude: the command itself when there is
    none, else one /bin/sh script (a list command is exec'd with its arguments unquoted)."""
    if not prelude:
        return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    if isinstance(command, str):
        return ["/bin/sh", "-c", "\n".join([*prelude, command])]
    return ["/bin/sh", "-c", "\n".join([*prelude, 'exec "$@"']), "gpuq-job", *command]
