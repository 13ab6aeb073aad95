"""`gpuq submit --container IMAGE [--runtime R] [--mount SRC:DST[:ro]]...`: the spec's
`container` the options make (the options themselves are declared in __init__.py: every
`gpuq submit` adds them, and loads this module only to read them)."""

from __future__ import annotations

import argparse
from typing import Any


def from_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """--container/--runtime/--mount -> the spec's `container`, as a spec file writes it."""
    if (args.runtime or args.mount) and not args.container:
        raise ValueError("--runtime and --mount are for a container: add --container IMAGE")
    if not args.container:
        return None
    container: dict[str, Any] = {"image": args.container}
    if args.runtime:
        container["runtime"] = args.runtime
    if args.mount:
        container["mounts"] = args.mount
    return container
