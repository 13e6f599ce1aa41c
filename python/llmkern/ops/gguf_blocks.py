"""GGUF block formats decoded to the one form the quantised kernels take: per row and sub-block of
``block`` k values, unsigned codes ``u`` with a scale ``d`` and offset ``m`` (``w = d * u + m``).

Supported: Q4_0, Q4_1, Q8_0 (blocks of 32), Q4_K, Q5_K (super-blocks of 256, sub-blocks of 32 with
6-bit scales and mins) and Q6_K (super-blocks of 256, sub-blocks of 16 with int8 scales). The byte
layouts are ggml's (ggml-common.h); ``gguf.quants.dequantize`` is the independent decoder the tests
compare with. Vectorised numpy: a tensor at a time, at load."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

# ggml type ids (gguf.GGMLQuantizationType) -> (name, elements per block, bytes per block)
FORMATS = {2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144),
           13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210)}
TYPE_IDS = {name: t for t, (name, _, _) in FORMATS.items()}
# what each format decodes to: (bits per code, k values per scale and offset)
CODES = {"Q4_0": (4, 32), "Q4_1": (4, 32), "Q8_0": (8, 32), "Q4_K": (4, 32), "Q5_K": (8, 32), "Q6_K": (8, 16)}


class Decoded(NamedTuple):
    codes: np.ndarray   # uint8 [rows, K]
    scale: np.ndarray   # float32 [rows, K / block]
    offset: np.ndarray  # float32 [rows, K / block]
    bits: int           # bits the codes need: 4 or 8
    block: int          # k values per (scale, offset)


def type_id(qtype) -> int:
    """A ggml type given as its id, its name ("Q4_K") or a gguf.GGMLQuantizationType."""
    if isinstance(qtype, str):
        if qtype.upper() not in TYPE_IDS:
            raise ValueError(f"qtype: expected one of {', '.join(TYPE_IDS)}, got {qtype!r}")
        return TYPE_IDS[qtype.upper()]
    t = int(qtype)
    if t not in FORMATS:
        raise ValueError(f"qtype: ggml type {t} has no quantised kernel (supported: {', '.join(TYPE_IDS)})")
    return t


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 little-endian fp16 -> float32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] codes: low nibbles are elements 0-15, high nibbles 16-31."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _k4_scales(s: np.ndarray):
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4)."""
    sc = np.empty(s.shape[:-1] + (8,), np.uint8)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def decode(raw: np.ndarray, qtype, rows: int, cols: int) -> Decoded:
    """``raw``: the tensor's bytes (any shape, rows * cols / block_elems * block_bytes of them)."""
    t = type_id(qtype)
    name, qk, nbytes = FORMATS[t]
    if cols % qk:
        raise ValueError(f"in_features: {name} needs a multiple of {qk}, got {cols}")
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size != rows * (cols // qk) * nbytes:
        raise ValueError(f"weight: {name} [{rows}, {cols}] takes {rows * (cols // qk) * nbytes} bytes, got {raw.size}")
    b = raw.reshape(rows, cols // qk, nbytes)
    if name in ("Q4_0", "Q4_1", "Q8_0"):
        d = _f16(b[..., 0:2])
        if name == "Q8_0":
            codes, m = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8), -128.0 * d
        elif name == "Q4_0":
            codes, m = _nibbles(b[..., 2:]), -8.0 * d
        else:
            codes, m = _nibbles(b[..., 4:]), _f16(b[..., 2:4])
        return Decoded(codes.reshape(rows, cols), d, m.astype(np.float32), *CODES[name])
    if name in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
        sc, mn = _k4_scales(b[..., 4:16])
        qs = b[..., -128:].reshape(rows, -1, 4, 32)  # 4 chunks of 32 bytes: sub-blocks 2c (low), 2c + 1 (high)
        codes = np.stack([qs & 0xF, qs >> 4], axis=3)  # [rows, nsb, 4, 2, 32]
        if name == "Q5_K":
            qh = b[..., 16:48][:, :, None, None, :]  # bit j of qh[l]: sub-block j's element l
            shift = np.arange(8, dtype=np.uint8).reshape(1, 1, 4, 2, 1)
            codes = codes | (((qh >> shift) & 1) << 4)
        return Decoded(codes.reshape(rows, cols), (d * sc).reshape(rows, -1), (-dmin * mn).reshape(rows, -1),
                       *CODES[name])
    # Q6_K: ql[128] qh[64] scales[16] (int8) d (fp16); two halves of 128 elements
    ql = b[..., 0:128].reshape(rows, -1, 2, 2, 32)   # [half][ql 0-31 | 32-63]
    qh = b[..., 128:192].reshape(rows, -1, 2, 1, 32)
    lo = np.stack([ql[..., 0, :] & 0xF, ql[..., 1, :] & 0xF, ql[..., 0, :] >> 4, ql[..., 1, :] >> 4], axis=3)
    hi = (qh >> np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 1, 4, 1)) & 3
    codes = (lo | (hi << 4)).reshape(rows, cols)  # quarter q of half n: elements 128n + 32q + l
    sc = b[..., 192:208].view(np.int8).astype(np.float32)  # sub-block s of 16 elements: scales[s]
    ds = _f16(b[..., 208:210])[..., None] * sc
    return Decoded(codes, ds.reshape(rows, -1), (-32.0 * ds).reshape(rows, -1), *CODES[name])


def dequantize(dec: Decoded) -> np.ndarray:
    """float64 [rows, K] of a decoded tensor (the values the kernels multiply, before fp16 rounding)."""
    rows, cols = dec.codes.shape
    u = dec.codes.reshape(rows, -1, dec.block).astype(np.float64)
    return (u * dec.scale[..., None] + dec.offset[..., None]).reshape(rows, cols)
