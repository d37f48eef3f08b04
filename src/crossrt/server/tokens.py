"""Credentials the operator issues: the shared ``--token`` and the per-user tokens of a
``--tokens`` file, and the ``authorization: Bearer <token>`` value that carries one.

A tokens file maps each token to a user and a role::

    [[tokens]]
    token = "0f3c...e9"        # 16 characters or more; a random one: openssl rand -hex 32
    user = "alice"             # a local account: shared memory opens as alice's
    role = "user"              # or "operator" (repository, lifecycle); default "user"

It holds secrets, so the daemon refuses to start when the file is not a regular file owned by
the daemon's own user, or when its group or others have any permission on it (``chmod 600``).
Tokens are kept as SHA-256 digests and looked up by digest: a comparison's time says nothing
about a token's bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import stat
import tomllib
from dataclasses import dataclass

import grpc

from ..errors import InvalidOptionError
from .status import ServiceError

MIN_LENGTH = 16
ROLES = ("user", "operator")

UNAUTHENTICATED = (
    "this daemon needs a token: send the metadata 'authorization: Bearer <token>' "
    "(tritonclient: headers={'authorization': 'Bearer <token>'}; crossrt.connect: token=)"
)


@dataclass(frozen=True)
class Grant:
    """Who a per-user token says its bearer is.

    Attributes:
        user: the name the tokens file gives.
        uid: that name's local account, ``None`` when there is none (a name only: no
            shared memory).
        gid: its primary group.
        groups: its groups (primary and supplementary), for file permissions.
        operator: the token carries the operator role.
    """

    user: str
    uid: int | None = None
    gid: int | None = None
    groups: frozenset[int] = frozenset()
    operator: bool = False


def load_tokens(path: str) -> dict[bytes, Grant]:
    """The tokens file at ``path``: SHA-256 digest of each token -> its grant.

    Raises:
        InvalidOptionError: the file cannot be read, is readable by others or owned by
            another user, or an entry is malformed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidOptionError(f"cannot read tokens file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or mode & 0o077:
            raise InvalidOptionError(
                f"tokens file {path} (owner {st.st_uid}, mode {mode:04o}) holds secrets: it must "
                f"be a regular file of the daemon's user ({os.geteuid()}) that no one else may "
                f"read or write; chown {os.geteuid()} {path} && chmod 600 {path}"
            )
        try:
            doc = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidOptionError(f"tokens file {path} is not valid TOML: {exc}") from None
    entries = doc.get("tokens", [])
    unknown = sorted(set(doc) - {"tokens"})
    if unknown or not isinstance(entries, list):
        raise InvalidOptionError(
            f"tokens file {path}: give [[tokens]] tables (token, user, role), not {unknown}"
        )
    found: dict[bytes, Grant] = {}
    for number, entry in enumerate(entries, 1):
        where = f"tokens file {path}, entry {number}"
        if not isinstance(entry, dict) or set(entry) - {"token", "user", "role"}:
            raise InvalidOptionError(f"{where}: give token, user and role (user or operator)")
        token, user, role = entry.get("token"), entry.get("user"), entry.get("role", "user")
        if not isinstance(token, str) or len(token) < MIN_LENGTH or token != token.strip():
            raise InvalidOptionError(
                f"{where}: a token is a string of {MIN_LENGTH} characters or more, without "
                "spaces around it (openssl rand -hex 32 makes one)"
            )
        if not isinstance(user, str) or not user:
            raise InvalidOptionError(f'{where}: name the token\'s user (user = "alice")')
        if role not in ROLES:
            raise InvalidOptionError(f"{where}: role {role!r}: give 'user' or 'operator'")
        digest = hashlib.sha256(token.encode()).digest()
        if digest in found:
            raise InvalidOptionError(f"{where}: the same token is given twice")
        found[digest] = _grant(user, role == "operator")
    return found


def _grant(user: str, operator: bool) -> Grant:
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        return Grant(user, operator=operator)
    groups = frozenset(os.getgrouplist(user, account.pw_gid))
    return Grant(user, account.pw_uid, account.pw_gid, groups, operator)


class Credentials:
    """The daemon's tokens: the shared one (``token``: every call must carry a token when it
    is set) and the per-user ones (``grants``, from :func:`load_tokens`)."""

    def __init__(self, token: str | None = None, grants: dict[bytes, Grant] | None = None) -> None:
        self._shared = token.encode() if token else None
        self._grants = grants or {}

    @property
    def required(self) -> bool:
        """Whether a call without a token is refused (a shared token is set)."""
        return self._shared is not None

    def grant(self, authorization: str | bytes | None) -> Grant | None:
        """Who an ``authorization`` value (``Bearer <token>``; ``None``: none sent) says its
        bearer is: a per-user token's grant, ``None`` for the shared token or no token.

        Raises:
            ServiceError: UNAUTHENTICATED, for a value without ``Bearer``, a token not issued,
                or none where the shared token is required.
        """
        if not authorization:
            if self._shared is not None:
                raise ServiceError(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED)
            return None
        value = authorization.encode() if isinstance(authorization, str) else bytes(authorization)
        scheme, _, token = value.partition(b" ")
        if scheme.lower() != b"bearer" or not token:
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED,
                "the authorization value is 'Bearer <token>'; " + UNAUTHENTICATED,
            )
        if self._shared is not None and hmac.compare_digest(token, self._shared):
            return None
        grant = self._grants.get(hashlib.sha256(token).digest())
        if grant is None:
            raise ServiceError(
                grpc.StatusCode.UNAUTHENTICATED,
                "the token sent is not one this daemon issued; " + UNAUTHENTICATED,
            )
        return grant
