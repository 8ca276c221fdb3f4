"""The workspace layout the transform-domain sources share (``winograd``, ``fft``): the transformed filter U, then
per stream the chunk's transformed input V and products M, each segment 256-byte aligned.

Why one place: the geometry lays the segments out and the source's launch finds them by name (``U``, ``V``, ``M``,
and ``U1``, ``V1``, ``M1``, ... for chunks over streams: chunk i runs on stream i % streams), so the names, the order
and backward filter's per-stream U (each stream accumulates its own, summed by the inverse transform) must agree
between every geometry and its source.
"""
from __future__ import annotations

from ucudnn.errors import InputError

from .mec import align_up

#: streams a chunked call may spread its chunks over (a V and M each; for backward filter a U each too)
STREAMS = (1, 2, 3)


def segments(backward_filter: bool, co: int, ci: int, tiles: int, streams: int,
             point_bytes: int, u_copies: int = 1) -> tuple[tuple[str, int, int], ...]:
    """(name, byte offset, bytes) of U (``co x ci``), then V (``ci x tiles``) and M (``co x tiles``) per stream, for
    ``point_bytes`` bytes per element of every transform-domain point (winograd: 36 floats; fft: F complex values);
    backward filter has a U per stream first (``U``, ``U1``, ...), each ``u_copies`` U's long (split GEMMs: a copy
    per part of the chunk's tiles)."""
    if streams not in STREAMS:
        raise InputError(f"must be one of {STREAMS}, got {streams!r}", "streams")
    us = streams if backward_filter else 1
    parts = [(f"U{k or ''}", co * ci * u_copies) for k in range(us)] + [
        (f"{name}{k or ''}", elements) for k in range(streams)
        for name, elements in (("V", ci * tiles), ("M", co * tiles))]
    out, off = [], 0
    for name, elements in parts:
        out.append((name, off, point_bytes * elements))
        off = align_up(off + point_bytes * elements)
    return tuple(out)


def stream_buffers(backward_filter: bool, k: int) -> dict[str, str]:
    """The segment names stream ``k`` uses for the GEMM's buffer names U, V, M (U shared, but for backward filter:
    each stream accumulates its own)."""
    own = f"{k or ''}"
    return {"U": "U" + own if backward_filter else "U", "V": "V" + own, "M": "M" + own}


def partials(streams: int, chunks: int, u_bytes: int, elem_bytes: int, u_copies: int = 1) -> tuple[int, int]:
    """(parts, stride in elements of ``elem_bytes``) of backward filter's per-stream U (``u_bytes`` each) over a call
    of ``chunks`` chunks: the streams that ran a chunk (each wrote its U), their buffers that far apart (every U the
    same size, 256-byte aligned, so evenly spaced).  Why: a stream's GEMMs add into its own U, so no two streams add
    into one buffer; the inverse filter transform sums them once per call.  With ``u_copies`` (:func:`segments`)
    each of those streams wrote that many copies, one U apart, and the next stream's start one U after its last copy
    only where the copies end on the alignment: otherwise no single stride reaches every copy (refused)."""
    used = min(streams, chunks)
    parts = used * u_copies
    if parts == 1:
        return 1, 0
    if u_copies == 1:
        return parts, align_up(u_bytes) // elem_bytes
    if used > 1 and align_up(u_copies * u_bytes) != u_copies * u_bytes:
        raise InputError(f"{u_copies} copies of {u_bytes} bytes do not end on the workspace's alignment", "u_copies")
    return parts, u_bytes // elem_bytes
