"""Text that is safe to print to a terminal: anything a terminal would act on, escaped."""

from __future__ import annotations

import functools
import re
from typing import Any

# What a terminal acts on instead of showing: C0 controls (ESC starts every escape sequence;
# newline and CR fake extra lines), DEL, C1 controls (0x9b is CSI, 0x9d OSC on 8-bit
# terminals), the bidi marks, embeddings, overrides and isolates that reorder what is shown
# (U+202E makes "cod.exe" read "exe.doc"), the Unicode line and paragraph separators, and lone
# surrogates (undecodable file names; printing one raises UnicodeEncodeError).
_UNSAFE_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(c: str) -> str:
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


_UNSAFE_CODES = [
    *range(0x00, 0x20),
    *range(0x7F, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    0x2028,
    0x2029,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    *range(0xD800, 0xE000),
]


@functools.lru_cache(maxsize=8)
def _table(keep: str) -> dict[int, str]:
    """str.translate's table for _UNSAFE_RE's characters but `keep`: a log of hundreds of
    megabytes is escaped in C, not a Python call per character."""
    return {c: _escape_char(chr(c)) for c in _UNSAFE_CODES if chr(c) not in keep}


def safe_text(text: object, keep: str = "") -> str:
    """`text` as it may be printed to a terminal: every character a terminal would act on
    (see _UNSAFE_RE) written as its escape, except those in `keep` (e.g. "\\n" for text
    that is meant to span lines). Printable text, including non-ASCII, is left alone."""
    text = text if isinstance(text, str) else str(text)
    if _UNSAFE_RE.search(text) is None:
        return text
    return text.translate(_table(keep))


def safe_tree(value: Any) -> Any:
    """A read model (dicts, lists, strings, numbers) with every string, keys included, passed
    through safe_text: the renderers below print only what this returns."""
    kind = type(value)  # exact types first: a status of 50 boxes walks some 25,000 values
    if kind is str:
        return value if _UNSAFE_RE.search(value) is None else safe_text(value)
    if kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_tree(k): safe_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_tree(v) for v in value]
    return value
