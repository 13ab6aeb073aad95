"""Containers, an extra: a spec's `container:` (an image, its runtime docker, podman or
apptainer, mounts and allowed options: spec.py), the job started through the runtime's
client as its owner with exactly its GPUs (client.py, launching.py: a launch wrapper), the
container stopped, killed and removed with the job, and removed after a supervisor that died,
the worker's probe of its host's runtimes (the plan places a job only where its runtime is),
and `gpuq submit --container`. README.md here is its page."""

from __future__ import annotations

from gpuq.extras.containers.options import add_options
from gpuq.extras.containers.spec import FIELD
from gpuq.hooks import HostOffers, LaunchWrapper, Registry, SpecField


def register(registry: Registry) -> None:
    registry.spec_fields["container"] = SpecField(
        "container",
        FIELD,
        "extras.containers.spec:parse_field",
        need="extras.containers.spec:runtime_of",
        options=add_options,
        from_options="extras.containers.options:from_options",
        isolated=True,
    )
    registry.launch_wrappers.append(
        LaunchWrapper(
            "container",
            "container",
            "extras.containers.launching:wrap",
            recover="extras.containers.launching:recover",
        )
    )
    registry.offers.append(HostOffers("runtimes", "extras.containers.launching:offers"))
