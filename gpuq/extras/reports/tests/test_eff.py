"""`gpuq eff`: the figures and hints from a record and its samples (pure), then through the
real worker with fake GPUs and the CLI (one job, a user's table, --json, bad names)."""

from __future__ import annotations

import json
import re

import pytest

from conftest import PY, REPO, wait_until
from gpuq.extras.reports.efficiency import efficiency, job_samples
from gpuq.model.record import Record
from gpuq.model.states import State

GIB = 1024


def record(**kw) -> Record:
    base = dict(
        id="j",
        state=State.DONE,
        spec={"gpu_mem_mib": 16 * GIB, "cpus": 2},
        user="ana",
        host="h",
        gpus=[0],
        gpu_mem_mib=16 * GIB,
        started_at=1000.0,
        ended_at=2000.0,
        cpu_cores=[0, 1],
        cpu_s=1900.0,
        peak_gpu_mem_mib=15 * GIB,
        mean_gpu_util_pct=20.0,
    )
    return Record(**{**base, **kw})


def line(t: float, util: float, jobs: list[str], idle: float = 0.0, host: str = "h", i: int = 0) -> dict:
    return {
        "t": t,
        "s": 100,
        "host": host,
        "gpus": [
            {"i": i, "util": util, "total": 32 * GIB, "held_s": 100, "idle_held_s": idle, "jobs": jobs}
            | ({"idle_by_job": {j: idle / len(jobs) for j in jobs}} if jobs else {})
        ],
    }


def kinds(r: Record, lines: list[dict]) -> list[str]:
    return [h.kind for h in efficiency(r, job_samples(lines, [r], 3000).get(r.id, []), 3000).hints]


def test_input_bound_needs_both_a_waiting_gpu_and_saturated_cpus():
    e = efficiency(record(), [], 3000)
    assert (e.cpu_eff_pct, e.busy_cores, e.run_s) == (95.0, 1.9, 1000.0)
    assert "input-bound" in [h.kind for h in e.hints]
    text = next(h.text for h in e.hints if h.kind == "input-bound")
    assert "20%" in text and "95%" in text and "data-loader workers" in text  # the numbers behind it
    assert "input-bound" not in kinds(record(cpu_s=600.0), [])  # CPUs at 30%: not the input
    assert "input-bound" not in kinds(record(mean_gpu_util_pct=80.0), [])  # the GPU is busy
    assert "input-bound" not in kinds(record(cpu_cores=[], spec={"gpu_mem_mib": 16 * GIB}), [])  # no cores given


def test_memory_hints_over_declared_near_the_limit_and_a_fraction_of_a_whole_gpu():
    assert "memory-bound" in kinds(record(), [])  # 15 of 16 GiB: show would suggest 17 GiB
    # D13: declared what `show` suggests for its peak (9 GiB + 10% -> 10 GiB): not memory-bound.
    right = record(peak_gpu_mem_mib=9 * GIB, spec={"gpu_mem_mib": 10 * GIB}, gpu_mem_mib=10 * GIB)
    assert "memory-bound" not in kinds(right, [])
    over = efficiency(record(peak_gpu_mem_mib=3 * GIB), [], 3000)
    hint = next(h for h in over.hints if h.kind == "over-declared")
    assert "gpu_mem: 4GiB" in hint.text and "3GiB" in hint.text  # show's rule: peak + 10%, whole GiB
    assert "memory-bound" not in [h.kind for h in over.hints]
    whole = record(spec={}, gpu_mem_mib=32 * GIB, peak_gpu_mem_mib=5 * GIB, cpu_cores=[])
    assert kinds(whole, [line(1500, 20, ["j"])]) == ["fits-fraction"]
    assert "fits-fraction" not in kinds(whole, [])  # the GPU's size unknown: no claim about a fraction
    assert "fits-fraction" not in kinds(record(spec={}, gpu_mem_mib=32 * GIB, mean_gpu_util_pct=90.0), [])


def test_idle_time_and_the_utilization_series_come_from_the_job_s_own_samples():
    r = record(mean_gpu_util_pct=None, cpu_cores=[], spec={"gpu_mem_mib": 16 * GIB})
    lines = [
        line(1100, 0, ["j", "other"], idle=100),  # shared: half of it is j's
        line(1200, 0, ["j"], idle=100),
        line(1300, 0, ["j"], idle=100),
        line(1400, 60, ["j"]),
        line(1400, 99, ["other"], i=1),  # another GPU's job
        line(1300, 99, ["j"], host="elsewhere"),  # the same id on another host: not this attempt
        line(900, 99, ["j"]),  # before it started
    ]
    e = efficiency(r, job_samples(lines, [r], 3000)["j"], 3000)
    assert e.idle_held_s == 250
    assert e.gpu_util_series == [(1100, 0.0), (1200, 0.0), (1300, 0.0), (1400, 60.0)]
    assert e.gpu_util_mean_pct == 15.0  # no mean in the record: from the samples
    assert "idle-held" in [h.kind for h in e.hints]  # 250 of 1000 GPU-seconds
    assert "idle-held" not in kinds(r, lines[3:])


def test_garbage_samples_do_not_crash_it():
    r = record()
    lines = [
        {"t": "x"},
        {"t": 1100, "s": 100, "gpus": "no"},
        {"t": 1100, "s": 100, "host": "h", "gpus": [None, {"i": "0"}]},
    ]
    lines.append(
        {"t": 1100, "s": 100, "host": "h", "gpus": [{"i": 0, "jobs": ["j"], "util": "hot", "idle_held_s": -5}]}
    )
    e = efficiency(r, job_samples(lines, [r], 3000).get("j", []), 3000)
    json.dumps(e.to_json(), allow_nan=False)
    assert e.idle_held_s == 0 and e.gpu_util_series == []


def test_a_job_that_ended_at_once_is_not_called_idle_and_a_job_over_its_gpu_mem_needs_more():
    """A sample line covers sample_every_s; a job of a fraction of it held idle at most its
    own time, and a minute at least before it is told it held its GPU idle."""
    instant = record(started_at=1000.0, ended_at=1000.1, mean_gpu_util_pct=0.0, cpu_s=0.0)
    e = efficiency(instant, job_samples([line(1050, 0, ["j"], idle=100)], [instant], 3000)["j"], 3000)
    assert e.idle_held_s == pytest.approx(0.1) and "idle-held" not in [h.kind for h in e.hints]
    over = record(peak_gpu_mem_mib=24 * GIB)  # 24 of the 16 GiB it declared
    hints = {h.kind: h.text for h in efficiency(over, [], 3000).hints}
    assert "over-gpu-mem" in hints and "memory-bound" not in hints and "gpu_mem: 27GiB" in hints["over-gpu-mem"]


def test_a_shared_gpu_s_utilization_is_said_to_be_the_gpu_s_and_a_job_that_never_ran_has_none():
    from gpuq.extras.reports.efficiency import detail_text

    r = record()  # ran 1000..2000
    samples = job_samples([line(1100, 70, ["j", "k", "m"]), line(1200, 70, ["j", "n"])], [r], 3000)["j"]
    # D14: a sample line names every job seen over its minute; only k overlapped j. m ended as
    # j started, and n's times are not known: neither is counted.
    e = efficiency(r, samples, 3000, {"k": (1050.0, 1300.0), "m": (900.0, 1000.0)})
    assert e.shared_with == 1 and "(the GPU's: shared with up to 1 other job)" in detail_text(e)
    assert efficiency(r, samples, 3000, {"m": (900.0, 1000.0)}).shared_with == 0
    both = efficiency(r, samples, 3000, {"k": (1050.0, 1300.0), "n": (1200.0, 5000.0)})
    assert both.shared_with == 2
    one_then_other = efficiency(r, samples, 3000, {"k": (1050.0, 1100.0), "n": (1200.0, 5000.0)})
    assert one_then_other.shared_with == 1  # never both at once
    never = record(state=State.CANCELLED, started_at=None, ended_at=1500.0, gpus=[], cpu_s=None)
    assert "never ran" in detail_text(efficiency(never, [], 3000))


def test_garbage_sample_lines_do_not_stop_eff_or_report(tmp_path):
    from gpuq.extras.reports.reportview import spark
    from gpuq.extras.reports.samples import read_samples
    from gpuq.spool.layout import Layout

    layout = Layout(tmp_path)
    layout.ensure()
    layout.samples.mkdir(exist_ok=True)
    deep = "[" * 100_000  # json gives up with RecursionError, not ValueError
    (layout.samples / "h-2026-12.jsonl").write_text(
        f'{{"t": "x"}}\n[1]\n{deep}\n{{"t": 1796000000, "s": 60}}\nnot json\n'
    )
    assert [line["t"] for line in read_samples(layout, 0.0)] == [1796000000]
    assert spark([-5.0, 50.0, None], 100.0) == "▁▄ "


# --- through the real worker and CLI ------------------------------------------------------


@pytest.mark.slow
def test_eff_through_the_worker(queue, tmp_path):
    queue.write_config(sample_every_s=1, alert_idle_util_pct=5)
    queue.start_worker("a", "2x32GiB")
    script = tmp_path / "busy.py"  # a data loader that keeps its one core busy
    script.write_text("import time\nt = time.time() + 5\nwhile time.time() < t:\n    pass\n")
    script.chmod(0o644)
    tmp_path.chmod(0o755)
    busy = f"{PY} {script}"
    queue.drop(
        "starved.yaml",
        f'command: "{PY} {REPO / "gpuq.py"} fake-use --mem 2GiB --util 10 -- {busy}"\n'
        "gpus: 1\ngpu_mem: 16GiB\ncpus: 1\n",
    )
    record = wait_until(lambda: queue.finished("starved"), timeout=90, what="starved to end")
    assert record["state"] == "done", record
    out = queue.gpuq("eff", "starved").stdout
    assert "over-declared" in out and "gpu_mem: 3GiB" in out, out
    # The fake GPU runs at 10% while the job holds it; the moments before the fake registers
    # (interpreter start-up, longer on a busy box) count as 0%.
    util = re.search(r"GPU util     mean (\d+)%", out)
    assert util and 6 <= int(util.group(1)) <= 10, out
    [figures] = json.loads(queue.gpuq("eff", "starved", "--json").stdout)
    assert figures["cpu_eff_pct"] > 0 and figures["gpu_util_series"], figures
    # The loop gets its whole core on a quiet box (input-bound); a busy CI box may give it less.
    saturated = figures["cpu_eff_pct"] >= 85
    assert ("input-bound" in out) == saturated == ("input-bound" in {h["kind"] for h in figures["hints"]}), out
    table = queue.gpuq("eff", "--user", record["user"]).stdout
    assert table.splitlines()[0].split()[:3] == ["ID", "USER", "STATE"] and "starved" in table, table
    # A running job: figures so far (its record has no started_at until it ends).
    queue.drop(
        "long.yaml", f'command: "{PY} {REPO / "gpuq.py"} fake-use --mem 2GiB --util 60 --seconds 60"\ngpu_mem: 4GiB\n'
    )
    wait_until(lambda: (queue.record("long") or {}).get("state") == "running", timeout=60, what="long running")
    wait_until(lambda: "GPU util     mean" in queue.gpuq("eff", "long").stdout, timeout=60, what="its samples")
    running = queue.gpuq("eff", "long").stdout
    assert "long (" in running and ": running" in running and "run time     -" not in running, running
    assert "long" in queue.gpuq("eff", "--user", record["user"]).stdout
    queue.gpuq("cancel", "long")
    missing = queue.gpuq("eff", "nosuchjob", check=False)
    assert missing.returncode == 1 and "no job or group 'nosuchjob'" in missing.stderr
    assert queue.gpuq("eff", "../x", check=False).returncode == 1
