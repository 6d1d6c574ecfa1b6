"""Standard Webhooks v1 signatures: HMAC-SHA256 over ``{id}.{timestamp}.{body}`` with a ``whsec_`` secret.

Byte-identical to the ``standardwebhooks`` package's ``Webhook.sign`` (the tests verify with it);
written out here because the package mis-signs non-UTC datetimes and we only need these lines.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets as _random

from .secret import Secret

#: Prefix of Standard Webhooks secrets.
SECRET_PREFIX = "whsec_"


def new_secret(nbytes: int = 32) -> Secret:
    """Generate a ``whsec_`` secret (the spec allows 24–64 random bytes).

    Parameters
    ----------
    nbytes:
        Key length in bytes.

    Returns
    -------
    Secret
    """
    return Secret(SECRET_PREFIX + base64.b64encode(_random.token_bytes(nbytes)).decode())


def secret_key(secret: Secret) -> bytes:
    """The HMAC key inside a ``whsec_`` secret."""
    raw = secret.reveal().removeprefix(SECRET_PREFIX)
    return base64.b64decode(raw + "=" * (-len(raw) % 4))


def sign(secret: Secret, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value for one attempt.

    Parameters
    ----------
    secret:
        The endpoint's ``whsec_`` secret.
    msg_id:
        ``webhook-id`` (the same on every re-send).
    timestamp:
        ``webhook-timestamp``: integer Unix seconds of this attempt.
    body:
        The exact request body.

    Returns
    -------
    str
        ``v1,<base64 signature>``.
    """
    mac = hmac.new(secret_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def signed_headers(secret: Secret, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers plus the JSON content type."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }
