"""A network namespace of the test's own, as a Pod has one: a veth pair whose far end (`eth0`
in the namespace) has an address the API server can dial as a Service endpoint (the API
server refuses loopback endpoints), and relays that make chosen ports of this machine's
127.0.0.1 answer on the namespace's 127.0.0.1 too (the API server, the test registry), so a
process inside reaches them by the same names as every other test. Nothing else of this
machine's network is reachable from inside: the namespace has no route but its /30.

Everything is removed at the end, whatever happens (SIGINT too): the relays closed, the veth
pair and the namespace deleted. Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for setns(2))."""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import random
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# 198.18.0.0/15: set aside for benchmarking (RFC 2544), never this machine's network, and not a
# loopback, link-local or unspecified address, which the API server refuses as an endpoint
# (ValidateEndpointIP in pkg/apis/core/validation/validation.go, k8s.io/kubernetes v1.33.13).
SPACE = ipaddress.ip_network("198.18.0.0/15")
CLONE_NEWNET = 0x40000000  # <sched.h>
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _used() -> set[ipaddress.IPv4Network]:
    """The /30s of SPACE that an address of this machine's already falls in (another run's)."""
    out = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    nets = set()
    for word in out.split():
        with contextlib.suppress(ValueError):
            iface = ipaddress.ip_interface(word)
            if iface.ip in SPACE:
                nets.add(ipaddress.ip_network(f"{iface.ip}/30", strict=False))
    return nets


@dataclass
class Netns:
    name: str
    host: str  # this machine's end of the veth pair
    address: str  # the namespace's own address (its eth0), what a Service endpoint names
    _relays: list[socket.socket] = field(default_factory=list)
    _conns: list[socket.socket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def argv(self, *command: str) -> list[str]:
        """`command` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def relay(self, port: int) -> None:
        """This machine's 127.0.0.1:PORT answering on the namespace's 127.0.0.1:PORT: each
        connection made inside is carried, byte for byte, to the one outside."""
        listener = self._listening(port)
        self._relays.append(listener)
        threading.Thread(target=self._accept, args=(listener, port), daemon=True).start()

    def _listening(self, port: int) -> socket.socket:
        """A socket listening inside the namespace, made by a thread that entered it (setns(2)
        moves only the calling thread; a socket stays in the namespace it was made in)."""
        made: dict[str, socket.socket | BaseException] = {}

        def inside() -> None:
            try:
                fd = os.open(Path("/run/netns") / self.name, os.O_RDONLY)
                try:
                    if _libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into {self.name}")
                finally:
                    os.close(fd)
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(128)
                made["socket"] = s
            except BaseException as e:  # raised again in the caller's thread
                made["socket"] = e

        t = threading.Thread(target=inside)  # it ends inside the namespace, and is gone
        t.start()
        t.join()
        got = made["socket"]
        if isinstance(got, BaseException):
            raise got
        return got

    def _accept(self, listener: socket.socket, port: int) -> None:
        while True:
            try:
                inner, _ = listener.accept()
            except OSError:
                return  # closed: the namespace is being removed
            try:
                outer = socket.create_connection(("127.0.0.1", port), timeout=10)
            except OSError:
                inner.close()
                continue
            outer.settimeout(None)
            with self._lock:
                self._conns += [inner, outer]
            for a, b in ((inner, outer), (outer, inner)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            for s in self._relays + self._conns:
                with contextlib.suppress(OSError):
                    s.close()
            self._relays.clear()
            self._conns.clear()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)  # the other direction may still be talking


@contextlib.contextmanager
def owned(prefix: str) -> Iterator[Netns]:
    """A fresh namespace named PREFIX-RANDOM, its veth pair up and addressed in a /30 of SPACE
    that no other run holds; removed at the end."""
    if os.geteuid() != 0:
        raise RuntimeError("a network namespace of the test's own needs root")
    token = secrets.token_hex(3)
    name, veth = f"{prefix}-{token}", f"ig{token}"  # an interface name has at most 15 characters
    free = random.sample(range(SPACE.num_addresses // 4), 64)
    taken = _used()
    net = next(n for n in (ipaddress.ip_network((int(SPACE[0]) + 4 * i, 30)) for i in free) if n not in taken)
    host, inner = (str(a) for a in list(net.hosts())[:2])
    ns = Netns(name, host, inner)
    _ip("netns", "add", name)
    try:
        # the far end is made inside the namespace, as eth0: no name of this machine's is taken
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
        _ip("addr", "add", f"{host}/30", "dev", veth)
        _ip("link", "set", veth, "up")
        for args in (
            ("addr", "add", f"{inner}/30", "dev", "eth0"),
            ("link", "set", "eth0", "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("-n", name, *args)
        yield ns
    finally:
        ns.close()
        with contextlib.suppress(RuntimeError):
            _ip("link", "del", veth)  # both ends
        _ip("netns", "del", name)
