"""The file format of one KV block in the disk tier, and its checks. A file is a header, the
block's token ids, then the payload (the block's K/V bytes over every layer). Nothing that fails a
check is ever returned: a reader gets the payload only when the magic, the format version, the
model fingerprint, the block hash, the prefix digest, the token ids, the payload length and both
checksums (header and payload) all agree with what it asked for."""
from __future__ import annotations

import hashlib
import struct
import zlib
from array import array
from typing import Iterable, Sequence

MAGIC = b"LKKV"
VERSION = 1
DIGEST_BYTES = 16
ROOT_DIGEST = bytes(DIGEST_BYTES)  # the "parent" of the first block of every prompt
# magic, version, fingerprint, block hash, prefix digest, token count, payload bytes, payload crc32
_HEAD = struct.Struct("<4sH16sq16sIQI")
_CRC = struct.Struct("<I")  # crc32 of everything before it (header and token ids)


class BadBlock(Exception):
    """A block file that must not be loaded (and is deleted by the tier)."""


def chain_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """The prefix digest of a block: blake2b over the parent's digest and the block's token ids.
    It names the whole token prefix up to this block, so a hit cannot be a 64-bit hash collision
    of the (fast, non-cryptographic) block hash the routing and the prefix cache key on."""
    return hashlib.blake2b(parent + _tokens(tokens), digest_size=DIGEST_BYTES).digest()


def _tokens(tokens: Sequence[int]) -> bytes:
    return array("q", tokens).tobytes()


def encode_header(fingerprint: bytes, block_hash: int, digest: bytes, tokens: Sequence[int],
                  payload_len: int, payload_crc: int) -> bytes:
    head = _HEAD.pack(MAGIC, VERSION, fingerprint, block_hash, digest, len(tokens), payload_len,
                      payload_crc) + _tokens(tokens)
    return head + _CRC.pack(zlib.crc32(head))


def payload_crc(chunks: Iterable) -> int:
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    return crc


def decode(data: bytes, fingerprint: bytes, block_hash: int, digest: bytes, tokens: Sequence[int],
           payload_len: int) -> memoryview:
    """The payload of a block file read whole, or BadBlock saying what did not verify."""
    if len(data) < _HEAD.size + _CRC.size:
        raise BadBlock("truncated header")
    magic, version, fp, h, d, ntok, plen, pcrc = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise BadBlock("bad magic")
    if version != VERSION:
        raise BadBlock(f"format version {version}")
    end = _HEAD.size + 8 * ntok
    if len(data) < end + _CRC.size:
        raise BadBlock("truncated token ids")
    if _CRC.unpack_from(data, end)[0] != zlib.crc32(memoryview(data)[:end]):
        raise BadBlock("header checksum")
    if fp != fingerprint:
        raise BadBlock("another model's block")
    if h != block_hash or d != digest or data[_HEAD.size:end] != _tokens(tokens):
        raise BadBlock("another prefix's block")
    if plen != payload_len or len(data) != end + _CRC.size + plen:
        raise BadBlock(f"payload of {len(data) - end - _CRC.size} bytes, expected {payload_len}")
    payload = memoryview(data)[end + _CRC.size:]
    if zlib.crc32(payload) != pcrc:
        raise BadBlock("payload checksum")
    return payload
