"""The online mode's per-job secret: who may speak to the coordinator, and whom a rank believes.

The coordinator and every rank hold the same secret (at least 32 hex digits): ranks read it from
``NCCLRL_ONLINE_SECRET`` or from the file ``NCCLRL_ONLINE_SECRET_FILE`` names, which only its
owner may read. Each connection opens with a challenge both ways, HMAC-SHA256 over both sides'
nonces, and every later line is sealed with a key drawn from the secret and both nonces, and its
sequence number (docs/design/online.md, "Threat model"); the secret itself never crosses the wire
and is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

from ncclrl.costmodel.errors import ConfigError, JobError

#: hex digits a secret has at least (128 bits) and at most
MIN_HEX, MAX_HEX = 32, 256
_HEX = re.compile(r"[0-9a-fA-F]+")


def fresh() -> str:
    """A new secret: 64 hex digits (256 bits)."""
    return secrets.token_hex(32)


def proof(secret: str, role: str, first: str, second: str) -> str:
    """``role``'s proof of holding ``secret`` over the two nonces, hex HMAC-SHA256 of
    ``"ncclrl-{role} {first} {second}"`` (the plugin computes the same)."""
    return hmac.new(secret.encode(), f"ncclrl-{role} {first} {second}".encode(), hashlib.sha256).hexdigest()


def session_key(secret: str, nonce_r: str, nonce_c: str) -> str:
    """The connection's key, from the secret and both nonces: every line after the handshake is sealed with it."""
    return proof(secret, "session", nonce_r, nonce_c)


def line_mac(key: str, direction: str, seq: int, payload: str) -> str:
    """A line's seal: the first 32 hex digits of HMAC-SHA256(key, ``{direction}{seq} {payload}``), direction
    ``r`` (rank to coordinator) or ``c``; the plugin computes the same."""
    return hmac.new(key.encode(), f"{direction}{seq} {payload}".encode(), hashlib.sha256).hexdigest()[:32]


def valid(text: str) -> bool:
    return MIN_HEX <= len(text) <= MAX_HEX and bool(_HEX.fullmatch(text))


def load_or_create(path: str) -> tuple[str, Path]:
    """The secret of the file ``path`` (created, mode 0600, with a fresh secret when it does not exist,
    its missing folders mode 0700; empty: a fresh file in a new private temporary folder). A file
    others may read, or one not of this user, is refused: a :class:`ConfigError` on ``secret_file``; one
    that cannot be created or read, an operational failure (:class:`JobError`)."""
    if not path:
        folder = Path(tempfile.mkdtemp(prefix="ncclrl-coordinator-"))  # mode 0700
        p = folder / "secret"
    else:
        p = Path(path).expanduser()
        if not p.parent.exists():  # a folder of its own, only its owner may enter
            try:
                p.parent.mkdir(mode=0o700, parents=True)
            except OSError as e:
                raise JobError("secret_file", f"cannot create {p.parent} ({e.strerror})") from None
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return _read(p), p
    except OSError as e:
        raise JobError("secret_file", f"cannot create {p} ({e.strerror})") from None
    text = fresh()
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return text, p


def _read(p: Path) -> str:
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise JobError("secret_file", f"cannot read {p} ({e.strerror})") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ConfigError("secret_file", f"{p} must be a regular file of this user that only they can read "
                              "(chmod 600)")
        text = f.read(MAX_HEX + 2).strip()
    if not valid(text):
        raise ConfigError("secret_file", f"{p} must hold {MIN_HEX} to {MAX_HEX} hex digits")
    return text
