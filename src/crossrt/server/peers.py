"""Who is calling: the operating-system user and process behind a gRPC call.

gRPC tells a servicer only ``context.peer()``. Over the daemon's Unix socket that string
names the relay connection (:mod:`.relay`) whose credentials the kernel gave at accept
(``SO_PEERCRED``); over loopback TCP it is the client's address and port, which the
kernel's socket table (``/proc/net/tcp``, ``tcp6``) maps to the socket's owner and inode,
and ``/proc/*/fd`` to the process holding it. A peer elsewhere on the network has neither.
"""

from __future__ import annotations

import ipaddress
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Peer:
    """A caller.

    Attributes:
        address: what gRPC calls it (``context.peer()``).
        local: on this host (Unix socket, loopback TCP).
        uid: its user, ``None`` when unknown.
        gid: its primary group, ``None`` when unknown.
        pid: its process, 0 when unknown (another user's process over TCP, for a daemon
            that is not root).
    """

    address: str
    local: bool
    uid: int | None = None
    gid: int | None = None
    pid: int = 0

    def groups(self) -> frozenset[int]:
        """Its groups: the primary one and, when its process is known, the supplementary
        ones (``/proc/<pid>/status``)."""
        found = {self.gid} if self.gid is not None else set()
        if self.pid:
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("Groups:"):
                            found.update(int(g) for g in line.split()[1:])
            except (OSError, ValueError):
                pass
        return frozenset(found)


def identify(address: str, relayed: Mapping[str, Peer]) -> Peer:
    """The peer behind ``context.peer()``; ``relayed`` maps relay connection names to the
    credentials read at accept."""
    kind, _, rest = address.partition(":")
    if kind == "unix-abstract":
        known = relayed.get(rest)
        return known if known is not None else Peer(address, local=True)
    if kind == "unix":
        # The daemon's inner socket, in a folder only the daemon's user may enter.
        return Peer(address, local=True, uid=os.geteuid(), gid=os.getegid())
    if kind in ("ipv4", "ipv6"):
        host, _, port_text = rest.rpartition(":")
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
            port = int(port_text)
        except ValueError:
            return Peer(address, local=False)
        mapped = getattr(ip, "ipv4_mapped", None)
        if not (ip.is_loopback or (mapped is not None and mapped.is_loopback)):
            return Peer(address, local=False)
        owner = tcp_owner(ip, port)
        if owner is None:
            return Peer(address, local=True)
        uid, inode = owner
        return Peer(address, local=True, uid=uid, pid=socket_process(inode))
    return Peer(address, local=False)


def _hex_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """An address as ``/proc/net/tcp*`` writes it: 32-bit words in host byte order."""
    raw = ip.packed
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words)


def tcp_owner(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, proc: str = "/proc/net"
) -> tuple[int, int] | None:
    """``(uid, inode)`` of the local TCP socket bound to ``ip:port``, from the kernel's
    socket table; ``None`` when there is none."""
    candidates = [(ip, "tcp6" if ip.version == 6 else "tcp")]
    if ip.version == 4:  # a dual-stack socket shows it as ::ffff:a.b.c.d
        candidates.append((ipaddress.IPv6Address(f"::ffff:{ip}"), "tcp6"))
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        candidates.append((mapped, "tcp"))
    for address, table in candidates:
        wanted = f"{_hex_address(address)}:{port:04X}"
        try:
            with open(os.path.join(proc, table)) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[1] == wanted:
                        return int(fields[7]), int(fields[9])
        except OSError:
            continue
    return None


def socket_process(inode: int, proc: str = "/proc") -> int:
    """The process holding socket ``inode`` open, 0 when none can be seen (another user's,
    for a daemon that is not root)."""
    target = f"socket:[{inode}]"
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        folder = os.path.join(proc, pid, "fd")
        try:
            fds = os.listdir(folder)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(folder, fd)) == target:
                    return int(pid)
            except OSError:
                continue
    return 0
