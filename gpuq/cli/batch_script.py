"""`gpuq submit train.sbatch`: a batch script's `#SBATCH` lines read as submit's options (it
takes sbatch's spellings), under the options typed on the command line, as sbatch reads them;
the script, run by the interpreter its `#!` line names, is the job's command."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from gpuq.cli.options import sbatch_only
from gpuq.model.secrets import looks_secret

DIRECTIVE = "#SBATCH"
MAX_SCRIPT_BYTES = 1 << 20


class ScriptError(Exception):
    pass


def directives(path: str) -> list[tuple[int, list[str]]] | None:
    """Each #SBATCH line's options (with its line number), read as sbatch reads them (those
    before the first command; a `#` after them starts a comment); None when `path` is not a
    script (a file whose first line is `#!`)."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_SCRIPT_BYTES).decode("utf-8", "replace")
    except (OSError, IsADirectoryError):
        return None
    lines = text.splitlines()
    if not lines or not lines[0].startswith("#!"):
        return None
    found: list[tuple[int, list[str]]] = []
    for number, line in enumerate(lines[1:], 2):
        stripped = line.strip()
        if stripped.startswith(DIRECTIVE):
            try:
                found.append((number, shlex.split(stripped[len(DIRECTIVE) :], comments=True)))
            except ValueError as e:
                raise ScriptError(f"{path}, line {number}: {e} in {stripped!r}") from None
        elif stripped and not stripped.startswith("#"):
            break  # sbatch reads no #SBATCH line after the first command
    return found


SHELLS = {"sh", "bash", "dash", "zsh", "ksh"}
MAX_COPIED_BYTES = 128 * 1024  # a copy travels in the spec (model/errors.py MAX_SPEC_BYTES)


def command_of(path: str, arguments: list[str], team_gid: int) -> tuple[list[str], str | None]:
    """The script run by its `#!` interpreter with `arguments`, and a note for the submitter
    (or None). A shell script the team may read already (others may, or the team's group,
    `team_gid`) is copied now, as sbatch copies it: the job runs the text submitted even if
    the file is edited while it waits (`$0` is still the file's path). The spec is the team's
    to read, so a private script (its secrets, say) is never copied: it runs from its file, by
    its absolute path (the job may run elsewhere), as it is when the job starts, and so does
    another interpreter's script (Python's) or one that is not UTF-8 text; the note says so."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        data = f.read(MAX_COPIED_BYTES + 1)
    first = data.split(b"\n", 1)[0].decode("utf-8", "replace")
    try:
        interpreter = shlex.split(first[2:])
    except ValueError as e:
        raise ScriptError(f"{path}, line 1: {e} in {first!r}") from None
    where = os.path.abspath(path)
    from_file = [*interpreter, where, *arguments]
    if _program(interpreter) not in SHELLS:
        return from_file, f"{path} runs as the file is when the job starts (copy it to keep it)"
    if not (st.st_mode & 0o004 or (st.st_mode & 0o040 and st.st_gid == team_gid)):
        return from_file, (
            f"{path} is private (mode {st.st_mode & 0o777:o}): not copied into the queue, where the team reads "
            "specs; it runs as the file is when the job starts (copy it to keep it)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return from_file, f"{path} is not UTF-8 text: not copied; it runs as the file is when the job starts"
    if len(data) > MAX_COPIED_BYTES:
        raise ScriptError(
            f"{path} is over {MAX_COPIED_BYTES // 1024} KiB, too big to copy into the queue: "
            "keep its bulk in another file it runs"
        )
    return [*interpreter, "-c", text, where, *arguments], None


def with_script_options(
    args: argparse.Namespace, submit: argparse.ArgumentParser, path: str, found: list[tuple[int, list[str]]]
) -> list[str]:
    """`args` with each option the script's lines give that the command line did not (a value
    left at its default), each line parsed by submit's own parser. Returns a note for each
    sbatch option gpuq has no such thing for (a script's `--partition` or `--output` is read
    past, said once); raises ScriptError for any other it does not know."""
    notes = []
    for number, words in found:
        if not words:
            continue
        if instead := sbatch_only(words[:1]):
            notes.append(f"{path}, line {number}: {instead[0]}; read past")
            continue
        parsed, unknown = submit.parse_known_args([*words, "--", "placeholder"])
        if unknown or parsed.command != ["--", "placeholder"]:
            raise ScriptError(f"{path}, line {number}: #SBATCH {' '.join(words)} is not an option gpuq has")
        for key, value in vars(parsed).items():
            if key == "export" and isinstance(value, str) and _unset(args.export):
                value, secrets = _without_secrets(value)
                if secrets:  # a script (maybe another member's) must not carry your secrets into a spec
                    notes.append(
                        f"{path}, line {number}: --export names {', '.join(secrets)}, which look like secrets: a "
                        "script exports none of yours (give --export on the command line to)"
                    )
            if key != "command" and _unset(getattr(args, key, None)) and not _unset(value):
                setattr(args, key, value)
    return notes


def _without_secrets(export: str) -> tuple[str, list[str]]:
    """An --export value without the names of your variables that look like secrets (a value
    written into the script itself, NAME=VALUE, is the script's own and stays)."""
    kept, secrets = [], []
    for item in export.split(","):
        if "=" not in item and looks_secret(item.strip()):
            secrets.append(item.strip())
        else:
            kept.append(item)
    return ",".join(kept), secrets


def _unset(value: object) -> bool:
    """An option left out: None, a flag not given, no repeated values (0 is a value: -G 0)."""
    return value is None or value is False or value == []


def _program(interpreter: list[str]) -> str:
    """The program a `#!` line runs: `bash` for `/bin/bash`, `/usr/bin/env bash` and
    `/usr/bin/env -S bash -x` (env's options and NAME=VALUE words are not the program)."""
    if interpreter and Path(interpreter[0]).name == "env":
        interpreter = [w for w in interpreter[1:] if not w.startswith("-") and "=" not in w]
    return Path(interpreter[0]).name if interpreter else ""


def is_script(command: list[str]) -> bool:
    """`gpuq submit train.sbatch [ARG ...]`: a file here whose first line is `#!`."""
    return bool(command) and Path(command[0]).is_file()
