"""gpu_sharing: mps, the core's part (the daemons are the mps extra's: gpuq/extras/mps/tests).
The plan (pure): one user's MPS jobs per GPU, the reason said, MPS jobs packing; which jobs
are MPS clients; the spec field and the config key; a client's variables from its record,
and a spec's or a submitter's own CUDA_MPS_* never reaching a job."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_plan import GIB, gpu, host, starts

from gpuq import hooks
from gpuq.model.config import Config, ConfigError, validate
from gpuq.model.errors import SpecError
from gpuq.model.jobs import PendingJob, RunningJob
from gpuq.model.sharing import compute_pct, pinned_mem_limit, uses_mps
from gpuq.model.spec import JobSpec, validate_spec
from gpuq.sched.plan import plan

MPS = Config(gpu_mem_reserve_mib=0, max_jobs_per_gpu=4, cpu_slots=1, gpu_sharing="mps", spread=False)


def pending(job_id: str, user: str, mem_gib: float | None = 10, gpus: int = 1, low: bool = False) -> PendingJob:
    spec = JobSpec(
        command="x",
        gpus=gpus,
        gpu_mem_mib=None if mem_gib is None else int(mem_gib * GIB),
        priority_class="low" if low else "normal",
        preemptible=low,
    )
    return PendingJob(job_id, user, spec, 0.0)


def on_gpu(job_id: str, user: str, index: int = 0, mem_gib: float = 10, low: bool = False) -> RunningJob:
    return RunningJob(job_id, user, "a", (index,), int(mem_gib * GIB), preemptible=low, mps=True)


def test_mps_never_puts_two_users_on_one_gpu_and_says_why():
    result = plan([pending("b1", "bob")], [host("a", gpu(0))], [on_gpu("a1", "ana")], MPS, 0.0)
    assert starts(result) == {}
    assert "runs ana's jobs under MPS" in result.reasons["b1"] and "one user per GPU" in result.reasons["b1"]
    # ana's next job joins her own; with time-slicing bob's would have too
    assert starts(plan([pending("a2", "ana")], [host("a", gpu(0))], [on_gpu("a1", "ana")], MPS, 0.0)) == {
        "a2": ("a", (0,))
    }
    sliced = replace(MPS, gpu_sharing="time-slicing")
    assert starts(plan([pending("b1", "bob")], [host("a", gpu(0))], [on_gpu("a1", "ana")], sliced, 0.0)) == {
        "b1": ("a", (0,))
    }


def test_within_one_pass_the_first_user_to_land_on_a_gpu_keeps_it_for_mps():
    jobs = [pending("a1", "ana"), pending("b1", "bob"), pending("a2", "ana"), pending("b2", "bob")]
    result = plan(jobs, [host("a", gpu(0), gpu(1))], [], MPS, 0.0)
    by_gpu: dict[int, set[str]] = {}
    for s in result.starts:
        by_gpu.setdefault(s.gpus[0], set()).add(s.job_id[0])
    assert len(result.starts) == 4 and all(len(users) == 1 for users in by_gpu.values()), by_gpu


def test_an_ordinary_mps_job_makes_another_users_opportunistic_mps_job_yield():
    running = [on_gpu("low-a", "ana", low=True)]
    result = plan([pending("b1", "bob")], [host("a", gpu(0))], running, MPS, 0.0)
    assert result.preempts == {"low-a": "job b1 needs its GPU memory"} and "b1" in result.held


def test_opportunistic_mps_jobs_do_not_mix_users_either():
    hosts = [host("a", gpu(0))]
    result = plan([pending("lb", "bob", low=True)], hosts, [on_gpu("la", "ana", low=True)], replace(MPS), 0.0)
    assert starts(result) == {} and "runs ana's jobs under MPS" in result.reasons["lb"]


def test_jobs_not_under_mps_share_with_anyone():
    """Whole-GPU jobs never share; a two-GPU job with gpu_mem is time-sliced (an MPS client
    talks to one daemon, one GPU), so it may sit beside another user's MPS job."""
    result = plan([pending("b2", "bob", gpus=2)], [host("a", gpu(0), gpu(1))], [on_gpu("a1", "ana")], MPS, 0.0)
    assert starts(result) == {"b2": ("a", (0, 1))}


def test_which_jobs_are_mps_clients_and_their_share():
    one = JobSpec(command="x", gpus=1, gpu_mem_mib=20 * GIB)
    assert uses_mps(one, MPS) and not uses_mps(one, Config())
    assert not uses_mps(replace(one, gpu_mem_mib=None), MPS) and not uses_mps(replace(one, gpus=2), MPS)
    assert compute_pct(one, 80 * GIB) == 25 and compute_pct(replace(one, gpu_compute_pct=60), 80 * GIB) == 60
    assert compute_pct(replace(one, gpu_mem_mib=1), 80 * GIB) == 1
    assert pinned_mem_limit(20 * GIB) == "0=20480M"


def test_gpu_compute_field_and_gpu_sharing_key_are_checked():
    assert validate_spec({"command": "x", "gpu_mem": "8GiB", "gpu_compute": "40%"}, "f.yaml").gpu_compute_pct == 40
    assert validate_spec({"command": "x", "gpu_mem": "8GiB", "gpu_compute": 40}, "f.yaml").gpu_compute_pct == 40
    with pytest.raises(SpecError, match="gpu_compute.*percentage from 1 to 100"):
        validate_spec({"command": "x", "gpu_mem": "8GiB", "gpu_compute": "150%"}, "f.yaml")
    with pytest.raises(SpecError, match="gpu_compute.*no gpu_mem.*give gpu_mem"):
        validate_spec({"command": "x", "gpu_compute": "50%"}, "f.yaml")
    assert validate({"gpu_sharing": "mps"}, "config.yaml").gpu_sharing == "mps"
    with pytest.raises(ConfigError, match="gpu_sharing.*time-slicing.*mps"):
        validate({"gpu_sharing": "mig"}, "config.yaml")


def test_mps_jobs_pack_where_time_sliced_ones_spread():
    """Spreading spares time-sliced jobs each other's kernels; an MPS job runs on its compute
    share whether alone or not, so spreading would only use up empty GPUs."""
    jobs = [pending("a1", "ana", 4), pending("a2", "ana", 4)]
    hosts = [host("a", gpu(0), gpu(1), gpu(2), gpu(3))]
    spread_mps = replace(MPS, spread=True)
    assert {s.gpus for s in plan(jobs, hosts, [], spread_mps, 0.0).starts} == {(0,)}
    sliced = replace(spread_mps, gpu_sharing="time-slicing")
    assert len({s.gpus for s in plan(jobs, hosts, [], sliced, 0.0).starts}) == 2


def test_gpu_compute_takes_ascii_digits_only_and_one_gpu_jobs_only():
    for bad in ("²", "①", "٥٠", "１００", "50.5%", "+50"):
        with pytest.raises(SpecError, match="gpu_compute.*not a percentage"):
            validate_spec({"command": "x", "gpu_mem": "8GiB", "gpu_compute": bad}, "f.yaml")
    with pytest.raises(SpecError, match="gpu_compute.*one GPU.*gpus: 1"):
        validate_spec({"command": "x", "gpus": 2, "gpu_mem": "8GiB", "gpu_compute": "50%"}, "f.yaml")


@pytest.mark.slow
def test_submit_sets_gpu_compute_and_never_records_the_submitters_mps_variables(queue):
    env = {**queue.env(), "CUDA_MPS_PIPE_DIRECTORY": "/tmp/x-mps/0/pipe", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"}
    done = queue.gpuq(
        "--root",
        str(queue.root),
        "submit",
        "--gpu-mem",
        "4GiB",
        "--gpu-compute",
        "30%",
        "--id",
        "s",
        "--",
        "true",
        env=env,
    )
    text = (queue.root / "jobs" / "s.yaml").read_text()
    assert done.returncode == 0 and "gpu_compute: 30%" in text and "CUDA_MPS" not in text, text
    bad = queue.gpuq("--root", str(queue.root), "submit", "--gpu-compute", "30%", "--", "true", check=False)
    assert bad.returncode == 2 and "gpu_compute" in bad.stderr and "give gpu_mem" in bad.stderr, bad.stderr


def test_a_specs_own_mps_variables_never_reach_a_job(tmp_path):
    """Security review (Low): a non-MPS job whose spec names CUDA_MPS_PIPE_DIRECTORY would
    join another member's MPS daemon on its GPU. Only gpuq makes a job an MPS client."""
    from gpuq.model.record import Record
    from gpuq.model.states import State
    from gpuq.run.joblocal import Runtime
    from gpuq.run.launch import job_variables
    from gpuq.spool.layout import Layout

    text = "command: x\ngpus: 1\nenv: {CUDA_MPS_PIPE_DIRECTORY: /tmp/other/pipe, CUDA_MPS_LOG_DIRECTORY: /x, KEEP: 1}\n"
    spec = validate_spec(
        {"command": "x", "gpus": 1, "env": {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/other/pipe", "KEEP": "1"}}, "j.yaml"
    )
    record = Record(id="j", state=State.RUNNING, spec={}, spec_text=text, user="x", uid=4242, host="a", gpus=[0])
    rt = Runtime(Layout(tmp_path), "a", "boot", tmp_path / "local", 1.0, 10.0, {})
    env = job_variables(rt, record, spec)
    assert env["KEEP"] == "1" and not [k for k in env if k.startswith("CUDA_MPS_")], env
    mps = replace(record, mps_pipe="/run/gpuq/a-mps/0/pipe", gpu_uuids=["GPU-1"], gpu_mem_mib=4096)
    assert job_variables(rt, mps, spec)["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpuq/a-mps/0/pipe"


def test_without_an_extra_that_runs_mps_the_plan_is_handed_time_slicing(monkeypatch: pytest.MonkeyPatch):
    """The mps extra deleted: its worker runs every job time-sliced (and says gpu_sharing goes
    unused), so the plan, handed the config at the edge (hooks.sharing_of), keeps no GPU for one
    user's MPS jobs."""
    monkeypatch.setattr(hooks, "_registry", hooks.Registry())
    handed = hooks.sharing_of(MPS)
    assert handed == replace(MPS, gpu_sharing="time-slicing")
    result = plan([pending("b1", "bob")], [host("a", gpu(0))], [on_gpu("a1", "ana")], handed, 0.0)
    assert starts(result) == {"b1": ("a", (0,))}
    monkeypatch.setattr(hooks, "_registry", hooks.Registry(gpu_sharing=[hooks.GpuSharing("mps", "extras.mps:x")]))
    assert hooks.sharing_of(MPS) is MPS
