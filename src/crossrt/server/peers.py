"""Who is calling: the user behind a call, from the kernel or from a credential, never from a
table lookup.

gRPC tells a servicer only ``context.peer()``. Over the daemon's Unix socket that string
names the relay connection (:mod:`.relay`) whose credentials the kernel gave at accept
(``SO_PEERCRED``): that user, and the operator when it is root or the daemon's own user. On
the direct socket, gRPC's own (:mod:`.tickets`), the address a client reports is its own
choice and nothing is believed of it: every call there carries a ticket, which its gate has
checked (a call without one never gets here), and is the ticket's holder, named
``ticket:<n>`` after the ticket's connection to the main socket, whose credentials the
kernel gave at accept; a ticket that ended since is refused, not passed over. On a private
socket (:mod:`.private_sockets`), which only one user may open, every call is the caller of
the connection that asked for it, ``private:<n>``, whatever its address or metadata. Over
TCP (and HTTP) a client is anonymous unless it sends a token of the operator's tokens file
(:mod:`.tokens`): then it is that token's user, with that token's role. Nothing is inferred
from the client's address: the kernel's socket tables (``/proc/net/tcp``) name whoever holds
a port, and a port can be made to look like anyone's (a TIME_WAIT row shows uid 0).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import grpc

from .status import ServiceError
from .tokens import Grant


@dataclass(frozen=True)
class Peer:
    """A caller.

    Attributes:
        address: what gRPC calls it (``context.peer()``).
        local: on this host (Unix socket, loopback TCP).
        uid: its user, ``None`` when unknown (anonymous, or a token's user with no local
            account).
        gid: its primary group, ``None`` when unknown.
        pid: its process, 0 when unknown (every TCP client).
        user: the name a token gave it, ``None`` for a socket peer or an anonymous one.
        operator: it may drive the repository and every model's lifecycle.
        known_groups: groups known without a process to read them from (a token's user's).
    """

    address: str
    local: bool
    uid: int | None = None
    gid: int | None = None
    pid: int = 0
    user: str | None = None
    operator: bool = False
    known_groups: frozenset[int] = field(default_factory=frozenset)

    @property
    def principal(self) -> str | None:
        """Who owns what this peer creates: its local user, else its token's user name;
        ``None`` for an anonymous peer."""
        if self.uid is not None:
            return f"uid {self.uid}"
        return f"user {self.user}" if self.user else None

    def groups(self) -> frozenset[int]:
        """Its groups: the primary one, those its token's account has, and, when its process
        is known, the supplementary ones (``/proc/<pid>/status``)."""
        found = set(self.known_groups)
        if self.gid is not None:
            found.add(self.gid)
        if self.pid:
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("Groups:"):
                            found.update(int(g) for g in line.split()[1:])
            except (OSError, ValueError):
                pass
        return frozenset(found)

    def granted(self, grant: Grant | None) -> Peer:
        """This peer with what a token says: over a socket the kernel's user stays and an
        operator token adds the role; over TCP the token's user is the peer's."""
        if grant is None:
            return self
        kernels = ("unix", "lane:", "ticket:", "private:")  # the kernel said who
        if self.uid is not None and self.address.startswith(kernels):
            return replace(self, operator=self.operator or grant.operator)
        return replace(
            self,
            uid=grant.uid,
            gid=grant.gid,
            user=grant.user,
            operator=grant.operator,
            known_groups=grant.groups,
        )


def is_operator_uid(uid: int) -> bool:
    """Root, or the daemon's own user: the operator over the Unix socket."""
    return uid == 0 or uid == os.geteuid()


def socket_peer(address: str, uid: int, gid: int, pid: int) -> Peer:
    """A peer the kernel named at accept (``SO_PEERCRED``)."""
    return Peer(address, True, uid, gid, pid, operator=is_operator_uid(uid))


def identify(
    address: str,
    relayed: Mapping[str, Peer],
    grant: Grant | None = None,
    bearer: Peer | None = None,
) -> Peer:
    """The peer behind ``context.peer()``; ``relayed`` maps relay connection names to the
    credentials read at accept; ``grant`` is what the call's token says; ``bearer`` the
    holder of the live ticket the call carries (:meth:`.tickets.Tickets.bearer`), which a
    call over a Unix socket is, whatever its address."""
    kind, _, rest = address.partition(":")
    if bearer is not None and kind in ("unix", "unix-abstract", "private"):
        return bearer.granted(grant)
    if kind == "unix-abstract":
        known = relayed.get(rest)
        return (known if known is not None else Peer(address, local=True)).granted(grant)
    if kind == "unix":
        # The daemon's inner socket, in a folder only the daemon's user may enter (the direct
        # socket's calls are all ``ticket:``: see the module's docstring).
        return socket_peer(address, os.geteuid(), os.getegid(), 0).granted(grant)
    if kind in ("ipv4", "ipv6"):
        host = rest.rpartition(":")[0].strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return Peer(address, local=False).granted(grant)
        mapped = getattr(ip, "ipv4_mapped", None)
        local = ip.is_loopback or (mapped is not None and mapped.is_loopback)
        return Peer(address, local=local).granted(grant)
    return Peer(address, local=False).granted(grant)


def need_operator(peer: Peer, what: str) -> None:
    """Refuse ``what`` to a peer without the operator role.

    Raises:
        ServiceError: UNAUTHENTICATED for an anonymous peer, PERMISSION_DENIED for another.
    """
    if peer.operator:
        return
    how = (
        f"call over the daemon's Unix socket as root or its user (uid {os.geteuid()}), or "
        'send an operator token (a role = "operator" entry of the daemon\'s tokens file)'
    )
    if peer.principal is None:
        raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, f"{what} needs the operator: {how}")
    raise ServiceError(
        grpc.StatusCode.PERMISSION_DENIED,
        f"{what} needs the operator, and {peer.principal} is not: {how}",
    )


def need_owner(peer: Peer, owner: str | None, what: str) -> None:
    """Refuse ``what`` to a peer that is neither the operator nor ``owner`` (a principal;
    ``None``: the operator's own, such as a repository model)."""
    if peer.operator or (owner is not None and peer.principal == owner):
        return
    if owner is None:
        need_operator(peer, what)
    raise ServiceError(
        grpc.StatusCode.PERMISSION_DENIED,
        f"{what}: it belongs to another user; only its owner or the operator may do that",
    )


def need_principal(peer: Peer, what: str) -> str:
    """The peer's principal, or a refusal of ``what`` to an anonymous peer."""
    principal = peer.principal
    if principal is None:
        raise ServiceError(
            grpc.StatusCode.UNAUTHENTICATED,
            f"{what} needs to know who you are: connect through the daemon's Unix socket, or "
            "send a token of the daemon's tokens file (authorization: Bearer <token>)",
        )
    return principal
