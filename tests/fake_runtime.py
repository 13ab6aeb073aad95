"""A stand-in for docker, podman and apptainer, for tests on machines without them.

Each call is recorded (runtime, arguments, caller's uid) in $FAKE_RUNTIME_DIR/calls.jsonl.
docker and podman behave like the real ones where gpuq depends on it: `run` hands the
command to a daemon (started by the test, outside the job's process tree), so killing the
client leaves the "container" running until `stop`, `kill` or `rm --force` reach it; the
client relays SIGTERM/SIGINT (docker's sig-proxy) and exits with the container's status.
The container gets only the variables named by --env, NVIDIA_VISIBLE_DEVICES for the GPUs
given (--gpus '"device=1,2"' or CDI --device nvidia.com/gpu=N), runs in --workdir, which must
be a mounted --volume, and as --user (with each --group-add) when the daemon is root. podman
is rootless, as a team's member runs it: its container runs as the client's own user, and a
--volume source the client cannot reach fails the run (the kernel's check, in the user's
namespace), where docker's root daemon mounts anything. Options are read as
pflag reads them (docker's and podman's parser): `--name=value` or `--name value`, short
flags combined (`-iu0` is `-i -u 0`), and for a flag given twice the last one wins; the
client itself reads `--env-file` and writes `--pidfile`, `--conmon-pidfile` and `--cidfile`,
with the client's privileges, as the real ones do. The image is not used: the
command runs on the host's file system. apptainer runs the command itself (as the real one
does, in the caller's process tree), with --cleanenv and APPTAINERENV_* honoured.

Usage: StandIns(dir) installs the three executables in dir/bin and starts the daemon;
.worker_env() is the PATH that finds them; .close() ends the daemon and its containers.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

VALUE_FLAGS = {
    "--name",
    "--label",
    "--gpus",
    "--device",
    "--user",
    "-u",
    "--group-add",
    "--volume",
    "-v",
    "--workdir",
    "-w",
    "--cpuset-cpus",
    "--memory",
    "--env",
    "-e",
    "--shm-size",
    "--time",
    "-t",
    "--format",
    "--bind",
    "--pwd",
    "--security-opt",
    "--cap-drop",
    "--cap-add",
    "--ulimit",
    "--network",
    "--entrypoint",
    "--ipc",
    "--pid",
    "--env-file",
    "--pidfile",
    "--conmon-pidfile",
    "--cidfile",
    "--label-file",
    "--authfile",
    "--volumes-from",
    "--tmpfs",
    "--hostname",
    "--pull",
    "--oom-score-adj",
    "--mount",
    "--userns",
}
# `run`'s shorthands, as docker defines them: switches, and those that take a value.
RUN_SWITCHES = {"i": "--interactive", "t": "--tty", "d": "--detach", "P": "--publish-all", "q": "--quiet"}
RUN_SHORT_VALUES = {
    "u": "--user",
    "e": "--env",
    "v": "--volume",
    "w": "--workdir",
    "m": "--memory",
    "c": "--cpu-shares",
    "h": "--hostname",
    "l": "--label",
    "p": "--publish",
}
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/"}


def install(bin_dir: Path, state_dir: Path, python: str = sys.executable) -> None:
    """The three clients in `bin_dir`, each run by `python` (one a job's owner can run: the
    clients run as the job's owner) from a copy of this file beside them; `state_dir` open to
    every user (the clients of several owners write their calls there and reach the daemon)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o1777)
    (state_dir / "calls.jsonl").touch()
    (state_dir / "calls.jsonl").chmod(0o666)
    script = bin_dir / "fake_runtime.py"
    script.write_text(Path(__file__).read_text())
    script.chmod(0o644)
    for name in ("docker", "podman", "apptainer"):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nFAKE_RUNTIME_DIR={state_dir} exec {python} {script} {name} "$@"\n')
        path.chmod(0o755)


def start_daemon(state_dir: Path) -> subprocess.Popen:
    sock = state_dir / "daemon.sock"
    sock.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--daemon", str(state_dir)], start_new_session=True
    )
    for _ in range(100):
        if sock.exists():
            return proc
        time.sleep(0.05)
    raise RuntimeError("fake runtime daemon did not start")


def calls(state_dir: Path) -> list[dict]:
    path = state_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class StandIns:
    """The three stand-ins on a PATH of their own, and their daemon (a test fixture's)."""

    def __init__(self, base: Path, python: str = sys.executable) -> None:
        self.bin, self.state = base / "bin", base / "state"
        install(self.bin, self.state, python)
        self.daemon = start_daemon(self.state)

    def worker_env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}:{os.environ['PATH']}"}

    def calls(self, verb: str | None = None) -> list[dict]:
        return [c for c in calls(self.state) if verb is None or c["args"][:1] == [verb]]

    def containers(self) -> dict:
        path = self.state / "containers.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def close(self) -> None:
        """End the containers still running, then the daemon. Only a container the daemon still
        has as its child: an ended one's pid may be another process's by now (pid numbers wrap
        within a suite on a 32768-pid machine), and a second suite beside this one lost its own
        stand-in daemon to a group kill aimed at a long-gone container."""
        import psutil

        for box in self.containers().values():
            if box["exit"] is not None:
                continue
            try:
                if psutil.Process(box["pid"]).ppid() == self.daemon.pid:
                    os.killpg(box["pid"], 9)
            except (OSError, psutil.Error):
                pass
        self.daemon.terminate()
        self.daemon.wait()


# --- the client -------------------------------------------------------------------------------


def _request(state_dir: Path, message: dict, fds: list[int] = ()) -> BinaryIO:
    """Send `message` (and `fds`); the connection's answers, read through one buffered reader:
    `run` gets two on one connection (started, then the exit), and a quick container's exit
    can arrive in the same read as its start."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(state_dir / "daemon.sock"))
    socket.send_fds(conn, [(json.dumps(message) + "\n").encode()], list(fds))
    return conn.makefile("rb")  # type: ignore[return-value]


def _answer(replies: BinaryIO) -> dict:
    """The daemon's next answer: one line."""
    line = replies.readline()
    if not line.endswith(b"\n"):
        raise ConnectionError("daemon closed the connection")
    return json.loads(line)


def _parse(args: list[str], verb: str = "") -> tuple[dict[str, list[str]], list[str], list[str]]:
    """Options (name -> values, in order), flags, and the rest (image and command). For `run`,
    short flags are read as pflag reads them: combined (`-iu0`), each under its long name."""
    options: dict[str, list[str]] = {}
    flags: list[str] = []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if verb == "run" and not arg.startswith("--") and len(arg) > 1:
            i = _short(args, i, options, flags)
            continue
        if "=" in arg and arg.startswith("--"):
            name, value = arg.split("=", 1)
            options.setdefault(name, []).append(value)
        elif arg in VALUE_FLAGS:
            options.setdefault(arg, []).append(args[i + 1])
            i += 1
        else:
            flags.append(arg)
        i += 1
    return options, flags, args[i:]


def _short(args: list[str], i: int, options: dict[str, list[str]], flags: list[str]) -> int:
    """pflag's shorthands: `-it`, `-iu0`, `-u 0`, `-u=0`. Returns the index after them."""
    letters = args[i][1:]
    while letters:
        letter, letters = letters[0], letters[1:]
        if letter in RUN_SHORT_VALUES:
            if letters:
                value = letters[1:] if letters.startswith("=") else letters
            else:
                i += 1
                value = args[i]
            options.setdefault(RUN_SHORT_VALUES[letter], []).append(value)
            return i + 1
        flags.append(RUN_SWITCHES.get(letter, f"-{letter}"))
    return i + 1


def _inspect(info: dict, template: str | None) -> dict:
    """What `docker inspect [--format T]` prints: the whole object as JSON, or the template
    with each {{.A.B}} replaced by that field (Go's form for booleans), or docker's error for
    a field the object does not have. Only what gpuq may ask is answered as docker would."""
    if template is None:
        return {"out": json.dumps([info])}

    def field(match: re.Match) -> str:
        value: object = info
        for part in match.group(1).split("."):
            if not isinstance(value, dict) or part not in value:
                raise KeyError(part)
            value = value[part]
        return str(value).lower() if isinstance(value, bool) else str(value)

    try:
        return {"out": re.sub(r"\{\{\s*\.([A-Za-z.]+)\s*\}\}", field, template)}
    except KeyError as e:
        return {
            "error": f'template parsing error: template: :1: executing "" at <.{e.args[0]}>: '
            f"can't evaluate field {e.args[0]}"
        }


def _gpu_devices(options: dict[str, list[str]]) -> str | None:
    gpus = options.get("--gpus")
    if gpus:
        value = gpus[-1].strip('"')
        return value.split("=", 1)[1] if value.startswith("device=") else value
    cdi = [d.split("=", 1)[1] for d in options.get("--device", []) if d.startswith("nvidia.com/gpu=")]
    return ",".join(cdi) if cdi else None


def client(runtime: str, args: list[str]) -> int:
    state_dir = Path(os.environ["FAKE_RUNTIME_DIR"])
    with open(state_dir / "calls.jsonl", "a") as f:
        f.write(json.dumps({"runtime": runtime, "args": args, "uid": os.getuid(), "t": time.time()}) + "\n")
    if runtime == "apptainer":
        return _apptainer(args)
    verb, rest = (args[0], args[1:]) if args else ("", [])
    if verb == "--version":  # the client alone, daemon or not
        print("Docker version 24.0.7-fake, build fake" if runtime == "docker" else "podman version 4.9.0-fake")
        return 0
    if verb == "version":
        if runtime == "podman":
            print("4.9.0-fake")
            return 0
        try:
            print(_answer(_request(state_dir, {"op": "ping"}))["version"])
            return 0
        except OSError:
            print(
                f"Cannot connect to the Docker daemon at unix://{state_dir}/daemon.sock. Is the docker daemon running?",
                file=sys.stderr,
            )
            return 1
    options, flags, positional = _parse(rest, verb)
    if verb == "run":
        return _run(state_dir, runtime, options, flags, positional)
    if verb in ("stop", "kill", "rm", "inspect"):
        answer = _answer(_request(state_dir, {"op": verb, "name": positional[0], "options": options, "flags": flags}))
        if "error" in answer:
            print(f"Error: {answer['error']}", file=sys.stderr)
            return 1
        print(answer.get("out", positional[0]))
        return 0
    print(f"fake {runtime}: unknown command {verb!r}", file=sys.stderr)
    return 125


def _run(state_dir: Path, runtime: str, options: dict[str, list[str]], flags: list[str], positional: list[str]) -> int:
    image, argv = positional[0], positional[1:]
    env = dict(BASE_ENV)
    for path in options.get("--env-file", []):  # read by the client, with its privileges
        with open(path) as f:
            for line in f.read().splitlines():
                key, sep, value = line.partition("=")
                if sep and not key.startswith("#"):
                    env[key.strip()] = value
    for item in options.get("--env", []) + options.get("-e", []):
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
        elif key in os.environ:
            env[key] = os.environ[key]
    if (devices := _gpu_devices(options)) is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = devices
    mounts = [v.split(":")[1] if ":" in v else v for v in options.get("--volume", []) + options.get("-v", [])]
    workdir = (options.get("--workdir") or options.get("-w") or ["/"])[-1]
    if workdir != "/" and not any(workdir == m or workdir.startswith(m.rstrip("/") + "/") for m in mounts):
        print(f"fake runtime: workdir {workdir} is not inside a mounted volume {mounts}", file=sys.stderr)
        return 125
    rootless = runtime == "podman" and os.getuid() != 0
    if rootless:
        for volume in options.get("--volume", []) + options.get("-v", []):
            source = volume.split(":")[0]
            try:
                os.stat(source)
                if not os.access(source, os.R_OK | (os.X_OK if os.path.isdir(source) else 0)):
                    raise PermissionError("permission denied")
            except OSError as e:
                print(f"Error: statfs {source}: {(e.strerror or str(e)).lower()}", file=sys.stderr)
                return 125
    request = {
        "op": "run",
        "rootless": rootless,
        "name": (options.get("--name") or [f"anon-{os.getpid()}"])[-1],
        "argv": argv,
        "env": env,
        "cwd": workdir,
        "user": (options.get("--user") or [None])[-1],
        "image": image,
        "groups": [int(g) for g in options.get("--group-add", []) if g.isdigit()],
        "rm": "--rm" in flags,
    }
    replies = _request(state_dir, request, [1, 2])
    answer = _answer(replies)
    if "error" in answer:
        print(f"docker: Error response from daemon: {answer['error']}", file=sys.stderr)
        return 125
    for key in ("--pidfile", "--conmon-pidfile", "--cidfile"):  # written by the client, with its privileges
        for path in options.get(key, []):
            with open(path, "w") as f:
                f.write(f"{answer['pid']}\n")

    def relay(signum: int, frame: object) -> None:  # docker's --sig-proxy
        try:
            _answer(
                _request(state_dir, {"op": "kill", "name": request["name"], "options": {"--signal": [str(signum)]}})
            )
        except OSError:
            pass

    signal.signal(signal.SIGTERM, relay)
    signal.signal(signal.SIGINT, relay)
    while True:
        try:
            return _answer(replies)["exit"]
        except InterruptedError:
            continue


def _apptainer(args: list[str]) -> int:
    if args[:1] == ["--version"]:
        print("apptainer version 1.3.0-fake")
        return 0
    if args[:1] != ["exec"]:
        print(f"fake apptainer: unknown command {args[:1]}", file=sys.stderr)
        return 255
    options, flags, positional = _parse(args[1:])
    env = dict(BASE_ENV) if "--cleanenv" in flags else dict(os.environ)
    for key, value in os.environ.items():
        if key.startswith("APPTAINERENV_"):
            env[key[len("APPTAINERENV_") :]] = value
    binds = [b.split(":")[1] if ":" in b else b for b in options.get("--bind", [])]
    pwd = (options.get("--pwd") or [os.getcwd()])[-1]
    if not any(pwd == b or pwd.startswith(b.rstrip("/") + "/") for b in binds):
        print(f"fake apptainer: --pwd {pwd} is not bound", file=sys.stderr)
        return 255
    os.chdir(pwd)
    os.execvpe(positional[1], positional[1:], env)


# --- the daemon -------------------------------------------------------------------------------


def _groups_of(uid: int, gid: int) -> list[int]:
    import pwd

    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]


class Daemon:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.containers: dict[str, dict] = {}  # name -> {pid, exit, rm, waiters}
        self.kill_at: dict[str, float] = {}  # name -> when `stop` sends SIGKILL
        self.stop_waiters: dict[str, list[socket.socket]] = {}

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = self.state_dir / "daemon.sock"
        listener.bind(str(path) + ".tmp")
        os.chmod(str(path) + ".tmp", 0o777)  # clients run as each job's owner
        os.rename(str(path) + ".tmp", path)
        listener.listen(64)
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        while True:
            ready, _, _ = select.select([listener], [], [], 0.05)
            if ready:
                conn, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 2)
                if not message:
                    # A client killed between connect and send (gpuq's stop may kill it
                    # there): a real daemon drops the connection and goes on.
                    for fd in fds:
                        os.close(fd)
                    conn.close()
                    continue
                try:
                    self.handle(conn, json.loads(message), fds)
                finally:
                    for fd in fds:
                        os.close(fd)
            self.reap()

    def handle(self, conn: socket.socket, m: dict, fds: list[int]) -> None:
        op, name = m["op"], m.get("name")
        box = self.containers.get(name) if name else None
        if op == "ping":
            return self.reply(conn, {"version": "24.0.7-fake"})
        if op == "run":
            if box is not None:
                return self.reply(conn, {"error": f'Conflict. The container name "/{name}" is already in use'})
            if m.get("rootless"):  # rootless podman: the container is the client's own user's
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                uid, gid = (int.from_bytes(creds[i : i + 4], sys.byteorder) for i in (4, 8))
                m = {**m, "user": f"{uid}:{gid}", "groups": _groups_of(uid, gid)}
            pid = os.fork()
            if pid == 0:
                self._child(m, fds)
            self.containers[name] = {"pid": pid, "exit": None, "rm": m["rm"], "waiters": [conn]}
            return self.reply(conn, {"ok": True, "pid": pid}, close=False)
        if box is None:
            return self.reply(conn, {"error": f"No such container: {name}"})
        running = box["exit"] is None
        if op == "inspect":
            info = {
                "Name": f"/{name}",
                "State": {
                    "Pid": box["pid"] if running else 0,
                    "Running": running,
                    "Status": "running" if running else "exited",
                    "ExitCode": box["exit"] or 0,
                },
            }
            return self.reply(conn, _inspect(info, (m["options"].get("--format") or [None])[-1]))
        if op == "kill":
            sig = int((m.get("options", {}).get("--signal") or ["9"])[-1])
            if running:
                os.killpg(box["pid"], sig)
            return self.reply(conn, {})
        if op == "stop":
            if not running:
                return self.reply(conn, {})
            os.killpg(box["pid"], signal.SIGTERM)
            self.kill_at[name] = time.monotonic() + float((m["options"].get("--time") or ["10"])[-1])
            self.stop_waiters.setdefault(name, []).append(conn)
            return None
        if op == "rm":
            if running:
                if "--force" not in m.get("flags", []) and "-f" not in m.get("flags", []):
                    return self.reply(conn, {"error": "cannot remove a running container"})
                os.killpg(box["pid"], signal.SIGKILL)
                os.waitpid(box["pid"], 0)
            del self.containers[name]
            return self.reply(conn, {})
        self.reply(conn, {"error": f"unknown op {op}"})

    @staticmethod
    def _child(m: dict, fds: list[int]) -> None:
        try:
            os.setsid()
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.chdir(m["cwd"])
            if m["user"] and os.getuid() == 0:
                uid, _, gid = m["user"].partition(":")
                os.setgroups(m["groups"])
                os.setgid(int(gid or uid))
                os.setuid(int(uid))
            os.execvpe(m["argv"][0], m["argv"], m["env"])
        except BaseException as e:
            os.write(2, f"fake runtime: cannot run {m['argv']}: {e}\n".encode())
        os._exit(127)

    def reap(self) -> None:
        now = time.monotonic()
        for name, at in list(self.kill_at.items()):
            box = self.containers.get(name)
            if box is None or box["exit"] is not None:
                del self.kill_at[name]
            elif now >= at:
                os.killpg(box["pid"], signal.SIGKILL)
                del self.kill_at[name]
        for name, box in list(self.containers.items()):
            if box["exit"] is not None:
                continue
            done, status = os.waitpid(box["pid"], os.WNOHANG)
            if not done:
                continue
            box["exit"] = os.waitstatus_to_exitcode(status)
            code = box["exit"] if box["exit"] >= 0 else 128 - box["exit"]
            for conn in box.pop("waiters"):
                self.reply(conn, {"exit": code})
            for conn in self.stop_waiters.pop(name, []):
                self.reply(conn, {})
            if box["rm"]:
                del self.containers[name]
        current = {n: {"pid": b["pid"], "exit": b["exit"]} for n, b in self.containers.items()}
        if current != getattr(self, "written", None):  # what tests read: the containers that exist
            with open(self.state_dir / "containers.json.tmp", "w") as f:
                json.dump(current, f)
            os.replace(self.state_dir / "containers.json.tmp", self.state_dir / "containers.json")
            self.written = current

    @staticmethod
    def reply(conn: socket.socket, answer: dict, close: bool = True) -> None:
        try:
            conn.sendall((json.dumps(answer) + "\n").encode())
        except OSError:
            pass
        if close:
            conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "--daemon":
        Daemon(Path(sys.argv[2])).serve()
    else:
        sys.exit(client(sys.argv[1], sys.argv[2:]))
