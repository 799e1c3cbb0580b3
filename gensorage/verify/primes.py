"""Prime numbers for the finite-field identity test.

Primality is decided by Miller–Rabin with the first twelve prime bases, which is *deterministic* for every
n < 3.3 · 10^24 (Sorenson & Webster 2015) and so for every 64-bit integer. The default moduli are a safe-prime
pair q, p = 2q + 1 chosen so that

- q > 10^9: every rational ``n/d`` with ``d <= 10^9`` (how scale factors are mapped into the fields) has a
  denominator that is invertible mod p and mod q;
- p < 2^31: products of two residues stay below 2^62, so int64 never overflows;
- p ≡ q ≡ 3 (mod 4): square roots are a single power, ``x^((m+1)/4) mod m``.

``DEFAULT_Q`` is the largest prime below 2^30 with these properties (checked by the tests via
:func:`find_safe_prime_pair`).
"""

from __future__ import annotations

# Bases that make Miller–Rabin deterministic below 3.3e24 > 2^64.
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)

#: Largest prime q < 2^30 with q ≡ 3 (mod 4) and p = 2q + 1 prime (found by :func:`find_safe_prime_pair`).
DEFAULT_Q = 1073740571
#: ``2 * DEFAULT_Q + 1``; a prime ≡ 3 (mod 4), below 2^31.
DEFAULT_P = 2 * DEFAULT_Q + 1


def is_prime(n: int) -> bool:
    """Deterministic primality for ``n < 2^64`` (and a strong probable-prime test beyond)."""
    if n < 2:
        return False
    for b in _MR_BASES:
        if n % b == 0:
            return n == b
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def find_safe_prime_pair(below: int) -> tuple[int, int]:
    """The largest ``(p, q)`` with ``q < below`` prime, ``q ≡ 3 (mod 4)`` and ``p = 2q + 1`` prime.

    ``p ≡ 3 (mod 4)`` follows (p = 2q + 1 ≡ 7 mod 8). Raises ``ValueError`` when there is none (``below <= 7``).
    """
    q = below - 1
    q -= (q - 3) % 4  # largest q < below with q ≡ 3 (mod 4)
    while q >= 3:
        if is_prime(q) and is_prime(2 * q + 1):
            return 2 * q + 1, q
        q -= 4
    raise ValueError(f"no safe prime pair with q < {below}")


__all__ = ["DEFAULT_P", "DEFAULT_Q", "find_safe_prime_pair", "is_prime"]
