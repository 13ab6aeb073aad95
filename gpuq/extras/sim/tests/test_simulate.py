"""`gpuq simulate`: trace reading, the virtual clock, the policies, and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import PY, REPO
from gpuq.extras.sim.simreport import SIM_CONFIG, figures, run_policy
from gpuq.extras.sim.timing import PassTiming
from gpuq.extras.sim.trace import TraceError, is_marked_low, load_trace, mark_low, parse_cluster
from gpuq.host.wake import EXIT_WAKE_SCAN_GAP_S, JOBS_WATCH_GAP_S, WATCH_EVERY_S
from gpuq.model.windows import parse_window

HEADER = "job_id,submit_s,duration_s,gpus,gpu_mem_gib,gpu_util,user,priority\n"
LIMITS_HEADER = "job_id,submit_s,duration_s,gpus,gpu_mem_gib,gpu_util,user,priority,time_limit_s\n"


def trace(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(header + "".join(r + "\n" for r in rows))
    return path


def replay(tmp_path: Path, cluster: str, policy: str, *rows: str, header: str = HEADER) -> dict:
    c = parse_cluster(cluster)
    jobs = load_trace(trace(tmp_path, *rows, header=header), c)
    out = run_policy(policy, jobs, c, SIM_CONFIG)
    return {"waits": out.waits, "ends": out.ends, **figures(out, jobs)}


def test_trace_rows_become_specs_as_documented(tmp_path):
    jobs = load_trace(
        trace(tmp_path, "share,0,10,0.25,,,u1,", "whole,1,10,2,,,u1,", "mem,2,10,1,8,50,u2,low", "wide,3,10,16,,,u3,"),
        parse_cluster("2x8x32GiB"),
    )
    by_id = {j.id: j for j in jobs}
    assert by_id["share"].spec.gpus == 1 and by_id["share"].spec.gpu_mem_mib == 8 * 1024
    assert by_id["share"].util == 25.0
    assert by_id["whole"].spec.exclusive and by_id["whole"].spec.gpus == 2
    assert by_id["mem"].spec.gpu_mem_mib == 8 * 1024 and by_id["mem"].util == 50.0
    assert by_id["mem"].spec.priority_class == "low" and by_id["mem"].spec.preemptible
    assert by_id["wide"].capped and by_id["wide"].spec.gpus == 8


def test_bad_traces_and_clusters_name_the_place_and_the_fix(tmp_path):
    with pytest.raises(TraceError, match="column 'gpu_util' is missing. Fix: the header must name"):
        load_trace(
            trace(tmp_path, "a,0,1,1,,u", header="job_id,submit_s,duration_s,gpus,gpu_mem_gib,user\n"),
            parse_cluster("1x1x1GiB"),
        )
    with pytest.raises(TraceError, match=r"trace.csv:3: column 'duration_s': 'ten' is not a number"):
        load_trace(trace(tmp_path, "a,0,1,1,,,u,", "b,1,ten,1,,,u,"), parse_cluster("1x1x1GiB"))
    with pytest.raises(TraceError, match="write HOSTSxGPUSxMEMORY, e.g. 2x8x32GiB"):
        parse_cluster("2x8")


def test_time_limits_come_from_the_trace_or_are_rounded_up_to_what_people_type(tmp_path):
    jobs = load_trace(
        trace(
            tmp_path,
            "a,0,59,1,,,u,,",
            "b,0,3601,1,,,u,,",
            "c,0,90000,1,,,u,,",
            "d,0,50,1,,,u,,120",
            header=LIMITS_HEADER,
        ),
        parse_cluster("1x1x32GiB"),
    )
    limits = {j.id: (j.time_limit_s, j.spec.time_limit_s) for j in jobs}
    assert limits == {"a": (3600, 3600), "b": (7200, 7200), "c": (2 * 86400, 2 * 86400), "d": (120, 120)}
    with pytest.raises(TraceError, match="column 'time_limit_s'"):
        load_trace(trace(tmp_path, "a,0,59,1,,,u,,soon", header=LIMITS_HEADER), parse_cluster("1x1x1GiB"))


def test_a_trace_the_replay_cannot_trust_is_refused_with_its_line_and_fix(tmp_path):
    """A review's inputs: limits of nan, inf, 1e30 and 0; an id twice; a spreadsheet's UTF-8
    byte-order mark before the header; GPUs of no memory."""
    one = parse_cluster("1x1x32GiB")
    for limit, said in (
        ("nan", "not a finite number"),
        ("inf", "not a finite number"),
        ("1e30", "no time limit"),
        ("0", "no time limit"),
    ):
        with pytest.raises(TraceError, match=f"column 'time_limit_s': .*{said}.*Fix: "):
            load_trace(trace(tmp_path, f"a,0,59,1,,,u,,{limit}", header=LIMITS_HEADER), one)
    with pytest.raises(TraceError, match=r"trace.csv:3: column 'job_id': 'a' again \(line 2\)"):
        load_trace(trace(tmp_path, "a,0,10,1,,,u,", "a,1,10,1,,,u,"), one)
    bom = tmp_path / "bom.csv"
    bom.write_text("\ufeff" + HEADER + "a,0,10,1,,,u,\n", encoding="utf-8")
    assert [j.id for j in load_trace(bom, one)] == ["a"]
    with pytest.raises(TraceError, match="GPUs of 0 MiB hold no job"):
        parse_cluster("1x8x0GiB")


def test_a_mixed_cluster_names_its_boxes_in_order_and_caps_to_the_widest(tmp_path):
    cluster = parse_cluster("1x8x80GiB+2x4x24GiB")
    assert cluster.hosts == 3 and cluster.gpus == 16 and cluster.gpus_per_host == 8
    assert cluster.host_shapes() == [(8, 80 * 1024), (4, 24 * 1024), (4, 24 * 1024)]
    jobs = load_trace(trace(tmp_path, "half,0,10,0.5,,,u,", "wide,0,10,16,,,u,"), cluster)
    by_id = {j.id: j for j in jobs}
    assert by_id["half"].spec.gpu_mem_mib == 12 * 1024  # half of the smallest GPU: it fits on any
    assert by_id["wide"].capped and by_id["wide"].spec.gpus == 8
    out = replay(tmp_path, "1x8x80GiB+2x4x24GiB", "gpuq", "wide,0,10,8,,,u,", "four,0,10,4,,,u,", "four2,0,10,4,,,u,")
    assert out["waits"] == {"wide": 0, "four": 0, "four2": 0}  # 16 GPUs: all three at once
    with pytest.raises(TraceError, match="1x8x80GiB\\+2x4x24GiB"):
        parse_cluster("1x8x80GiB+two")


def test_fifo_exclusive_blocks_behind_its_head_and_gpuq_packs_around_it(tmp_path):
    rows = ("long,0,100,1,,,u,", "pair,1,10,2,,,u,", "quarter,2,10,0.25,,,u,")
    fifo = replay(tmp_path, "1x2x32GiB", "fifo-exclusive", *rows)
    assert fifo["waits"] == {"long": 0, "pair": 99, "quarter": 108}  # behind pair, then a whole GPU
    packed = replay(tmp_path, "1x2x32GiB", "pack-bestfit", *rows)
    assert packed["waits"] == {"long": 0, "pair": 99, "quarter": 0}
    # Limits rounded up to an hour: pair is reserved both GPUs from long's limit (1 h), and
    # quarter's own hour would run past that, so it waits behind pair, as under EASY backfill.
    gpuq = replay(tmp_path, "1x2x32GiB", "gpuq", *rows)
    assert gpuq["waits"] == {"long": 0, "pair": 99, "quarter": 108} and gpuq["jobs"] == 3
    easy = replay(tmp_path, "1x2x32GiB", "slurm-easy", *rows)
    assert easy["waits"] == {"long": 0, "pair": 99, "quarter": 108}
    # Declared limits as long as the jobs: quarter ends before pair is due, and packs around it.
    declared = ("long,0,100,1,,,u,,100", "pair,1,10,2,,,u,,10", "quarter,2,10,0.25,,,u,,10")
    gpuq = replay(tmp_path, "1x2x32GiB", "gpuq", *declared, header=LIMITS_HEADER)
    assert gpuq["waits"] == {"long": 0, "pair": 99, "quarter": 0}
    easy = replay(tmp_path, "1x2x32GiB", "slurm-easy", *declared, header=LIMITS_HEADER)
    assert easy["waits"] == {"long": 0, "pair": 99, "quarter": 0}  # on the other GPU, whole


def test_a_colocation_penalty_slows_jobs_that_share_a_gpu_and_no_other(tmp_path):
    rows = ("a,0,100,1,10,50,u,", "b,0,100,1,10,50,u,", "c,0,100,1,,,u,")  # a and b share; c alone
    jobs = load_trace(trace(tmp_path, *rows), parse_cluster("1x2x32GiB"))
    plain = run_policy("pack-bestfit", jobs, parse_cluster("1x2x32GiB"), SIM_CONFIG)
    assert plain.ends == {"a": 100, "b": 100, "c": 100}  # 50 + 50: no slower than alone
    slowed = run_policy("pack-bestfit", jobs, parse_cluster("1x2x32GiB"), SIM_CONFIG, colocation_penalty=0.15)
    assert slowed.ends["a"] == pytest.approx(100 / 0.85) and slowed.ends["c"] == 100


def test_a_job_is_stopped_at_its_time_limit_as_its_supervisor_stops_it(tmp_path):
    # a and b share a GPU and each runs 15% slower: a's limit (110 s) comes before its work is
    # done (100 / 0.85 s); b's (120 s) does not, and b runs alone at full speed once a is
    # stopped. c's trace limit is below its own duration.
    rows = ("a,0,100,1,10,50,u,,110", "b,0,100,1,10,50,u,,120", "c,0,100,1,,,u,,60")
    jobs = load_trace(trace(tmp_path, *rows, header=LIMITS_HEADER), parse_cluster("1x2x32GiB"))
    out = run_policy("pack-bestfit", jobs, parse_cluster("1x2x32GiB"), SIM_CONFIG, colocation_penalty=0.15)
    assert out.ends == {"a": 110, "b": pytest.approx(110 + (100 - 110 * 0.85)), "c": 60}
    assert figures(out, jobs)["timeouts"] == out.timeouts == 2
    plain = run_policy("pack-bestfit", jobs, parse_cluster("1x2x32GiB"), SIM_CONFIG)
    assert plain.ends == {"a": 100, "b": 100, "c": 60} and plain.timeouts == 1


def test_co_located_jobs_slow_each_other_by_their_utilization(tmp_path):
    out = replay(tmp_path, "1x1x32GiB", "pack-bestfit", "a,0,100,1,10,100,u,", "b,0,100,1,10,100,u,")
    assert out["ends"] == {"a": 200, "b": 200}  # each at 100 / (100 + 100)
    out = replay(tmp_path, "1x1x32GiB", "pack-bestfit", "a,0,100,1,10,100,u,", "b,50,10,1,10,100,u,")
    assert out["ends"]["b"] == 70 and out["ends"]["a"] == 110  # a ran 10 s at half speed


def test_a_low_job_yields_after_the_grace_and_restarts_from_the_beginning(tmp_path):
    out = replay(tmp_path, "1x1x32GiB", "gpuq", "lo,0,100,1,20,,u,low", "hi,10,5,1,20,,u,normal")
    grace = SIM_CONFIG.grace_s
    assert out["preemptions"] == 1
    assert out["waits"]["hi"] == grace and out["ends"]["hi"] == 10 + grace + 5
    assert out["ends"]["lo"] == 10 + grace + 5 + 100  # back in when hi ended, from scratch
    assert out["wait_mean_by_priority"] == {"low": 10 + grace + 5, "normal": grace}


def test_a_low_job_on_the_heads_reserved_gpu_yields_in_time_for_the_head(tmp_path):
    """As a worker plans (Plan.recheck_at): lo, on the GPU reserved for pair, is told to yield
    a grace before occ's limit, not when occ has ended; pair starts as occ ends."""
    rows = ["occ,0,100,1,,,a,normal,100", "lo,1,1000,1,,,c,low,86400", "pair,5,10,2,,,b,normal,3600"]
    out = replay(tmp_path, "1x2x32GiB", "gpuq", *rows, header=LIMITS_HEADER)
    assert out["waits"]["pair"] == 95 and out["preemptions"] == 1


def test_the_pass_timing_is_the_workers_wake_rules():
    timing = PassTiming(poll_s=1.0)
    assert timing.reads_change(-math.inf, 7.0) == 7.0  # no pass yet: the first one reads it
    assert timing.reads_change(10.0, 10.1) == 10.0 + JOBS_WATCH_GAP_S  # jobs/ waits out the gap
    assert timing.reads_change(10.0, 10.62) == pytest.approx(10.0 + 13 * WATCH_EVERY_S)  # the watch's next look
    assert timing.reads_change(10.0, 13.3) == 13.0 + JOBS_WATCH_GAP_S  # idle, it passed at 11, 12 and 13
    assert timing.reads_change(10.0, 9.0) == 10.0 + JOBS_WATCH_GAP_S  # that pass (a job's end) did not read jobs/
    assert PassTiming.end_reads_jobs(10.0, 10.01 + EXIT_WAKE_SCAN_GAP_S)
    assert not PassTiming.end_reads_jobs(10.0, 10.1)


def test_a_dropped_job_starts_when_a_worker_pass_reads_it(tmp_path):
    rows = ("a,0,10,1,,,u,", "b,0.2,100,1,,,u,", "c,10.1,100,1,,,u,", "d,13.33,100,1,,,u,")
    waits = replay(tmp_path, "1x4x32GiB", "gpuq", *rows)["waits"]
    assert waits["a"] == 0  # the first pass reads it
    assert waits["b"] == pytest.approx(JOBS_WATCH_GAP_S - 0.2)  # a's pass began at 0
    assert waits["c"] == pytest.approx(JOBS_WATCH_GAP_S - 0.1)  # a's end woke the box at 10
    assert waits["d"] == pytest.approx(13.35 - 13.33)  # c's pass at 10.5, then polls at 11.5, 12.5; the watch at 13.35


def test_the_pass_timing_with_a_short_poll_and_in_float_time():
    assert PassTiming(poll_s=0.1).reads_change(0.0, 0.05) == pytest.approx(0.1)  # the poll comes before the watch
    assert PassTiming(poll_s=0.1).reads_change(0.1, 0.3) == pytest.approx(0.3)  # a poll pass begins as it is dropped
    timing = PassTiming(poll_s=1.0)
    assert all(
        timing.reads_change(last / 100, drop / 100) >= drop / 100
        for last in range(0, 900, 7)
        for drop in range(900, 1600, 3)
    )


def test_every_box_reads_what_it_has_not_read_and_claims_wake_the_others(tmp_path):
    # a's end frees a GPU at 10.0 for c, dropped at 9.95. Whichever box has not read c by then
    # reads it at its next look (it waited for some later event: 45 s, in a review's replay).
    # (Each declares its own duration as its limit: c ends before d, reserved from 50, is due.)
    stale = ("a,0,10,1,,,u,,10", "a2,0,50,1,,,u,,50", "b,0,100,2,,,u,,100", "d,9.9,5,2,,,u,,5", "c,9.95,5,1,,,u,,5")
    waits = replay(tmp_path, "2x2x32GiB", "gpuq", *stale, header=LIMITS_HEADER)["waits"]
    assert waits["c"] <= JOBS_WATCH_GAP_S + WATCH_EVERY_S
    # h0's claim of a at 0 wakes h1's watch half a second later: h1 then polls at 1.5, 2.5 ...
    # and looks at jobs/ from 1.0 on, so b, dropped at 1.3, is read at once (h0 would wait to 1.5).
    assert replay(tmp_path, "2x1x32GiB", "gpuq", "a,0,100,1,,,u,", "b,1.3,100,1,,,u,")["waits"]["b"] == pytest.approx(0)


def test_a_replay_does_not_depend_on_where_the_trace_clock_starts(tmp_path):
    rows = ["j0,0.878,15.09,0.5,,,u1,low", "j1,2.529,15.74,1,,,u1,low", "j2,4.609,3.15,2,,,u2,"]
    rows += ["j3,5.041,2.94,1,,,u1,high", "j4,6.223,8.75,1,,,u4,"]
    near = replay(tmp_path, "2x2x32GiB", "gpuq", *rows)["waits"]
    shifted = [",".join([r.split(",")[0], str(float(r.split(",")[1]) + 1.6e9), *r.split(",")[2:]]) for r in rows]
    far = replay(tmp_path, "2x2x32GiB", "gpuq", *shifted)["waits"]  # epoch seconds: coarser floats
    assert far == pytest.approx(near, abs=1e-5)


def test_a_box_plans_again_at_its_next_poll_after_its_own_starts(tmp_path):
    # j11's start at 5.5 changes the queue's order (fair share): a fresh plan starts j3 at
    # once. The worker plans again at its next poll (6.5 s), with no news.
    rows = ("j2,0.0,30,0.1,4,,u,low", "j0,0.05,10,4,16,,w,high", "j3,0.55,0,2,,,u,high", "j11,5.45,10,1,16,,w,high")
    assert replay(tmp_path, "1x4x32GiB", "gpuq", *rows)["waits"]["j3"] == pytest.approx(6.5 - 0.55)


def test_an_idle_window_opening_lets_a_plan_that_found_nothing_run_again(tmp_path):
    opens = time.localtime(3600)  # the window opens at the trace's 3600 s, in local time
    window = f"{opens.tm_hour:02d}:{opens.tm_min:02d}-{(opens.tm_hour + 1) % 24:02d}:{opens.tm_min:02d}"
    jobs = load_trace(trace(tmp_path, "j5,3598.53,0.3,1,,,w,", "j7,3599.93,1,1,,,v,low"), parse_cluster("2x1x32GiB"))
    out = run_policy(
        "gpuq", jobs, parse_cluster("2x1x32GiB"), replace(SIM_CONFIG, idle_windows=(parse_window(window),))
    )
    assert "j7" in out.ends and out.waits["j7"] < 1.0  # read at 3600.33, in the window


def test_mark_low_is_a_stable_rule_and_without_low_drops_the_same_jobs(tmp_path):
    rows = [f"j{i},{i},10,1,,,u," for i in range(300)]
    jobs = load_trace(trace(tmp_path, *rows), parse_cluster("1x8x32GiB"))
    marked = {j.id for j in mark_low(jobs, 0.33) if j.spec.priority_class == "low"}
    assert marked == {j.id for j in jobs if is_marked_low(j.id, 0.33)} and 70 < len(marked) < 130
    assert {j.id for j in mark_low(jobs, 0.33, drop=True)} == {j.id for j in jobs} - marked


@pytest.mark.slow
def test_the_cli_prints_the_table_and_the_documented_json(tmp_path):
    path = trace(tmp_path, "a,0,100,1,,,u,", "b,1,10,0.5,,,u,", "c,2,10,8,,,u,")
    cmd = [PY, str(REPO / "gpuq.py"), "simulate", str(path), "--cluster", "1x4x32GiB"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "gpuq/fifo-exclusive" in text and "wait max, 4-GPU jobs" in text and "jobs capped to one host" in text
    doc = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True).stdout)
    keys = {
        "wait_mean_s",
        "wait_p50_s",
        "wait_p95_s",
        "wait_p99_s",
        "wait_max_s",
        "wait_max_by_gpus",
        "wait_mean_by_priority",
        "slowdown_mean",
        "makespan_s",
        "occupancy",
        "free_while_waiting",
        "preemptions",
        "timeouts",
        "peak_queue",
        "jobs",
        "capped",
    }
    assert set(doc["policies"]) == {"gpuq", "slurm-easy", "pack-bestfit", "fifo-exclusive"}
    assert "gpuq/slurm-easy" in text
    assert all(keys <= set(p) for p in doc["policies"].values())
    assert doc["policies"]["gpuq"]["capped"] == 1 and doc["policies"]["gpuq"]["jobs"] == 3
    bad = subprocess.run(cmd[:4] + ["--cluster", "lots"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--cluster 'lots': write HOSTSxGPUSxMEMORY" in bad.stderr
    # Mixed boxes ('+' or ','), and only the first N jobs.
    mixed = cmd[:4] + ["--cluster", "1x8x80GiB,2x4x24GiB", "--jobs", "2", "--json"]
    doc = json.loads(subprocess.run(mixed, capture_output=True, text=True, check=True).stdout)
    assert doc["cluster"] == "1x8x80GiB+2x4x24GiB" and doc["jobs"] == 2
    assert doc["policies"]["gpuq"]["capped"] == 0  # c's 8 GPUs fit the big box; --jobs 2 leaves it out anyway
    # What a review fed it: each a one-line error with the fix, never a traceback.
    for extra, said in (
        (["--policy", "slurm"], "invalid choice: 'slurm'"),
        (["--mark-low", "1", "--without-low"], "leaves no job to replay"),
        (["--stretch", "0"], "--stretch 0: write a factor above 0"),
        (["--mark-low", "2"], "--mark-low 2: write a fraction from 0 to 1"),
        (["--without-low"], "give --mark-low too"),
        (["--colocation-penalty", "1"], "--colocation-penalty 1: write a fraction"),
    ):
        bad = subprocess.run(cmd + extra, capture_output=True, text=True)
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, (extra, bad.stderr)


@pytest.mark.slow
def test_the_cli_options_since_stretch_and_set_reach_the_replay(tmp_path):
    path = trace(tmp_path, "old,0,10,1,,,u,", "a,100,50,1,,,u,", "b,101,50,1,,,u,")
    base = [PY, str(REPO / "gpuq.py"), "simulate", str(path), "--cluster", "1x1x32GiB", "--policy", "gpuq", "--json"]
    run = lambda *extra: json.loads(
        subprocess.run(
            base + list(extra),
            capture_output=True,
            text=True,  # noqa: E731
            check=True,
        ).stdout
    )
    assert run("--since", "100")["jobs"] == 2
    assert run("--since", "100", "--stretch", "100")["policies"]["gpuq"]["wait_max_s"] == 0  # b now comes at 200
    assert run("--since", "100")["policies"]["gpuq"]["wait_max_s"] == 49
    bad = subprocess.run(base + ["--set", "reserve_after_s=-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "key 'reserve_after_s'" in bad.stderr


@pytest.mark.slow
def test_the_mark_rules_mark_by_another_hash_or_only_small_jobs(tmp_path):
    rows = [f"j{i},{i},10,{1 if i % 2 else 4},,,u," for i in range(200)]
    path = trace(tmp_path, *rows)
    base = [PY, str(REPO / "gpuq.py"), "simulate", str(path), "--cluster", "2x8x32GiB", "--policy", "gpuq", "--json"]
    low = {}
    for rule in ("sha1", "md5", "small"):
        doc = json.loads(
            subprocess.run(
                base + ["--mark-low", "0.5", "--mark-rule", rule, "--without-low"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        low[rule] = 200 - doc["jobs"]
    jobs = load_trace(path, parse_cluster("2x8x32GiB"))
    assert low["small"] == sum(1 for j in jobs if j.spec.gpus == 1 and is_marked_low(j.id, 0.5))
    assert low["md5"] == sum(1 for j in jobs if is_marked_low(j.id, 0.5, "md5")) != low["sha1"]
    with_low = json.loads(
        subprocess.run(
            base + ["--mark-low", "0.5", "--mark-rule", "small"], capture_output=True, text=True, check=True
        ).stdout
    )["policies"]["gpuq"]
    assert with_low["low_jobs_unfinished"] == 0 and set(with_low["wait_max_by_priority_gpus"]["low"]) == {"1"}


def test_under_mps_jobs_that_share_a_gpu_run_side_by_side_and_users_keep_apart(tmp_path):
    """Two jobs of half a GPU each whose kernels keep it busy (util 100): time-sliced each
    runs at half speed; under MPS each runs on its half of the SMs at full speed. A second
    user's MPS job waits for a GPU of its own instead of joining the first user's."""
    rows = ("a,0,100,1,16,100,ana,", "b,0,100,1,16,100,ana,")
    sliced = run_policy(
        "gpuq", load_trace(trace(tmp_path, *rows), parse_cluster("1x1x32GiB")), parse_cluster("1x1x32GiB"), SIM_CONFIG
    )
    assert sliced.ends == {"a": 200, "b": 200}
    mps_config = replace(SIM_CONFIG, gpu_sharing="mps")
    cluster = parse_cluster("1x1x32GiB")
    together = run_policy("gpuq", load_trace(trace(tmp_path, *rows), cluster), cluster, mps_config)
    assert together.ends == {"a": 100, "b": 100} and together.waits == {"a": 0, "b": 0}
    apart = run_policy(
        "gpuq",
        load_trace(trace(tmp_path, "a,0,100,1,16,100,ana,", "b,0,100,1,16,100,bob,"), cluster),
        cluster,
        mps_config,
    )
    assert apart.waits == {"a": 0, "b": 100} and apart.ends == {"a": 100, "b": 200}
