"""The exact command line and environment gpuq builds for one start of a job, as the golden
files keep them (tests/golden/ for the core's, an extra's own tests/golden/ for its wrappers'):
job train-7, attempt 2, on GPUs 1 and 3 of box-a, cores 4-5, 8 GiB of RAM, owned by ana (uid
1001), started by a team queue's worker (the queue's account, uid 999, with docker allowed), or,
`as_owner`, by ana's own worker (rootless podman)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from gpuq.host.owners import Identity
from gpuq.model.record import Record
from gpuq.model.spec import parse_spec_text
from gpuq.model.states import State
from gpuq.run import launch as launch_module
from gpuq.run.joblocal import Runtime
from gpuq.spool.layout import Layout

ANA = Identity(1001, 1001, (1001, 2000), "ana", "/home/ana")
GOLDEN_CLAIM = "train-7@box-a@b00tb00t@4242@0a1b2c3d@a2.yaml"
CLIENTS = {r: f"/usr/bin/{r}" for r in ("docker", "podman", "apptainer")}


def golden_text(name: str, fields: str, monkeypatch: pytest.MonkeyPatch, as_owner: bool = False) -> str:
    """The start of train-7 with the spec's `fields` (YAML lines) added, as text: the argv one
    argument per line, the cwd and whom it runs as, its environment, and its stdin (an env file)."""
    spec = parse_spec_text(
        (
            "command: [python, train.py, --lr, '3e-4']\ngpus: 2\ngpu_mem: 20GiB\n"
            "workdir: /home/ana/proj\nenv: {WANDB_MODE: offline}\n" + fields
        ).encode(),
        "t.yaml",
    )
    record = Record(
        id="train-7",
        state=State.RUNNING,
        spec=spec.to_json(),
        attempt=2,
        gpus=[1, 3],
        gpu_mem_mib=20480,
        cpu_cores=[4, 5],
        mem_limit_mib=8192,
        host="box-a",
        claim=GOLDEN_CLAIM,
    )
    settings = {"container_runtime": "docker", "container_clients": CLIENTS, "allow_docker": True}
    rt = Runtime(Layout(Path("/shared/gpuq")), "box-a", "boot", Path("/dev/shm/gpuq"), 10, 180, {}, False, settings)
    monkeypatch.setattr(launch_module.os, "geteuid", lambda: 1001 if as_owner else 999)
    monkeypatch.setattr(launch_module.os, "getuid", lambda: 1001)  # a worker not root runs jobs as itself
    monkeypatch.setattr(launch_module.os, "getgid", lambda: 1001)
    monkeypatch.setattr(launch_module.os, "getgroups", lambda: [1001])
    monkeypatch.setattr(launch_module, "inherited_environment", lambda: {"PATH": "/usr/bin:/bin"})
    launch = launch_module.build_launch(rt, record, spec, None if as_owner else ANA)
    lines = [f"# {name}: argv, one argument per line (shell-quoted)"] + [shlex.quote(a) for a in launch.argv]
    lines += [
        f"# cwd {launch.cwd}; client runs as {launch.identity.name if launch.identity else 'the worker'}",
        "# client environment",
    ] + [f"{k}={v}" for k, v in sorted(launch.env.items())]
    if launch.wrapped is not None and launch.wrapped.stdin is not None:
        lines += ["# client stdin (its --env-file)", *launch.wrapped.stdin.splitlines()]
    return "\n".join(lines) + "\n"


def check_golden(folder: Path, name: str, text: str) -> None:
    """`text` is golden file command-NAME.txt in `folder`. GPUQ_UPDATE_GOLDEN=1 rewrites it;
    review the diff before committing it."""
    path = folder / f"command-{name}.txt"
    if os.environ.get("GPUQ_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} differs: GPUQ_UPDATE_GOLDEN=1 shows the new text in git diff"
