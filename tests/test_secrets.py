"""Secrets in a submitter's environment (security review M5, newcomer review M4): `gpuq submit`
stores what a job needs and leaves out what looks like a secret unless it is named with
`--export`; `gpuq show` masks the same set, whole values included."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from team import ALICE, BOB, needs_root

from conftest import wait_until

# What alice has in her shell: none of these values may reach a file the team can read.
SECRETS = {
    "WANDB_API_KEY": "wandb-k3y-5ecret-0001",
    "HF_TOKEN": "hf-t0ken-5ecret-0002",
    "AWS_SECRET_ACCESS_KEY": "aws-5ecret-acce55-0003",
    "DATABASE_URL": "postgres://u:pw-5ecret-0004@h/db",
    "MYSQL_PWD": "mysql-5ecret-0005",
    "GITHUB_PAT": "github-pat-5ecret-0006",
}


def files_holding(root: Path, value: str) -> list[str]:
    """Every file under `root` whose bytes hold `value` (grep -rl, as any reader of the tree)."""
    found = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            try:
                if not path.is_symlink() and path.is_file() and value.encode() in path.read_bytes():
                    found.append(str(path.relative_to(root)))
            except OSError:
                continue
    return found


def test_names_and_values_that_look_like_secrets():
    from gpuq.model.secrets import looks_secret

    for name in (
        "WANDB_API_KEY",
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "MYSQL_PWD",
        "GITHUB_PAT",
        "PGPASSWORD",
        "DB_PASS",
        "SENTRY_DSN",
        "AWS_SESSION_TOKEN",
        "apiKey",
        "hfToken",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "OPENAI_API_KEY",
        "BASIC_AUTH",
        "SESSION_COOKIE",
    ):
        assert looks_secret(name, "x"), name
    for name in (
        "PATH",
        "PWD",
        "OLDPWD",
        "HOME",
        "TOKENIZERS_PARALLELISM",
        "HF_HOME",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "PYTHONPATH",
        "LD_LIBRARY_PATH",
        "LANG",
        "LC_ALL",
        "TZ",
        "CUDA_HOME",
        "NCCL_DEBUG",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "XAUTHORITY",
        "PATHEXT",
        "KEYBOARD",
    ):
        assert not looks_secret(name, "/usr/bin"), name
    assert looks_secret("DATABASE_URL", "postgres://u:pw@h/db") and looks_secret("https_proxy", "http://a:b@proxy:3128")
    assert looks_secret("CONN", "Server=db;Database=x;Password=hunter2")
    assert not looks_secret("DATABASE_URL", "postgres://h/db") and not looks_secret("UPSTREAM", "https://u@h/x")
    # What an attack review still found stored under neutral names: each format, by its value.
    for value in (
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "npm_" + "a1B2c3D4e5" * 4,
        "AIza" + "Sy" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "dop_v1_" + "0123456789abcdef" * 4,
        "Bearer abcdefghijklmnop.qrstuvwxyz012345",
        "sk_live_" + "51HxYzAbCdEfGhIjKlMn",
    ):
        assert looks_secret("SETTING", value), value
    for plain in ("Bearer of news", "eyJ-not-a-token", "npm_config", "sk_live_x"):
        assert not looks_secret("SETTING", plain), plain


def test_submit_leaves_secrets_out_unless_named(monkeypatch):
    from gpuq.spool.submit import exported_environment

    monkeypatch.setattr(os, "environ", {"PATH": "/usr/bin", "HF_HOME": "/scratch/hf", "PWD": "/x", **SECRETS})
    env, left_out = exported_environment(None)
    assert env == {"PATH": "/usr/bin", "HF_HOME": "/scratch/hf"} and left_out == sorted(SECRETS)
    env, left_out = exported_environment("ALL,HF_TOKEN,SEED=3")
    assert env["HF_TOKEN"] == SECRETS["HF_TOKEN"] and env["SEED"] == "3" and "HF_TOKEN" not in left_out
    assert exported_environment("MYSQL_PWD") == ({"MYSQL_PWD": SECRETS["MYSQL_PWD"]}, [])
    assert exported_environment(None, isolated=True) == ({}, [])


def test_show_masks_whole_values_in_the_spec_and_its_text():
    from gpuq.model.secrets import MASK, mask_secrets

    env = {"DB_PASSWORD": "p,w0rd}x", **SECRETS, "NOTE": "a, b", "PATH": "/usr/bin"}
    block = yaml.safe_dump({"command": "python train.py", "env": env}, sort_keys=False)
    flow = (
        "command: python train.py\n"
        "env: {DB_PASSWORD: \"p,w0rd}x\", GITHUB_PAT: 'github-pat-5ecret-0006', NOTE: 'a, b'}\n"
    )
    multi = "command: x\nenv:\n  HF_TOKEN: |\n    hf-t0ken-5ecret\n    second line\n  PATH: /usr/bin\n"
    for text in (block, flow, multi):
        shown = mask_secrets({"spec": {"env": env}, "spec_text": text})
        dumped = json.dumps(shown)
        for value in ("p,w0rd}x", "w0rd", "hf-t0ken-5ecret", "second line", *SECRETS.values()):
            assert value not in dumped, (value, shown["spec_text"])
        assert MASK in shown["spec_text"] and shown["spec"]["env"]["PATH"] == "/usr/bin"
    assert "NOTE: a, b" in mask_secrets({"spec": {"env": env}, "spec_text": block})["spec_text"]


@pytest.mark.slow
def test_a_spec_over_the_cap_because_of_the_environment_points_at_export(queue):
    huge = {**queue.env(), **{f"BIG_LIST_{i}": "x" * 100_000 for i in range(3)}}  # (each under Linux's 128 KiB)
    out = queue.gpuq("submit", "--gpus", "0", "--", "true", env=huge, check=False)
    assert out.returncode == 2 and "--export" in out.stderr and "BIG_LIST_" in out.stderr, out.stderr
    assert not list((queue.root / "jobs").glob("*.yaml"))


@needs_root
def test_secrets_in_a_submitters_environment_never_reach_the_teams_files(team):
    """alice submits from a shell holding six secrets; the job runs (as her, under a root
    worker) and prints its environment. No value is anywhere under the root, except the
    one she named with --export, which the job then sees; bob's `gpuq show` masks it."""
    team.start_worker("box", "1x80GiB")
    plain = team.as_user(ALICE, "submit", "--gpus", "0", "--id", "plain", "--", "env", env=SECRETS)
    assert plain.returncode == 0, plain.stderr
    named = team.as_user(
        ALICE, "submit", "--gpus", "0", "--id", "named", "--export", "ALL,HF_TOKEN", "--", "env", env=SECRETS
    )
    assert named.returncode == 0, named.stderr
    for job_id in ("plain", "named"):
        done = wait_until(lambda job_id=job_id: team.finished(job_id), timeout=60, what=f"{job_id} to run")
        assert done["state"] == "done", team.log(job_id)
    assert "USER=" in team.log("plain")  # the job did print its environment
    assert f"HF_TOKEN={SECRETS['HF_TOKEN']}" in team.log("named")  # named: the job sees it
    for name, value in SECRETS.items():
        holding = files_holding(team.root, value)
        if name == "HF_TOKEN":
            assert holding, "a named secret is stored in the spec, and the job sees it"
        else:
            assert holding == [], f"{name}'s value is in {holding}"
    for name in SECRETS:  # submit said what it left out, and how to pass it
        assert name in plain.stderr and (name in named.stderr) == (name != "HF_TOKEN"), named.stderr
    assert "--export ALL,AWS_SECRET_ACCESS_KEY,DATABASE_URL," in plain.stderr
    shown = team.as_user(BOB, "show", "named", "--json")
    assert shown.returncode == 0, shown.stderr
    assert SECRETS["HF_TOKEN"] not in shown.stdout and '"HF_TOKEN": "****"' in shown.stdout
