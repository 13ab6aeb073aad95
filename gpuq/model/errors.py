"""The error a spec that cannot run raises, and the size past which a spec is not read: shared by
spec parsing and the strict YAML loader beneath it."""

from __future__ import annotations

MAX_SPEC_BYTES = 256 * 1024


class SpecError(Exception):
    """A spec that cannot run, with the file, the field and the fix."""

    def __init__(self, file: str, field: str | None, problem: str, fix: str) -> None:
        self.file, self.field, self.problem, self.fix = file, field, problem, fix
        where = f"{file}: field '{field}'" if field else file
        super().__init__(f"{where}: {problem}. Fix: {fix}" + ("" if fix.endswith((".", ")")) else "."))
