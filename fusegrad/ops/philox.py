"""Philox4x32-10, the counter-based generator behind fusegrad's random numbers.

Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011). A counter-based
generator maps (key, counter) to random bits with no sequential state, so element ``i`` of a
random tensor depends only on (seed, offset + i): eager code, the IR interpreter and generated
kernels produce the same numbers, and a kernel can compute any element on any thread.

Layout: element ``i`` of a request at ``offset`` takes word ``i % 4`` of the block whose
128-bit counter is ``offset + i // 4``; a request of ``n`` numbers consumes ``ceil(n / 4)``
counters.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
_MASK = np.uint64(0xFFFFFFFF)


def philox4x32(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Hash counters (uint64 array of shape (n, 4) holding 32-bit words) under a 64-bit key
    split into two 32-bit words. Returns uint32 array (n, 4)."""
    c0, c1, c2, c3 = (counters[:, i].astype(np.uint64) for i in range(4))
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    m0, m1 = np.uint64(M0), np.uint64(M1)
    for r in range(ROUNDS):
        p0 = c0 * m0
        p1 = c2 * m1
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK
        c0, c1, c2, c3 = (hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0)
        if r != ROUNDS - 1:
            k0 = (k0 + W0) & 0xFFFFFFFF
            k1 = (k1 + W1) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=1).astype(np.uint32)


def random_bits(seed: int, offset: int, n: int) -> np.ndarray:
    """``n`` uint32 words for elements ``0..n-1`` of a request at ``offset``."""
    blocks = (n + 3) // 4
    ctr = np.arange(blocks, dtype=np.uint64) + np.uint64(offset & 0xFFFFFFFFFFFFFFFF)
    counters = np.zeros((blocks, 4), dtype=np.uint64)
    counters[:, 0] = ctr & _MASK
    counters[:, 1] = ctr >> np.uint64(32)
    words = philox4x32(counters, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    return words.reshape(-1)[:n]


def counters_used(n: int) -> int:
    """How far a request of ``n`` numbers advances the offset."""
    return (n + 3) // 4


def words_per_number(dtype) -> int:
    """32-bit words one number of ``dtype`` takes: 2 for float64 and int64, else 1."""
    return 2 if np.dtype(dtype).itemsize == 8 else 1


def uniform(seed: int, offset: int, shape, dtype=np.float32) -> np.ndarray:
    """Numbers of ``dtype`` in [0, 1): as many random bits as its significand has digits (as
    torch draws them), scaled by 2**-digits, so that every value is exact and below 1 (a
    float32 uniform rounded to float16 reaches 1.0, whose log in Box-Muller is an infinite
    normal). float64 takes two words per number. ``int64``: non-negative 63-bit integers
    from two words (``randint`` reduces them to its range)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if words_per_number(dtype) == 2:
        w = random_bits(seed, offset, 2 * n).astype(np.uint64).reshape(n, 2)
        bits = (w[:, 0] << np.uint64(32)) | w[:, 1]
        if dtype == np.int64:
            return (bits >> np.uint64(1)).astype(np.int64).reshape(shape)
        return ((bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53).reshape(shape)
    digits = ml_dtypes.finfo(dtype).nmant + 1        # float32 24, float16 11, bfloat16 8
    bits = random_bits(seed, offset, n) >> np.uint32(32 - digits)
    return (bits.astype(np.float32) * np.float32(2.0 ** -digits)).astype(dtype).reshape(shape)
