"""The error a spec that cannot run raises, the size past which a spec is not read, and how a
value YAML read is named in messages: shared by spec parsing, the checks of job groups and the
strict YAML loader beneath them."""

from __future__ import annotations

from typing import Any

MAX_SPEC_BYTES = 256 * 1024


class SpecError(Exception):
    """A spec that cannot run, with the file, the field and the fix."""

    def __init__(self, file: str, field: str | None, problem: str, fix: str) -> None:
        self.file, self.field, self.problem, self.fix = file, field, problem, fix
        where = f"{file}: field '{field}'" if field else file
        super().__init__(f"{where}: {problem}. Fix: {fix}" + ("" if fix.endswith((".", ")")) else "."))


def kind_of(value: Any) -> str:
    """What YAML read a value as, in a message's words."""
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "text",
        list: "a list",
        dict: "a mapping",
        type(None): "empty",
    }.get(type(value), type(value).__name__)
