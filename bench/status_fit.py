#!/usr/bin/env python3
"""A status that fits: 120 jobs and a 30-member array waiting on a drained box (nothing
starts), shown at 80 columns. Prints the lines and the widest line of `gpuq status`, of
`status --all`, the array's lines, and `gpuq top`'s screen at 80x24, with the time taken.

    python bench/status_fit.py
"""

from __future__ import annotations

import subprocess
import sys
import time

from _common import PY, REPO, clean_env, compile_code, make_root, remove_root


def main() -> None:
    compile_code()
    root = make_root("fit")
    env = {**clean_env(), "COLUMNS": "80"}
    gpuq = [PY, str(REPO / "gpuq.py"), "--root", str(root)]
    once = [PY, str(REPO / "worker.py"), "--root", str(root), "--host", "a", "--fake-gpus", "4x24GiB", "--once"]
    try:
        subprocess.run(once, env=env, check=True, capture_output=True)
        subprocess.run([*gpuq, "drain", "a", "--reason", "driver update"], env=env, check=True, capture_output=True)
        for i in range(60):
            (root / "jobs" / f"train-{i}.yaml").write_text(f"command: python train.py --seed {i} --data /shared/in\n")
        subprocess.run(
            [*gpuq, "submit", "--gpu-mem", "10GiB", "--id", "sweep", "--array", "0-29", "--", "python eval.py"],
            env=env,
            check=True,
            capture_output=True,
        )
        for i in range(60):
            (root / "jobs" / f"big-{i}.yaml").write_text(f"command: python big.py --seed {i}\ngpus: 2\n")
        subprocess.run(once, env=env, check=True, capture_output=True)
        for label, args in (("status", []), ("status --all", ["--all"])):
            t = time.perf_counter()
            out = subprocess.run([*gpuq, "status", *args], env=env, check=True, capture_output=True, text=True)
            took = time.perf_counter() - t
            lines = out.stdout.splitlines()
            array = [line for line in lines if "sweep_" in line]
            print(
                f"{label:<14} {len(lines):4d} lines, widest {max(map(len, lines))} columns, "
                f"the 30-member array on {len(array)} line(s), {took:.2f} s"
            )
        sys.path.insert(0, str(REPO))
        from gpuq.cli.common import read_config
        from gpuq.spool.layout import Layout
        from gpuq.views.render import status_text, top_screen
        from gpuq.views.status import status

        layout = Layout(root)
        screen = top_screen("gpuq top", status_text(status(layout, read_config(layout))), 80, 24)
        print(f"{'top at 80x24':<14} {len(screen):4d} lines, widest {max(map(len, screen))} columns")
    finally:
        remove_root(root, "a")


if __name__ == "__main__":
    main()
