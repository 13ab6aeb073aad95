"""Retry after out-of-memory through the real worker on fake GPUs: a job whose log ends with
CUDA's out-of-memory error runs again at its place with more gpu_mem (or the whole GPU), as
many times as retry_on_oom says and no more; a job that fails otherwise never runs again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PY, REPO, wait_until

pytestmark = pytest.mark.slow  # every test here starts processes

FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 23.65 GiB of which 1.20 GiB is free."
)


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _runs(tmp_path: Path) -> list[str]:
    path = tmp_path / "runs"
    return path.read_text().split() if path.exists() else []


def _peak_seen(queue, job_id: str, mib: int) -> bool:
    for path in queue.local_base.glob(f"*/jobs/{job_id}.usage"):
        try:
            if (json.loads(path.read_text()).get("peak_gpu_mem_mib") or 0) >= mib:
                return True
        except (OSError, ValueError):
            pass
    return False


def test_a_job_out_of_gpu_memory_runs_again_at_its_place_with_more_memory(queue, tmp_path):
    """It held 9GiB and tried to allocate 2GiB more: the next attempt asks (9 + 2) x 1.25,
    14GiB; the second run succeeds, and show, the log and the spec say why."""
    go = tmp_path / "go"
    # The first run holds 9GiB of fake GPU memory until the test has seen the worker sample it,
    # then fails as PyTorch does; the second run writes what it was given and succeeds.
    script = _script(
        tmp_path,
        "train.sh",
        f'echo "run $GPUQ_ATTEMPT" >> {tmp_path}/runs\n'
        f'if [ "$GPUQ_ATTEMPT" = 1 ]; then\n'
        f"  {FAKE_USE} --mem 9GiB --util 50 -- sh -c 'while [ ! -e {go} ]; do sleep 0.1; done'\n"
        f'  echo "{TORCH_OOM}" >&2; exit 1\n'
        f"fi\necho trained\n",
    )
    queue.start_worker("a", "1x24GiB")
    queue.drop("train.yaml", f"command: [{script}]\ngpus: 1\ngpu_mem: 8GiB\n")
    wait_until(lambda: _peak_seen(queue, "train", 9 * 1024), timeout=60, what="the job's 9GiB sampled")
    # Behind it in the queue, a job that cannot share the GPU with its next attempt (14 + 20 > 24).
    queue.drop("later.yaml", 'command: "true"\ngpus: 1\ngpu_mem: 20GiB\n')
    wait_until(lambda: "later" in {p["id"] for p in queue.status()["pending"]}, what="later to wait")
    go.touch()
    done = wait_until(lambda: queue.finished("train"), timeout=90, what="the retried job to end")
    later = wait_until(lambda: queue.finished("later"), timeout=60, what="the job behind it to end")
    assert later["started_at"] >= done["ended_at"]  # the retry kept its place ahead of it
    assert done["state"] == "done" and done["attempt"] == 2, done
    assert done["spec"]["gpu_mem_mib"] == 14 * 1024 and done["failure_retries"] == 1
    assert _runs(tmp_path) == ["run", "1", "run", "2"]
    why = "out of GPU memory (PyTorch); gpu_mem 8GiB -> 14GiB (retry_on_oom: 1 of 1)"
    assert why in queue.log("train")
    assert why in queue.gpuq("show", "train").stdout
    assert done["spec_text"].startswith(f"# {why}; requeued as attempt 2\n")
    requeues = [e for e in queue.events() if e.get("job") == "train" and e.get("to") == "pending"]
    assert [e["reason"] for e in requeues][-1] == f"{why}; requeued as attempt 2"


def test_out_of_memory_again_on_the_last_try_ends_it_as_failed(queue, tmp_path):
    script = _script(
        tmp_path, "oom.sh", f'echo "run $GPUQ_ATTEMPT" >> {tmp_path}/runs\necho "{TORCH_OOM}" >&2\nexit 1\n'
    )
    queue.start_worker("a", "1x24GiB")
    queue.drop("oom.yaml", f"command: [{script}]\ngpus: 1\ngpu_mem: 8GiB\n")
    failed = wait_until(lambda: queue.finished("oom"), timeout=90, what="the job to end")
    # Nothing was sampled (it failed at once): 8GiB declared + 2GiB tried, x 1.25, is 13GiB.
    assert failed["state"] == "failed" and failed["attempt"] == 2, failed
    assert failed["spec"]["gpu_mem_mib"] == 13 * 1024
    assert _runs(tmp_path) == ["run", "1", "run", "2"]


def test_near_the_whole_gpu_the_next_attempt_takes_it_whole(queue, tmp_path):
    script = _script(tmp_path, "big.sh", f'[ "$GPUQ_ATTEMPT" = 1 ] && {{ echo "{TORCH_OOM}" >&2; exit 1; }}\necho ok\n')
    queue.start_worker("a", "1x24GiB")
    queue.drop("big.yaml", f"command: [{script}]\ngpus: 1\ngpu_mem: 18GiB\ngpu_compute: 50%\n")
    done = wait_until(lambda: queue.finished("big"), timeout=90, what="the job to end")
    assert done["state"] == "done" and done["attempt"] == 2, done
    assert done["spec"]["gpu_mem_mib"] is None and done["spec"]["gpu_compute_pct"] is None
    assert "gpu_mem 18GiB -> the whole GPU" in queue.log("big")


@pytest.mark.parametrize(
    ("spec", "tail"),
    [
        ("", "FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'"),  # another failure
        ("retry_on_oom: 0\n", TORCH_OOM),  # out of memory, but asked never to run twice
        ("", "MemoryError"),  # the host's memory, not the GPU's
    ],
)
def test_a_job_is_not_run_again_unless_out_of_gpu_memory_with_retries_left(queue, tmp_path, spec, tail):
    script = _script(tmp_path, "fail.sh", f'echo "run $GPUQ_ATTEMPT" >> {tmp_path}/runs\necho "{tail}" >&2\nexit 1\n')
    queue.start_worker("a", "1x24GiB")
    queue.drop("fail.yaml", f"command: [{script}]\ngpus: 1\ngpu_mem: 8GiB\n{spec}")
    failed = wait_until(lambda: queue.finished("fail"), timeout=60, what="the job to end")
    assert failed["state"] == "failed" and failed["attempt"] == 1
    assert _runs(tmp_path) == ["run", "1"]
    assert "out of GPU memory" not in queue.log("fail")


def test_retry_on_oom_from_submit_and_bad_values_named(queue, tmp_path):
    script = _script(
        tmp_path, "two.sh", f'[ "$GPUQ_ATTEMPT" -lt 3 ] && {{ echo "{TORCH_OOM}" >&2; exit 1; }}\necho ok\n'
    )
    queue.write_config(retry_on_oom=0)  # the team's default: never; the job asks for two
    queue.start_worker("a", "1x80GiB")
    job = queue.gpuq(
        "submit", "-J", "two", "--gpu-mem", "4GiB", "--retry-on-oom", "2", "--", str(script)
    ).stdout.strip()
    done = wait_until(lambda: queue.finished(job), timeout=120, what="the job to end")
    assert done["state"] == "done" and done["attempt"] == 3, done
    assert "retry_on_oom: 2 of 2" in queue.log(job)
    shown = queue.gpuq("show", job).stdout
    assert "retries:          2" in shown and "preemptions" not in shown
    bad = queue.gpuq("submit", "--retry-on-oom", "eleven", "--", "true", check=False)
    assert bad.returncode != 0 and "--retry-on-oom 'eleven'" in bad.stderr
    queue.drop("bad.yaml", 'command: "true"\nretry_on_oom: 11\n')
    refused = wait_until(lambda: queue.refusals("bad"), timeout=30, what="the refusal")
    assert "retry_on_oom" in refused and "0 to 10" in refused


def test_an_ordinary_failure_after_an_out_of_memory_is_not_retried(queue, tmp_path):
    """The log holds every attempt: the second fails otherwise, and the first's error, still in
    the log's tail, does not make it out of memory."""
    script = _script(
        tmp_path,
        "then.sh",
        f'echo "run $GPUQ_ATTEMPT" >> {tmp_path}/runs\n'
        f'[ "$GPUQ_ATTEMPT" = 1 ] && {{ echo "{TORCH_OOM}" >&2; exit 1; }}\necho "ordinary failure" >&2; exit 3\n',
    )
    queue.start_worker("a", "1x24GiB")
    queue.drop("then.yaml", f"command: [{script}]\ngpus: 1\ngpu_mem: 4GiB\nretry_on_oom: 3\n")
    failed = wait_until(lambda: queue.finished("then"), timeout=90, what="the job to end")
    assert (failed["state"], failed["attempt"], failed["exit_code"]) == ("failed", 2, 3)
    assert _runs(tmp_path) == ["run", "1", "run", "2"]
