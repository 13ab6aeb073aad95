"""Strict YAML for specs and config: safe loading only, no duplicate keys, no anchors or
aliases, no tags, bounded nesting. Errors are SpecErrors naming the file and the fix."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

from gpuq.model.errors import MAX_SPEC_BYTES, SpecError

MAX_NESTING = 32


def _loader_class() -> type:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class StrictLoader(base):  # type: ignore[misc, valid-type]
        """Safe loader that refuses duplicate keys (YAML would keep the last one silently)."""

        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):  # `{{}}: 1`, `[a]: 1`: YAML allows it, a spec never
                    raise _UnhashableKey(type(key).__name__)
                if key in seen:
                    raise _DuplicateKey(str(key))
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    # YAML 1.1's base-60 numbers (1:30 read as 90) are strings here: a spec's 1:30:00 is a
    # time as sbatch reads it (model/units.py), never an integer YAML made of it.
    StrictLoader.yaml_implicit_resolvers = {
        first: [(tag, _without_base_60(tag, regexp)) for tag, regexp in resolvers]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    return StrictLoader


def _without_base_60(tag: str, regexp: re.Pattern) -> re.Pattern:
    if not tag.endswith((":int", ":float")):
        return regexp
    return re.compile(r"(?!.*:)(?:" + regexp.pattern + ")", regexp.flags)


class _DuplicateKey(Exception):
    pass


class _UnhashableKey(Exception):
    pass


_LOADER: type | None = None


def _check_node_tree(root: Any, file: str) -> None:
    """Refuse aliases (an alias bomb expands to gigabytes) and absurd nesting, before
    constructing anything. Aliased nodes are the same object, so identity finds them."""
    seen: set[int] = set()
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise _too_deep(file)
        if id(node) in seen:
            raise SpecError(
                file,
                None,
                "YAML anchors/aliases are not allowed",
                "write the value out instead of using &anchor/*alias",
            )
        seen.add(id(node))
        if isinstance(node.value, list):
            for item in node.value:
                if isinstance(item, tuple):
                    stack.extend((n, depth + 1) for n in item)
                else:
                    stack.append((item, depth + 1))


def load_yaml(text: bytes, file: str) -> Any:
    """YAML through a safe loader: no tags that build objects, no aliases, no duplicate keys."""
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _loader_class()
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(
            file,
            None,
            f"file is {len(text)} bytes, over the {MAX_SPEC_BYTES} cap",
            "a spec is a few lines; put data in files the command reads",
        )
    try:
        decoded = text.decode("utf-8-sig")  # a BOM is fine
    except UnicodeDecodeError as e:
        raise SpecError(
            file, None, f"not UTF-8 text ({e.reason} at byte {e.start})", "save the file as UTF-8"
        ) from None
    if "\x00" in decoded:
        raise SpecError(file, None, "contains a NUL byte", "save the file as plain UTF-8 text")
    loader = _LOADER(decoded)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node_tree(node, file)
        return loader.construct_document(node)
    except _DuplicateKey as e:
        raise SpecError(file, str(e), "key appears twice", "keep one of the two lines") from None
    except _UnhashableKey as e:
        raise SpecError(
            file,
            None,
            f"a key is a {e} (a mapping or a list), not a name",
            "write keys as plain names, like `command:`",
        ) from None
    except yaml.constructor.ConstructorError as e:
        tag = getattr(e, "problem", "") or ""
        raise SpecError(
            file,
            None,
            f"uses a YAML tag gpuq never constructs ({tag.strip()})",
            "remove the `!!...` tag; a spec holds plain strings, numbers and lists",
        ) from None
    except yaml.YAMLError as e:
        if "nesting depth" in str(e):  # PyYAML >= 6.0.4 stops deep nesting itself, before we do
            raise _too_deep(file) from None
        first_line = str(e).strip().splitlines()
        detail = " ".join(line.strip() for line in first_line[:3])
        fix = (
            "indent with spaces: YAML does not allow tabs"
            if "tab character" in detail
            else "check indentation and quoting; `key: value` per line"
        )
        raise SpecError(file, None, f"not valid YAML ({detail})", fix) from None
    except RecursionError:
        raise _too_deep(file) from None
    finally:
        loader.dispose()


def _too_deep(file: str) -> SpecError:
    return SpecError(
        file, None, f"nesting deeper than {MAX_NESTING} levels", "a spec is a flat mapping; remove the nesting"
    )
