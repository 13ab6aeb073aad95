"""`gpuq submit --container IMAGE [--runtime R] [--mount SRC:DST[:ro]]...`: the options, and
the spec's `container` they make. argparse only: every `gpuq submit` adds them."""

from __future__ import annotations

import argparse
from typing import Any


def add_options(sp: argparse.ArgumentParser) -> None:
    """`gpuq submit --container IMAGE [--runtime R] [--mount SRC:DST[:ro]]...` (argparse only)."""
    sp.add_argument("--container", metavar="IMAGE", help="run inside this image (the containers extra)")
    sp.add_argument(
        "--runtime",
        choices=("docker", "podman", "apptainer"),
        help="the container's runtime (default: config container_runtime)",
    )
    sp.add_argument("--mount", action="append", metavar="SRC:DST[:ro]", help="also mount this into the container")


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
