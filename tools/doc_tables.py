"""The reference tables of docs/reference.md, rendered from the one schema: the spec's fields
from spec_fields.FIELDS, the config keys from config.KEYS and the `Config` defaults, each
key's meaning from its comment in the shipped config.yaml (the text an operator reads when
editing it). tests/test_docs.py fails when docs/reference.md's tables differ from these.

    python -m tools.doc_tables                          # print both tables
    python -m tools.doc_tables --check docs/reference.md  # exit 1 when its tables differ
    python -m tools.doc_tables --write docs/reference.md  # rewrite its tables in place

In the docs each table sits between `<!-- generated: NAME -->` and `<!-- end generated -->`.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuq.model import config as config_mod
from gpuq.model.spec_fields import FIELDS, Field
from gpuq.model.units import DURATION_EXAMPLES, SIZE_EXAMPLES, format_mib
from gpuq.model.windows import EXAMPLES as WINDOW_EXAMPLES

SHIPPED_CONFIG = Path(__file__).resolve().parents[1] / "config.yaml"
SPEC_FIELDS = "spec fields"
CONFIG_KEYS = "config keys"
END = "<!-- end generated -->"
_BLOCK = re.compile(r"<!-- generated: ([a-z ]+) -->\n(.*?)" + re.escape(END), re.S)

# What each config parser accepts, in the words of the docs (by the parser's name in config.py).
_TYPES: dict[str, str] = {
    "_seconds": "seconds",
    "_size": f"size ({SIZE_EXAMPLES})",
    "_optional_size": f"size ({SIZE_EXAMPLES})",
    "_optional_duration": f"duration ({DURATION_EXAMPLES})",
    "_positive_duration": f"duration ({DURATION_EXAMPLES})",
    "_non_negative_seconds": "seconds ≥ 0",
    "_gpu_map": "host → list of GPU indices",
    "_optional_path": "absolute path",
    "_non_negative_int": "whole number ≥ 0",
    "_optional_positive_int": "positive whole number",
    "_optional_positive_float": "positive number",
    "_percent": "whole number 0–100",
    "_user_names": "list of user names",
    "_bool": "true or false",
    "_overuse_action": "warn or kill",
    "_optional_command": "shell command",
    "_windows": f"list of windows ({WINDOW_EXAMPLES})",
    "_backend": "local or slurm",
    "_container_runtime": "docker, podman or apptainer",
    "_gpu_sharing": "time-slicing or mps",
    "_class_map": "priority class → name",
    "_clients": "runtime → absolute path",
    "_client_env": "variable → value",
    "_slurm_gpu_mem": "comment, constraint or shards",
    "_gpu_types": "node feature → size",
}


def _cell(text: str) -> str:
    """One table cell: on one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{_cell(text)}`"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def spec_fields_table(schema: Mapping[str, Field] = FIELDS) -> str:
    """Every spec field: its type, default, meaning and an example."""
    lines = [_row(["field", "type", "default", "meaning", "example"]), _row(["---"] * 5)]
    for name, f in schema.items():
        lines.append(_row([_code(name), _cell(f.type), _cell(f.default), _cell(f.doc), _code(f.example)]))
    return "\n".join(lines) + "\n"


def parser_type(parse: Callable[[Any], Any]) -> str | None:
    """What a config parser accepts, in words; None for a parser this module does not know."""
    name = parse.__qualname__
    if name == "_positive.<locals>.parse":  # _positive(int) or _positive(float): its message says which
        what = str(inspect.getclosurevars(parse).nonlocals.get("what", ""))
        return what.removeprefix("a ") or None
    return _TYPES.get(name)


def default_text(key: str) -> str:
    """The default of a config key as one writes it in config.yaml."""
    attr, parse = config_mod.KEYS[key]
    value = getattr(config_mod.Config(), attr)
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return "true" if value else "false"
    if parse.__qualname__ in ("_size", "_optional_size"):
        return format_mib(value)
    if parse.__qualname__ == "_positive_duration":  # in the largest unit that divides it: 7d, 12h, 90s
        return next(f"{value // n:g}{u}" for n, u in ((86400, "d"), (3600, "h"), (60, "m"), (1, "s")) if value % n == 0)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def _is_example(value: str) -> bool:
    """A commented-out value (`[...]`, `{...}`, a quoted string or one word), not prose."""
    return not value or value[0] in "[{\"'" or len(value.split()) == 1


def config_comments(text: str) -> dict[str, str]:
    """Each key's meaning, from the comments of a config.yaml written as the shipped one is: a
    key's trailing comment and the comment lines just above it, else those above the run of
    keys (no blank line between) it belongs to. A section ruler (`--- Alerts (...) --- text`)
    reads "Alerts: text", or nothing when no text follows it; a commented-out example of a key
    (`# idle_windows: [...]`, or `# gpus:` with indented lines) becomes "e.g. `...`"."""
    found: dict[str, str] = {}
    block: list[str] = []  # comment lines since the last key or blank line
    run = ""  # the meaning shared by the current run of keys
    example: list[str] | None = None  # the indented lines of a commented-out `key:`
    notes: list[str] = []

    def flush_example() -> None:
        nonlocal example
        if example:
            block.append("e.g. `{" + ", ".join(example) + "}`" + "".join(f" ({n})" for n in notes))
        example = None
        notes.clear()

    for raw in text.splitlines():
        line = raw.rstrip()
        if not line:
            flush_example()
            block, run = [], ""
            continue
        if line.startswith("#"):
            body = line[1:]
            stripped = body.strip()
            if example is not None and body.startswith("   "):
                value, _, note = stripped.partition("#")
                example.append(value.strip())
                if note.strip():
                    notes.append(note.strip())
                continue
            flush_example()
            key, sep, rest = stripped.partition(":")
            value, _, note = rest.partition("#")
            if sep and key in config_mod.KEYS and _is_example(value.strip()):
                if value.strip():
                    block.append(f"e.g. `{value.strip()}`" + (f"; {note.strip()}" if note.strip() else ""))
                else:
                    example = []
                continue
            ruler = re.match(r"---\s*(.*?)\s*(\(.*?\))?\s*---\s*(.*)$", stripped)
            if ruler:
                stripped = f"{ruler.group(1)}: {ruler.group(3)}" if ruler.group(3) else ""
            if stripped:
                block.append(stripped)
            continue
        flush_example()
        key, sep, rest = line.partition(":")
        if not sep or key not in config_mod.KEYS:
            continue
        _, _, trailing = rest.partition("#")
        own = " ".join(block)
        run = own or run
        found[key] = f"{trailing.strip()}; {own}" if trailing.strip() and own else trailing.strip() or run
        block = []
    return found


def config_keys_table(config_text: str | None = None) -> str:
    """Every config key: what it takes, its default and its meaning."""
    text = SHIPPED_CONFIG.read_text() if config_text is None else config_text
    meanings = config_comments(text)
    lines = [_row(["key", "type", "default", "meaning"]), _row(["---"] * 4)]
    for key, (_, parse) in config_mod.KEYS.items():
        lines.append(
            _row(
                [
                    _code(key),
                    _cell(parser_type(parse) or "see meaning"),
                    "(empty)" if default_text(key) == "empty" else _code(default_text(key)),
                    _cell(meanings.get(key, "")),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def tables() -> dict[str, str]:
    return {SPEC_FIELDS: spec_fields_table(), CONFIG_KEYS: config_keys_table()}


def generated_blocks(text: str) -> dict[str, str]:
    """The generated tables a document holds, by name."""
    return {m.group(1): m.group(2) for m in _BLOCK.finditer(text)}


def differences(text: str, expected: Mapping[str, str] | None = None) -> list[str]:
    """What differs between a document's generated tables and the schema's; empty when none."""
    expected = tables() if expected is None else expected
    found = generated_blocks(text)
    problems = []
    for name, table in expected.items():
        if name not in found:
            problems.append(f"no `<!-- generated: {name} -->` ... `{END}` block")
        elif found[name] != table:
            have, want = found[name].splitlines(), table.splitlines()
            rows = [w.split(" | ")[0].lstrip("| ") for h, w in zip(have, want) if h != w]
            if len(have) != len(want):
                rows.append(f"{len(have)} lines, the schema gives {len(want)}")
            problems.append(f"the {name} table differs from the schema: {', '.join(rows)}")
    return problems


def replace_blocks(text: str, expected: Mapping[str, str] | None = None) -> str:
    """The document with each generated table rendered anew."""
    expected = tables() if expected is None else expected
    return _BLOCK.sub(lambda m: f"<!-- generated: {m.group(1)} -->\n{expected.get(m.group(1), m.group(2))}{END}", text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] in ("--check", "--write"):
        path = Path(argv[1])
        text = path.read_text()
        if argv[0] == "--write":  # a developer's tool on their own checkout (never the worker, never root's
            path.write_text(replace_blocks(text))  # spool): it writes the file named, as their editor would
            return 0
        problems = differences(text)
        for problem in problems:
            print(f"{path}: {problem}. Fix: python -m tools.doc_tables --write {path}", file=sys.stderr)
        return 1 if problems else 0
    if argv:
        print("usage: python -m tools.doc_tables [--check FILE | --write FILE]", file=sys.stderr)
        return 2
    for name, table in tables().items():
        print(f"<!-- generated: {name} -->\n{table}{END}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
