#!/usr/bin/env python3
"""`gpuq report` on a 1,000-job run, and its HTML page looked at in headless Chromium.

Two stand-in boxes with four 24 GiB fake GPUs each run 1,000 jobs dropped into jobs/ in ten
waves: most use their GPU (fake utilization 20-95%), some hold memory idle, some fail, some
run past a time limit, some are opportunistic and yield to high-priority work. Then:
`gpuq report` as text, `--by gpu`, `--json`, and `--html`, which Chromium renders to a PNG
that is checked for the three charts (the heat map's viridis, the queue chart's red line, the
wait histogram's green bars). Needs matplotlib (the [report] extra) and `chromium`.

    python bench/report_html.py [--jobs 1000] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import time
from pathlib import Path

from _common import PY, REPO, clean_env, make_root, remove_root, start_worker, wait_for

HOSTS = ("box-a", "box-b")
FAKE_USE = f"{PY} {REPO / 'gpuq.py'} fake-use"


def job_spec(rng: random.Random, i: int) -> str:
    kind = rng.choices(["work", "idle", "fail", "timeout", "low", "high", "pair"], [66, 10, 8, 4, 6, 3, 3])[0]
    seconds = round(rng.uniform(0.3, 3.0), 1)
    mem = rng.choice([4, 6, 8, 12, 16, 20])
    util = rng.randint(20, 95)
    lines = {
        "work": [f"command: {FAKE_USE} --util {util} --seconds {seconds}", "gpus: 1", f"gpu_mem: {mem}GiB"],
        "idle": [f"command: {FAKE_USE} --util 0 --seconds {seconds}", "gpus: 1", f"gpu_mem: {mem}GiB"],
        "fail": [f"command: {FAKE_USE} --util {util} --seconds 0.5 && exit 1", "gpus: 1", "gpu_mem: 4GiB"],
        "timeout": [
            f"command: {FAKE_USE} --util {util} --seconds 30",
            "gpus: 1",
            "gpu_mem: 4GiB",
            "time_limit: 2s",
            "grace: 1s",
        ],
        "low": [
            f"command: {FAKE_USE} --util 30 --seconds 8",
            "gpus: 1",
            "gpu_mem: 12GiB",
            "priority: low",
            "grace: 1s",
        ],
        "high": [f"command: {FAKE_USE} --util 90 --seconds {seconds}", "gpus: 1", "gpu_mem: 23GiB", "priority: high"],
        "pair": [f"command: {FAKE_USE} --util {util} --seconds {seconds}", "gpus: 2", "gpu_mem: 10GiB"],
    }[kind]
    return "\n".join(lines) + "\n"


def drop(root: Path, name: str, text: str) -> None:
    tmp = root / "jobs" / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(root / "jobs" / f"{name}.yaml")


def colour_counts(png: Path) -> dict[str, int]:
    import numpy as np
    from PIL import Image

    rgb = np.asarray(Image.open(png).convert("RGB")).astype(int)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    near = lambda colour, by: (abs(r - colour[0]) < by) & (abs(g - colour[1]) < by) & (abs(b - colour[2]) < by)
    return {
        "pixels": int(r.size),
        "not white": int(((r < 245) | (g < 245) | (b < 245)).sum()),
        # the heat map's blues and teals (viridis between 10% and 60%)
        "viridis": int(((b > 100) & (b > r + 40) & (g > 40) & (r < 80)).sum()),
        "red": int(near((214, 39, 40), 40).sum()),  # tab:red, the queue's maximum
        "green": int(near((44, 160, 44), 25).sum()),
    }  # tab:green, the wait histogram


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--waves", type=int, default=10)
    p.add_argument("--out", default=".", help="where report.html and report.png go")
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs chromium (Debian: apt-get install chromium)")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    root = make_root("report", sample_every_s=2, grace_s=1, idle_after_s=1)
    rng = random.Random(6)
    started = time.time()
    workers = [start_worker(root, h, "4x24GiB") for h in HOSTS]
    try:
        for h in HOSTS:
            wait_for(root / "state" / "workers" / f"{h}.json")
        per_wave = args.jobs // args.waves
        for wave in range(args.waves):
            for i in range(per_wave):
                drop(root, f"w{wave}-{i:03d}", job_spec(rng, i))
            time.sleep(15)
        deadline = time.monotonic() + 900
        while any((root / "jobs").glob("*.yaml")) or any((root / "state" / "running").glob("*.json")):
            if time.monotonic() > deadline:
                raise SystemExit("the run did not finish in 15 minutes")
            time.sleep(1)
        time.sleep(3)  # the last sample lines
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait()
    ran_s = time.time() - started
    since = f"{int(ran_s) + 5}s"

    def gpuq(*a: str) -> str:
        return subprocess.run(
            [PY, str(REPO / "gpuq.py"), "--root", str(root), "report", "--since", since, *a],
            capture_output=True,
            text=True,
            check=True,
            env=clean_env(),
        ).stdout

    print(f"{args.jobs} jobs on {len(HOSTS)}x4 fake GPUs in {ran_s:.0f} s\n")
    print(gpuq())
    print()
    print(gpuq("--by", "gpu"))
    figures = json.loads(gpuq("--json"))
    page, png = out / "report.html", out / "report.png"
    t = time.perf_counter()
    gpuq("--html", str(page))
    html_s = time.perf_counter() - t
    t = time.perf_counter()
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,2200",
            f"--screenshot={png}",
            page.as_uri(),
        ],
        capture_output=True,
        check=True,
        timeout=120,
    )
    shot_s = time.perf_counter() - t
    counts = colour_counts(png)
    checks = {
        "page is not blank (>= 5% non-white)": counts["not white"] >= 0.05 * counts["pixels"],
        "utilization heat map drawn (viridis pixels)": counts["viridis"] >= 5000,
        "queue length chart drawn (red line)": counts["red"] >= 200,
        "wait histogram drawn (green bars)": counts["green"] >= 2000,
    }
    total = figures["total"]
    print(f"\nJSON total: {json.dumps(total)}")
    print(
        f"html {page.stat().st_size // 1024} KiB written in {html_s:.1f} s; Chromium screenshot {png} "
        f"in {shot_s:.1f} s; pixels {counts}"
    )
    for name, ok in checks.items():
        print(f"  {'ok ' if ok else 'BAD'} {name}")
    print(f"target (the charts render): {'met' if all(checks.values()) else 'NOT MET'}")
    remove_root(root, *HOSTS)
    if not all(checks.values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
