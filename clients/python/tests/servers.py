# mypy: disallow-untyped-calls=False
"""Real servers for the tests: redis-server (or valkey-server) processes on a free loopback port,
with or without the module, under its test clock when asked, killed at teardown; and a cluster
of masters made by ``redis-cli --cluster create``.

``RL_REDIS_SERVER`` names the server binary (default ``redis-server``), ``RL_MODULE`` the module
(default the workspace's release build).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from ratelimit_client import Options

ROOT = Path(__file__).resolve().parents[3]


#: Options for the tests whose subject is not the deadline: 2 s, which a loaded machine may need
#: for a round trip (the default 100 ms is tested where the deadline is the subject).
SLACK = Options(timeout=2.0)


def server_binary() -> str:
    return os.environ.get("RL_REDIS_SERVER") or "redis-server"


def module_path() -> str:
    path = os.environ.get("RL_MODULE") or str(ROOT / "target" / "release" / "libredis_rate_limiter.so")
    if not Path(path).exists():
        raise RuntimeError(f"the module is not built: {path} (make build, or set RL_MODULE)")
    return path


def free_port(pair: bool = False) -> int:
    """A free loopback port; with ``pair``, one whose cluster bus port (+10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not pair:
            return port
        if port < 55535:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                    return port
                except OSError:
                    continue


class Server:
    """One server process."""

    def __init__(
        self,
        *,
        module: bool = True,
        test_clock: bool = False,
        port: int | None = None,
        extra: list[str] | None = None,
        cluster: bool = False,
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="rl-py-")
        self.port = port or free_port(pair=cluster)
        args = [
            server_binary(),
            "--port", "",
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "server.log"),
            "--save", "",
            "--appendonly", "no",
        ]  # fmt: skip
        if module:
            args += ["--loadmodule", module_path()]
            if test_clock:
                args.append("TESTCLOCK")
        if cluster:
            args += [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ]
        args += extra or []
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None
        # A port chosen here (a pair for a cluster node) can be taken by another process between
        # the check and the server's bind: then it tries again on another one.
        for attempt in range(1, 6):
            args[2] = str(self.port)
            try:
                self.start()
                return
            except RuntimeError:
                if port is not None or attempt == 5 or "Address already in use" not in self.log():
                    raise
                self.kill()
                for leftover in ("server.log", "nodes.conf"):
                    Path(self.dir, leftover).unlink(missing_ok=True)
                self.port = free_port(pair=cluster)

    def start(self) -> None:
        """Starts (or starts again, on the same port and directory) and waits until it answers."""
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if self.connect(socket_timeout=1).ping():
                    return
            except redis.RedisError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.args[0]} exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.args[0]} did not start:\n{self.log()}")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def connect(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("decode_responses", True)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def raw(self) -> redis.Connection:
        """A connection without redis-py's reply callbacks: replies as the server sent them."""
        c = redis.Connection(host="127.0.0.1", port=self.port, socket_timeout=10, protocol=2)
        c.connect()
        return c

    def log(self) -> str:
        try:
            return Path(self.dir, "server.log").read_text()
        except OSError:
            return ""

    def kill(self) -> None:
        """Kills the server at once (no shutdown handshake), as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def freeze(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def call(conn: redis.Connection, *args: Any) -> Any:
    """A command on a raw connection; the reply as sent (errors raised)."""
    conn.send_command(*args)
    return conn.read_response()


class Cluster:
    """``masters`` masters (no replicas), the module loaded everywhere when asked, slots assigned
    by ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3, *, module: bool = True, test_clock: bool = False) -> None:
        self.nodes: list[Server] = []
        try:
            for _ in range(masters):
                self.nodes.append(Server(module=module, test_clock=test_clock, cluster=True))
            out = subprocess.run(
                ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes), "--cluster-yes"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if out.returncode != 0:
                raise RuntimeError(f"cluster create failed:\n{out.stdout}\n{out.stderr}")
            self.wait_until_ok()
        except BaseException:
            self.stop()
            raise

    def wait_until_ok(self) -> None:
        deadline = time.monotonic() + 30
        for n in self.nodes:
            c = n.raw()
            while b"cluster_state:ok" not in call(c, "CLUSTER", "INFO"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster never became ok")
                time.sleep(0.05)

    def owner(self, key: str) -> Server:
        """The master serving ``key``."""
        c = self.nodes[0].raw()
        slot = call(c, "CLUSTER", "KEYSLOT", key)
        for line in call(c, "CLUSTER", "NODES").decode().splitlines():
            fields = line.split(" ")
            if "master" not in fields[2]:
                continue
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            for r in fields[8:]:
                lo, _, hi = r.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return next(n for n in self.nodes if n.port == port)
        raise RuntimeError(f"no owner for slot {slot}")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
