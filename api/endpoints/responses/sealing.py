"""A reasoning item's thinking sealed for the client to keep.

A client asks for it with `include: ["reasoning.encrypted_content"]`, as Codex does with
`store: false`. It sends the item back with the next turn's input. The seal is opened into
that turn's earlier thinking.

A seal is `ts1.<secret id>.<base64url(nonce | AES-256-GCM ciphertext and tag)>`. Its
associated data is the version, the secret's id and the owner of the key that asked for it.
The owner is the SHA-256 of the API key (api/http/auth.py). So only this deployment opens a
seal, and only for the same key. One forged, changed, cut or sealed for another key does not
open (a 400). The nonce is an HMAC of the associated data and the text (a synthetic IV). So
the same thinking sealed twice is the same seal. A response's events then stay the same on
every replay and on every replica. Two different texts never share a nonce.

The secrets (REASONING_SEAL_SECRETS) are shared by every API replica. The first seals, and
every one opens. A rotation puts the new one first. It keeps the previous one after it for as
long as its seals should open. Unset, the first API process that needs one makes a random
secret. It keeps it in Redis (`keys.REASONING_SEAL`), where every replica reads the same one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio as aredis
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from contract import keys
from contract.entries import as_text

VERSION = "ts1"
NONCE = 12


@dataclass(frozen=True)
class _Key:
    # 8 hex digits, from the secret: which secret sealed
    id: str
    aead: AESGCM
    nonce_key: bytes


def _key(secret: str) -> _Key:
    raw = HKDF(hashes.SHA256(), 64, salt=None, info=b"tokenspool reasoning seal v1").derive(secret.encode())
    kid = hashlib.sha256(b"id\n" + raw).hexdigest()[:8]
    return _Key(kid, AESGCM(raw[:32]), raw[32:])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Seals:
    """Seal with the first secret, open with any of them."""

    def __init__(self, secret_list: Sequence[str]) -> None:
        if not secret_list:
            raise ValueError("at least one secret")
        self._keys = [_key(s) for s in secret_list]
        # the first wins a clash
        self._by_id = {k.id: k for k in reversed(self._keys)}

    def seal(self, owner: str, text: str) -> str:
        key = self._keys[0]
        ad = f"{VERSION}.{key.id}.{owner}".encode()
        plain = json.dumps({"reasoning": text}, ensure_ascii=False).encode()
        nonce = hmac.new(key.nonce_key, ad + b"\n" + plain, hashlib.sha256).digest()[:NONCE]
        return f"{VERSION}.{key.id}.{_b64(nonce + key.aead.encrypt(nonce, plain, ad))}"

    def open(self, owner: str, sealed: str) -> str | None:
        """The thinking sealed for `owner`. None for anything else."""
        version, _, rest = sealed.partition(".")
        kid, _, body = rest.partition(".")
        key = self._by_id.get(kid)
        if version != VERSION or key is None:
            return None
        try:
            blob = _unb64(body)
            plain = key.aead.decrypt(blob[:NONCE], blob[NONCE:], f"{VERSION}.{kid}.{owner}".encode())
            text = json.loads(plain)["reasoning"]
        except (InvalidTag, ValueError, binascii.Error, KeyError, TypeError):
            return None
        return text if isinstance(text, str) else None


async def kept_secret(client: aredis.Redis) -> str:
    """The secret kept in Redis. Whichever process asks first makes it (SET NX). It is the same for
    every replica after."""
    await client.set(keys.REASONING_SEAL, secrets.token_urlsafe(32), nx=True)
    kept = await client.get(keys.REASONING_SEAL)
    # deleted between the two: make it again
    if kept is None:
        return await kept_secret(client)
    return as_text(kept)
