"""CRC32C of a concatenation from the CRCs of its parts: ``crc(a + b)`` from ``crc(a)``, ``crc(b)`` and ``len(b)``.

Why: a transactional append streams its records in chunks, and the batch CRC covers the header's tail
*before* the records — but that tail (record count, last offset delta, largest timestamp, registers) is known
only at commit. The broker CRCs each chunk as it arrives (in C, while the bytes are hot), then combines
``crc(header tail)`` with ``crc(records)`` at commit, instead of reading a 64 MiB spool back to checksum it.

The arithmetic is CRC's own: appending ``n`` bytes to a message multiplies its CRC register by ``x^(8n)``
modulo the polynomial. With the pre- and post-conditioning of the standard CRC (register starts at all ones,
result inverted), the conditioning terms cancel, leaving ``crc(a + b) = crc(a) · x^(8·len b) ⊕ crc(b)``. The
powers ``x^(2^k)`` are tabulated once, so a combine costs about ``log2(len b)`` carry-less multiplications of
32 bits each (tens of microseconds in Python), whatever the length.

Polynomials are in the reflected bit order the CRC uses: bit 31 is ``x^0``.
"""

from __future__ import annotations

POLY = 0x82F63B78  # CRC32C (Castagnoli), reflected
_X0 = 1 << 31  # the polynomial 1 (x^0) in reflected order


def _multiply(a: int, b: int) -> int:
    """``a · b`` modulo the CRC polynomial (both reflected)."""
    product = 0
    bit = _X0
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ POLY if b & 1 else b >> 1
    return product


def _powers() -> tuple[int, ...]:
    """``x^(2^k)`` for k in 0..63: each is the square of the one before."""
    table = [_X0 >> 1]  # x^1
    for _ in range(63):
        table.append(_multiply(table[-1], table[-1]))
    return tuple(table)


_X_POW_2K = _powers()


def _x_pow_8n(n: int) -> int:
    """``x^(8n)`` modulo the polynomial: the factor by which ``n`` appended bytes shift a CRC register."""
    result = _X0
    k = 3  # 8n = n · 2^3
    while n:
        if n & 1:
            result = _multiply(_X_POW_2K[k], result)
        n >>= 1
        k += 1
    return result


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC32C of ``a + b``, given ``crc32c(a)``, ``crc32c(b)`` and ``len(b)``."""
    if length_b < 0:
        raise ValueError(f"length_b must be >= 0, got {length_b}")
    if length_b == 0:
        return crc_a
    return _multiply(_x_pow_8n(length_b), crc_a) ^ crc_b
