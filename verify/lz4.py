"""LZ4 *block* decoding (no frame), as nvcc's `--compress-mode=speed` stores cubins in a fatbin.

Written here rather than taken from a dependency: the block format is a page of spec, we only
decode (never encode), and we need a hard output cap so a hostile block cannot make us allocate
more than the caller allows. Python's per-sequence loop is slow on megabyte cubins, which is fine:
only kernel listing decompresses, and archs are read from headers alone.
"""

from __future__ import annotations

from bwstack.errors import FatbinError

_MIN_MATCH = 4


def decompress_block(src: bytes, limit: int, *, label: str = "lz4 block") -> bytes:
    """Decode one LZ4 block. Raises FatbinError if it is malformed or would exceed `limit` bytes."""
    out = bytearray()
    pos, end = 0, len(src)
    while pos < end:
        token = src[pos]
        pos += 1
        literals, pos = _length(src, pos, token >> 4, label)
        if pos + literals > end:
            raise FatbinError(f"{label}: literal run of {literals} bytes passes the end of the block")
        if len(out) + literals > limit:
            raise FatbinError(f"{label}: decodes to more than the {limit} bytes its header promised")
        out += src[pos : pos + literals]
        pos += literals
        if pos == end:
            break  # the last sequence carries literals only
        if pos + 2 > end:
            raise FatbinError(f"{label}: match offset cut off at byte {pos}")
        offset = src[pos] | (src[pos + 1] << 8)
        pos += 2
        if offset == 0 or offset > len(out):
            raise FatbinError(f"{label}: match offset {offset} points before the start of the output")
        match, pos = _length(src, pos, token & 0xF, label)
        match += _MIN_MATCH
        if len(out) + match > limit:
            raise FatbinError(f"{label}: decodes to more than the {limit} bytes its header promised")
        start = len(out) - offset
        if offset >= match:
            out += out[start : start + match]
        else:
            # Overlapping copy: the match repeats the last `offset` bytes (run-length style).
            pattern = bytes(out[start:])
            out += (pattern * (match // offset + 1))[:match]
    return bytes(out)


def _length(src: bytes, pos: int, nibble: int, label: str) -> tuple[int, int]:
    """A 4-bit length, extended by 255-valued bytes when the nibble is 15."""
    length = nibble
    if nibble == 15:
        while True:
            if pos >= len(src):
                raise FatbinError(f"{label}: length field cut off at byte {pos}")
            byte = src[pos]
            pos += 1
            length += byte
            if byte != 255:
                break
    return length, pos
