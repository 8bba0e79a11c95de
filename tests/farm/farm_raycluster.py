"""A throwaway `ray start --head` cluster for tests: its own free ports and temp dir, and
stopped by killing exactly its processes (never `ray stop`, which kills every Ray on the
machine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _proc_table() -> dict[int, tuple[int, str]]:
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        table[int(entry)] = (ppid, cmd)
    return table


@dataclass
class HeadCluster:
    temp_dir: str
    gcs_port: int
    dashboard_port: int
    metrics_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def processes(self) -> list[int]:
        table = _proc_table()
        needles = [self.temp_dir] + ([f":{self.gcs_port} ", f":{self.gcs_port}\n"] if self.gcs_port > 0 else [])
        roots = {pid for pid, (_, cmd) in table.items() if any(n in cmd + "\n" for n in needles)}
        found = set(roots)
        changed = True
        while changed:
            changed = False
            for pid, (ppid, _) in table.items():
                if ppid in found and pid not in found:
                    found.add(pid)
                    changed = True
        found.discard(os.getpid())
        return sorted(found)

    def stop(self) -> None:
        for _ in range(3):
            pids = self.processes()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)  # poll: the loop's tries bound the wait


def start_head(num_cpus: int = 2) -> HeadCluster:
    ports = _free_ports(9)
    temp_dir = tempfile.mkdtemp(prefix="frh")  # short: unix socket paths are limited
    cluster = HeadCluster(temp_dir, ports[0], ports[1], ports[5])
    cmd = [
        str(BIN / "ray"), "start", "--head", f"--temp-dir={temp_dir}", f"--num-cpus={num_cpus}",
        f"--port={ports[0]}", f"--dashboard-port={ports[1]}", "--dashboard-host=127.0.0.1",
        f"--dashboard-agent-listen-port={ports[2]}", f"--dashboard-agent-grpc-port={ports[3]}",
        f"--runtime-env-agent-port={ports[4]}", f"--metrics-export-port={ports[5]}",
        f"--ray-client-server-port={ports[6]}", f"--node-manager-port={ports[7]}",
        f"--object-manager-port={ports[8]}", "--disable-usage-stats",
    ]  # fmt: skip
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    except BaseException:
        cluster.stop()
        raise
    return cluster
