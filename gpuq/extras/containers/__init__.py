"""Containers, an extra: a spec's `container:` (an image, its runtime docker, podman or
apptainer, mounts and allowed options: spec.py), the job started through the runtime's
client as its owner with exactly its GPUs (client.py, launching.py: a launch wrapper), the
container stopped, killed and removed with the job, and removed after a supervisor that died,
the worker's probe of its host's runtimes (the plan places a job only where its runtime is),
and `gpuq submit --container` (options.py). README.md here is its page.

Every gpuq process imports this module, root's `gpuq` too (docs/security.md, "What runs as
root"): it imports nothing but the registry's types, and names the rest by "module:function",
loaded only where a job asks for a container.
"""

from __future__ import annotations

import argparse

from gpuq.hooks import HostOffers, LaunchWrapper, Registry, SpecField


def _submit_options(sp: argparse.ArgumentParser) -> None:
    """`gpuq submit --container IMAGE [--runtime R] [--mount SRC:DST[:ro]]...` (argparse only)."""
    sp.add_argument("--container", metavar="IMAGE", help="run inside this image (the containers extra)")
    sp.add_argument(
        "--runtime",
        choices=("docker", "podman", "apptainer"),
        help="the container's runtime (default: config container_runtime)",
    )
    sp.add_argument("--mount", action="append", metavar="SRC:DST[:ro]", help="also mount this into the container")


CONTAINER = SpecField(
    "container",
    "image, or mapping: image, runtime, mounts, options",
    "none (runs on the host)",
    "Run the command inside this container image with exactly the job's GPUs, the "
    "workdir mounted, as the job's owner; runtime docker, podman or apptainer (default: "
    "config container_runtime); mounts like /data:/data:ro, each readable by the job's owner; "
    "options from an allow-list (--shm-size, --ulimit, --tmpfs, --read-only, ...: "
    "gpuq/extras/containers/README.md). Placed only on hosts that have the runtime.",
    "{image: nvcr.io/nvidia/pytorch:24.05-py3, mounts: [/data:/data:ro]}",
    "extras.containers.spec:parse_field",
    need="extras.containers.spec:runtime_of",
    options=_submit_options,
    from_options="extras.containers.options:from_options",
    isolated=True,
)


def register(registry: Registry) -> None:
    registry.spec_fields["container"] = CONTAINER
    registry.launch_wrappers.append(
        LaunchWrapper(
            "container",
            "container",
            "extras.containers.launching:wrap",
            recover="extras.containers.launching:recover",
        )
    )
    registry.offers.append(HostOffers("runtimes", "extras.containers.launching:offers"))
