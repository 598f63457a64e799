"""Hosts as Linux network namespaces, with daemons inside them and faults between them.

:class:`TestNet` makes one namespace per host (``pgmf<token>-<host>``) and a ``switch`` namespace that
holds a bridge; each host has a veth pair, ``eth0`` inside the host with an address in 198.18.0.0/24
(RFC 2544's benchmarking range), the other end a port of the bridge. No namespace has a default route,
and nothing is attached to the machine's own network, so a packet to a test address has nowhere to go
but the bridge. :meth:`TestNet.check_routes` proves it before any traffic: from every namespace, ``ip
route get`` of every test address must name ``eth0`` (or ``lo``, for the host's own address) and there
must be no default route; otherwise it raises with the reason.

Every process that talks to a test address runs inside a host through :meth:`TestNet.spawn` (``ip
netns exec`` and ``unshare --uts`` with the host's own hostname; ``/etc/netns/<ns>/hosts`` maps the
host names to their addresses for that namespace only). The test process itself never opens a
connection to a test address: it starts processes and reads files.

Faults (context managers; each undoes itself on exit and, as a bound, after ``max_s`` seconds even if
the block is still running): :meth:`partition`, :meth:`isolate`, :meth:`loss`, :meth:`latency`,
:meth:`pause`, and :meth:`reset` (a one-shot ``ss -K``). Packet rules live in the hosts' own
namespaces, so deleting a namespace deletes them.

:meth:`TestNet.teardown` kills every process it started (and any process left in its namespaces),
deletes the namespaces and the ``/etc/netns`` files, and :meth:`TestNet.leftovers` lists anything
that is still there (the session fixture fails on it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "198.18.0"
PREFIX = "pgmf"
HOSTS = {"driver": 2, "scheduler": 3, "slurmctld": 4, "mlflow": 5, "worker1": 11, "worker2": 12, "worker3": 13}
SCHEDULER_PORT = 8786
MLFLOW_PORT = 5000
DELAYER = Path(__file__).with_name("delayer.py")


def why_not() -> str | None:
    """Why the namespaces cannot be made here, or None."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces and iptables need root (this user is not)"
    for tool in ("ip", "iptables", "unshare", "ss"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install iproute2 iptables util-linux)"
    return None


def _run(*cmd, check=True, timeout=30) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}")
    return r


@dataclass
class Proc:
    host: str
    name: str
    popen: subprocess.Popen
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-n:]
        except OSError:
            return ""


@dataclass
class TestNet:
    root: Path
    token: str = field(default_factory=lambda: f"{os.getpid() % 100000}")
    procs: list = field(default_factory=list)
    timers: list = field(default_factory=list)
    made: list = field(default_factory=list)  # namespaces made, in order
    fault_log: list = field(default_factory=list)  # (name, start, end) of every fault, for the figures

    __test__ = False  # not a pytest test class

    # ---- names and addresses -------------------------------------------------------------------------
    def ns(self, host: str) -> str:
        return f"{PREFIX}{self.token}-{host}"

    @property
    def switch(self) -> str:
        return self.ns("switch")

    @staticmethod
    def ip(host: str) -> str:
        return f"{SUBNET}.{HOSTS[host]}"

    @property
    def scheduler_address(self) -> str:
        return f"tcp://{self.ip('scheduler')}:{SCHEDULER_PORT}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{self.ip('mlflow')}:{MLFLOW_PORT}"

    # ---- building ------------------------------------------------------------------------------------
    def build(self):
        _run("ip", "netns", "add", self.switch)
        self.made.append(self.switch)
        sw = ["ip", "-n", self.switch]
        _run(*sw, "link", "add", "br0", "type", "bridge")
        _run(*sw, "link", "set", "br0", "up")
        _run(*sw, "link", "set", "lo", "up")
        hosts_file = "".join(f"{self.ip(h)} {h}\n" for h in HOSTS)
        for host in HOSTS:
            ns = self.ns(host)
            _run("ip", "netns", "add", ns)
            self.made.append(ns)
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{hosts_file}")
            port = f"v{self.token}{HOSTS[host]}"[:15]
            # made inside the switch namespace, then one end moved into the host: never in the root namespace
            _run(*sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run(*sw, "link", "set", port, "master", "br0")
            _run(*sw, "link", "set", port, "up")
            h = ["ip", "-n", ns]
            _run(*h, "link", "set", "lo", "up")
            _run(*h, "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
            _run(*h, "link", "set", "eth0", "up")
        self.check_routes()

    def port_of(self, host: str) -> str:
        return f"v{self.token}{HOSTS[host]}"[:15]

    def check_routes(self):
        """From every namespace: no default route, and every test address routed over the namespace's own
        eth0 (lo for its own address). Raises RuntimeError naming the namespace and the route otherwise."""
        problems = []
        for ns in self.made:
            default = _run("ip", "-n", ns, "route", "show", "default").stdout.strip()
            if default:
                problems.append(f"{ns} has a default route ({default})")
            default6 = _run("ip", "-6", "-n", ns, "route", "show", "default").stdout.strip()
            if default6:
                problems.append(f"{ns} has an IPv6 default route ({default6})")
        for host in HOSTS:
            ns = self.ns(host)
            for other in HOSTS:
                r = _run("ip", "-n", ns, "route", "get", self.ip(other), check=False)
                words = r.stdout.split()
                dev = words[words.index("dev") + 1] if "dev" in words else None
                want = "lo" if other == host else "eth0"
                if r.returncode != 0 or dev != want or "via" in words:
                    problems.append(f"{ns}: route to {self.ip(other)} is {r.stdout.strip() or r.stderr.strip()!r}")
        sw = _run("ip", "-n", self.switch, "-4", "addr", "show").stdout
        if SUBNET in sw:
            problems.append(f"{self.switch} holds a test address")
        if problems:
            raise RuntimeError("unsafe network, nothing was sent: " + "; ".join(problems))

    # ---- processes -----------------------------------------------------------------------------------
    def spawn(self, host: str, name: str, argv: list, env: dict | None = None, cwd=None) -> Proc:
        """Start ``argv`` inside ``host`` (its network namespace and a UTS namespace named after it)."""
        log = self.root / "logs" / f"{host}-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        script = 'hostname "$0" && exec "$@"'
        cmd = ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "sh", "-c", script, host, *argv]
        with open(log, "ab") as fh:
            p = subprocess.Popen(
                cmd,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        proc = Proc(host, name, p, log)
        self.procs.append(proc)
        return proc

    def run_in(
        self, host: str, argv: list, env: dict | None = None, cwd=None, timeout=900
    ) -> subprocess.CompletedProcess:
        """Run ``argv`` inside ``host`` to its end; returns the completed process (output captured)."""
        cmd = ["ip", "netns", "exec", self.ns(host), "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host]
        p = subprocess.Popen(
            [*cmd, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
        self.procs.append(Proc(host, argv[0], p, Path(os.devnull)))
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def stop(self, proc: Proc, sig=signal.SIGTERM, wait: float = 15):
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, sig)
            try:
                proc.popen.wait(wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.popen.wait(10)

    def pids_in(self, host_ns: str) -> list[int]:
        r = _run("ip", "netns", "pids", host_ns, check=False)
        return [int(x) for x in r.stdout.split()]

    # ---- faults --------------------------------------------------------------------------------------
    def _ipt(self, host: str, *rule, table="filter", add=True):
        op = "-I" if add else "-D"
        _run("ip", "netns", "exec", self.ns(host), "iptables", "-w", "-t", table, op, *rule, check=add)

    @contextlib.contextmanager
    def _fault(self, name: str, undo, max_s: float):
        """Run ``undo`` when the block ends, or after ``max_s`` seconds if it has not ended by then."""
        done = threading.Event()
        lock = threading.Lock()

        def once():
            with lock:
                if not done.is_set():
                    done.set()
                    undo()

        timer = threading.Timer(max_s, once)
        timer.daemon = True
        self.timers.append(timer)
        t0 = time.monotonic()
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            once()
            self.fault_log.append((name, t0, time.monotonic()))

    def _drop_rules(self, peer_ips: list[str] | None):
        if peer_ips is None:
            return [("INPUT", "-i", "eth0", "-j", "DROP"), ("OUTPUT", "-o", "eth0", "-j", "DROP")]
        rules = []
        for ip in peer_ips:
            rules += [("INPUT", "-s", ip, "-j", "DROP"), ("OUTPUT", "-d", ip, "-j", "DROP")]
        return rules

    def _apply(self, placed: list[tuple[str, tuple]]):
        for host, rule in placed:
            self._ipt(host, *rule)

        def undo():
            for host, rule in placed:
                self._ipt(host, *rule, add=False)

        return undo

    def partition(self, a: str, b: str, max_s: float = 120):
        """No packet between hosts ``a`` and ``b`` (both directions, dropped in both namespaces)."""
        placed = [(a, r) for r in self._drop_rules([self.ip(b)])] + [(b, r) for r in self._drop_rules([self.ip(a)])]
        return self._fault(f"partition {a}|{b}", self._apply(placed), max_s)

    def isolate(self, host: str, max_s: float = 120):
        """``host`` reaches nobody and nobody reaches it."""
        placed = [(host, r) for r in self._drop_rules(None)]
        return self._fault(f"isolate {host}", self._apply(placed), max_s)

    def loss(self, host: str, pct: float, max_s: float = 300):
        """Each packet into or out of ``host`` dropped with probability ``pct`` %."""
        p = f"{pct / 100:.4f}"
        stat = ("-m", "statistic", "--mode", "random", "--probability", p, "-j", "DROP")
        placed = [(host, ("INPUT", "-i", "eth0", *stat)), (host, ("OUTPUT", "-o", "eth0", *stat))]
        return self._fault(f"loss {host} {pct}%", self._apply(placed), max_s)

    def latency(self, host: str, ms: float, max_s: float = 300):
        """Every byte leaving ``host`` over TCP waits ``ms`` milliseconds (``tc netem`` is missing on this
        kernel): iptables redirects the host's TCP connections, new ones only, to ``delayer.py`` in the
        same namespace, which forwards them to their original destination and holds each outgoing chunk
        for ``ms``. Connections made before the block are not delayed (restart the daemons in it)."""
        port = 7999
        proxy = self.spawn(
            host,
            "delayer",
            [sys.executable, str(DELAYER), str(port), str(ms), str(int(max_s) + 30)],
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if f":{port}" in _run("ip", "netns", "exec", self.ns(host), "ss", "-ltn").stdout:
                break
            if not proxy.alive():
                raise RuntimeError(f"delayer exited: {proxy.tail()}")
            time.sleep(0.1)
        mark = ("-m", "mark", "!", "--mark", "0x1")
        placed = [
            (host, ("OUTPUT", "-p", "tcp", "-o", "eth0", *mark, "-j", "REDIRECT", "--to-ports", str(port))),
            (host, ("PREROUTING", "-p", "tcp", "-i", "eth0", "-j", "REDIRECT", "--to-ports", str(port))),
        ]
        for h, rule in placed:
            self._ipt(h, *rule, table="nat")

        def undo():
            for h, rule in placed:
                self._ipt(h, *rule, table="nat", add=False)
            self.stop(proxy, wait=5)

        return self._fault(f"latency {host} {ms}ms", undo, max_s)

    @contextlib.contextmanager
    def pause(self, proc: Proc, max_s: float = 120):
        """SIGSTOP every process of ``proc``'s process group (a nanny and its worker), SIGCONT after."""
        os.killpg(proc.pid, signal.SIGSTOP)

        def undo():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)

        with self._fault(f"pause {proc.host}/{proc.name}", undo, max_s):
            yield

    @contextlib.contextmanager
    def pause_pid(self, pid: int, what: str, max_s: float = 120):
        """SIGSTOP one process (a hung worker whose nanny is alive), SIGCONT after."""
        os.kill(pid, signal.SIGSTOP)

        def undo():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

        with self._fault(f"pause {what}", undo, max_s):
            yield

    def reset(self, host: str):
        """Reset every TCP connection of ``host`` to a test address (``ss -K``), once: one ``ss`` kills the
        connections that exist at that moment. Every connection of a host has a test address at its far end (or
        is on ``lo``), accepted ones included, so ``dst`` alone names them all. (This used to be two ``ss``, one
        for ``dst`` and one for ``src``: two resets some 20 ms apart, the second one killing the connections the
        driver's client had just made again, mid-reconnection: docs/reliability.md.)"""
        _run("ip", "netns", "exec", self.ns(host), "ss", "-K", "-t", "dst", f"{SUBNET}.0/24", check=False)

    # ---- teardown ------------------------------------------------------------------------------------
    def teardown(self):
        for t in self.timers:
            t.cancel()
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                self.stop(proc, wait=10)
        for ns in self.made:  # anything else left in a namespace (a worker a nanny restarted)
            for pid in self.pids_in(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(self.pids_in(ns) for ns in self.made):
            time.sleep(0.2)
        for ns in reversed(self.made):
            _run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What teardown should have removed and did not: namespaces, /etc/netns folders, processes."""
        left = []
        names = _run("ip", "netns", "list", check=False).stdout.split()
        left += [f"namespace {n}" for n in names if n.startswith(f"{PREFIX}{self.token}-")]
        left += [f"/etc/netns/{ns}" for ns in self.made if (Path("/etc/netns") / ns).exists()]
        left += [f"process {p.pid} ({p.host}/{p.name})" for p in self.procs if p.alive()]
        links = _run("ip", "-o", "link", "show", check=False).stdout
        left += [f"link {w}" for w in links.split() if w.startswith(f"v{self.token}")]
        return left
