"""Which events a job asks to be told of: the spec's `notify` (words start, end, fail, all),
`gpuq submit --notify`, and which of them one transition of the event log is. Pure (the
member's default, `on:` in their own notify.yaml, is memberfile.py's)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

WORDS = ("start", "end", "fail", "all")
FAIL_STATES = frozenset({"failed", "timeout", "lost"})
END_STATES = frozenset({"done", "failed", "cancelled", "timeout", "lost"})
FIX = "write start, end, fail or all, or a list of them, e.g. `notify: [end, fail]`"


def words(value: Any) -> list[str]:
    """The words of `value` (a word, a comma list, or a YAML list of words), in WORDS' order,
    each once; ValueError with the problem for anything else."""
    if isinstance(value, str):
        given = [w.strip() for w in value.split(",")]
    elif isinstance(value, list) and all(isinstance(w, str) for w in value):
        given = [w.strip() for w in value]
    else:
        raise ValueError(f"must be a word or a list of words, not {type(value).__name__}")
    if not given or not all(given):
        raise ValueError("has an empty word")
    unknown = [w for w in given if w not in WORDS]
    if unknown:
        raise ValueError(f"{unknown[0][:40]!r} is not one of {', '.join(WORDS)}")
    return [w for w in WORDS if w in given]


def parse_field(value: Any, fail: Callable[[str, str, str], Exception]) -> list[str] | None:
    """The spec's `notify` as JSON (its words), or None for an empty list."""
    if value is None or value == []:
        return None
    try:
        return words(value)
    except ValueError as e:
        raise fail("notify", str(e), FIX) from None


def event_of(notify: object, transition: Mapping[str, Any]) -> str | None:
    """Which asked-for event a transition of the event log is ("start", "end" or "fail"),
    or None: not a start nor an end, or not one the job asked for."""
    asked = set(notify) if isinstance(notify, list) else set()
    if "all" in asked:
        asked |= {"start", "end"}
    to = transition.get("to")
    if to == "running" and "start" in asked:
        return "start"
    if to in END_STATES and transition.get("from") != to:
        if "end" in asked:
            return "end"
        if "fail" in asked and to in FAIL_STATES:
            return "fail"
    return None
