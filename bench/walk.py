"""How much of gpuq one job walks through: one 1-GPU job submitted, run on a fake GPU by the
real worker.py, and shown by `gpuq status`, with every Python process of it (CLI, worker,
spawner, supervisor, and root's starter and keeper where the worker runs as root) under
coverage. Prints the gpuq modules loaded, the functions entered and the lines run, of the
core's and the extras', and (--list) which modules the job touched, with the functions it
entered in each.

    pip install coverage && python bench/walk.py [--list]

A newcomer who follows one job follows these modules: fewer is a queue easier to hold in
one's head (docs/design.md, "Where to start reading").
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _common import PY, REPO, make_root, remove_root

SITECUSTOMIZE = "import coverage\ncoverage.process_startup()\n"


def _functions(path: Path) -> list[tuple[int, int]]:
    """(first body line, last line) of every function in a module."""
    tree = ast.parse(path.read_text())
    return [
        (node.body[0].lineno, node.end_lineno or node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _run_one_job(root: Path, env: dict[str, str]) -> None:
    host = "walk"
    gpuq = [PY, str(REPO / "gpuq.py"), "--root", str(root)]
    worker = [PY, str(REPO / "worker.py"), "--root", str(root), "--host", host, "--fake-gpus", "1x24GiB"]
    try:
        subprocess.run(
            [*gpuq, "submit", "--id", "walk", "--gpus", "1", "--gpu-mem", "1GiB", "--", "true"], env=env, check=True
        )
        subprocess.run([*worker, "--exit-when-idle", "--foreground"], env=env, check=True, timeout=300)
        subprocess.run([*gpuq, "wait", "--timeout", "120", "walk"], env=env, check=True)
        subprocess.run([*gpuq, "status"], env=env, check=True, stdout=subprocess.DEVNULL)
        _wait_for_the_last_process_of(root)  # each writes its coverage as it exits
    finally:
        remove_root(root, host)


def _wait_for_the_last_process_of(root: Path, bound_s: float = 60) -> None:
    deadline = time.monotonic() + bound_s
    while any(str(root) in " ".join(p.info["cmdline"] or ()) for p in psutil.process_iter(["cmdline"])):
        if time.monotonic() > deadline:
            raise SystemExit(f"processes of {root} still run after {bound_s:.0f} s")
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--list", action="store_true", help="list the modules the job touched, each with the functions it entered"
    )
    args = parser.parse_args()
    try:
        import coverage
    except ImportError:
        print("bench/walk.py needs coverage: pip install coverage", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gpuq-walk-") as tmp:
        here = Path(tmp)
        (here / "sitecustomize.py").write_text(SITECUSTOMIZE)
        rc = here / "coveragerc"
        rc.write_text(f"[run]\nparallel = True\ndata_file = {here / 'cov'}\nsource = {REPO / 'gpuq'}\n")
        os.chmod(tmp, 0o755)  # processes that drop privileges still write their data here
        for path in (here / "sitecustomize.py", rc):
            os.chmod(path, 0o644)
        env = {**os.environ, "PYTHONPATH": tmp, "COVERAGE_PROCESS_START": str(rc)}
        _run_one_job(make_root("walk"), env)
        data = coverage.CoverageData(basename=str(here / "cov"))
        combiner = coverage.Coverage(data_file=str(here / "cov"), config_file=str(rc))
        combiner.combine(data_paths=[tmp], strict=True)
        data = combiner.get_data()
        package = REPO / "gpuq"
        modules = sorted(p for p in package.rglob("*.py") if "tests" not in p.relative_to(package).parts)
        loaded: dict[str, list[Path]] = {"core": [], "extras": []}
        functions_of: dict[Path, int] = {}
        entered = {"core": 0, "extras": 0}
        lines_run = {"core": 0, "extras": 0}
        for path in modules:
            part = "extras" if path.relative_to(package).parts[0] == "extras" else "core"
            ran = set(data.lines(str(path)) or ())
            if not ran:
                continue
            loaded[part].append(path)
            lines_run[part] += len(ran)
            functions_of[path] = sum(1 for first, last in _functions(path) if any(first <= n <= last for n in ran))
            entered[part] += functions_of[path]
        for part in ("core", "extras"):
            total = sum(1 for p in modules if (p.relative_to(package).parts[0] == "extras") == (part == "extras"))
            print(
                f"{part:6}: {len(loaded[part])} of {total} modules loaded, "
                f"{entered[part]} functions entered, {lines_run[part]} lines run"
            )
        if args.list:
            for path in loaded["core"] + loaded["extras"]:
                print(f"   {path.relative_to(REPO)} ({functions_of[path]} functions entered)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
