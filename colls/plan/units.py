"""Sizes and link speeds as `colls plan` reads and prints them: one convention, stated once.

Sizes and rates are decimal (SI): 1 GB = 1e9 bytes, 1 GB/s = 1e9 bytes per second, as nccl-tests
prints busbw. A binary size is written with an `i`: 1GiB = 2**30 bytes. Link speeds must carry a
unit, because the two vendors' habits differ by 8x (NICs are sold in Gb/s, NVLink in GB/s) and
NVLink's headline figure counts both directions: `--nic 400Gb/s`, `--nvlink 450GB/s`.
"""

from __future__ import annotations

import re

SIZE_CONVENTION = "sizes and rates decimal: 1 GB = 1e9 B, 1 GB/s = 1e9 B/s (GiB = 2^30 B)"

_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]?)(i?)(B?)\s*$", re.IGNORECASE)
_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]?)([bB])(?:/s|ps)\s*$")


def parse_size(text: str) -> int:
    """'1G' or '1GB' -> 1e9 bytes, '1GiB' or '1Gi' -> 2**30, '512' -> 512.

    Args:
        text: a number with an optional K/M/G/T prefix (decimal), `i` for binary, and `B`.

    Returns:
        The number of bytes.

    Raises:
        ValueError: the text is not a size.
    """
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(f"not a size: {text!r} (write e.g. 64M = 64e6 B, or 64MiB = 64 * 2^20 B)")
    number, prefix, binary, _ = match.groups()
    prefix = prefix.upper()
    if binary:
        return int(float(number) * _BINARY[prefix])
    return int(float(number) * _PREFIX[prefix])


def parse_rate(text: str, option: str) -> float:
    """'400Gb/s' -> 50e9, '450GB/s' -> 450e9 bytes per second (per direction, as given).

    Args:
        text: a number and a unit: b/s (bits) or B/s (bytes) with a K/M/G/T prefix.
        option: the option's name, for the error message.

    Returns:
        Bytes per second.

    Raises:
        ValueError: no unit, or an unknown one; the message names `option` and the units it takes.
    """
    match = _RATE.match(str(text))
    if match is None:
        raise ValueError(f"{option} needs a unit, b/s (bits, as NICs are sold: 400Gb/s) or B/s (bytes: "
                         f"50GB/s, NVLink's 450GB/s), per direction; got {text!r}. NVLink 4's '900 GB/s' "
                         f"counts both directions: one direction is 450GB/s")
    number, prefix, bit = match.groups()
    value = float(number) * _PREFIX[prefix.upper()]
    return value / 8 if bit == "b" else value


def gb(nbytes: float) -> str:
    """Bytes as decimal GB with three decimals: '1.074 GB'."""
    return f"{nbytes / 1e9:.3f} GB"


def size_label(nbytes: int) -> str:
    """'1073741824 B (1.074 GB = 1 GiB)' for powers of two, else '64000000 B (0.064 GB)'."""
    binary = next((f" = {nbytes // _BINARY[p]:g} {p}iB" for p in ("T", "G", "M", "K")
                   if nbytes >= _BINARY[p] and nbytes % _BINARY[p] == 0), "")
    return f"{nbytes} B ({gb(nbytes)}{binary})"
