"""Output caps shared by every tool: keep the head and the tail, say how much was cut.

A model reads the start of an output (what ran, the first error) and its end (the summary, the last
error), so a long output keeps both ends and a marker in the middle naming the bytes cut.
:func:`cap_output` caps a whole text; :class:`CappedBuffer` caps a stream (a subprocess's output)
while it arrives, holding at most about ``2 * max_bytes`` whatever the stream's length.
"""

from __future__ import annotations

import re

MARKER = "\n[… {cut} bytes cut …]\n"
"""Put where the middle of an output was cut; ``{cut}`` is the number of bytes left out."""
MARKER_PATTERN = re.compile(r"\n\[… [0-9]+ bytes cut …\]\n")
"""Matches :data:`MARKER` whatever the number."""

_MIN_SPLIT_BYTES = 64
"""Below this cap there is no room for head, marker and tail: the output is cut at the end only."""


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _render(head: bytes, tail: bytes, cut_bytes: int, max_bytes: int) -> str:
    """Join the head and the tail around the marker, within ``max_bytes``.

    The head and the tail are ``cut_bytes`` apart in the output.
    """
    if cut_bytes == 0 and len(head) + len(tail) <= max_bytes:
        return _decode(head + tail)
    if max_bytes < _MIN_SPLIT_BYTES:
        # No room for both ends and a marker: the head alone, cut on a character boundary.
        return head[:max_bytes].decode("utf-8", errors="ignore")
    # Sized for the largest count the marker can show, so the result never exceeds max_bytes.
    widest = MARKER.format(cut=cut_bytes + len(head) + len(tail))
    room = max_bytes - len(widest.encode())
    keep_tail = min(len(tail), room // 2)
    keep_head = min(len(head), room - keep_tail)
    keep_tail = min(len(tail), room - keep_head)  # a short head leaves its room to the tail
    cut = cut_bytes + (len(head) - keep_head) + (len(tail) - keep_tail)
    # errors="ignore" drops a character split by the cut instead of showing a replacement mark.
    first = head[:keep_head].decode("utf-8", errors="ignore")
    last = tail[len(tail) - keep_tail :].decode("utf-8", errors="ignore")
    return first + MARKER.format(cut=cut) + last


def cap_output(data: str | bytes, max_bytes: int) -> str:
    """Cap a tool's output at ``max_bytes`` of UTF-8, keeping its head and tail.

    Args:
        data: The output; bytes are decoded as UTF-8 (invalid bytes become U+FFFD).
        max_bytes: The most bytes kept, marker included (positive).

    Returns:
        ``data`` as text when it fits; otherwise its first and last bytes (about half each) around
        ``[… N bytes cut …]``, N counting every byte of ``data`` left out. Under 64 bytes there is
        no room for a marker and the text is only cut at its end.

    Raises:
        ValueError: ``max_bytes`` is not positive.
    """
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    raw = data.encode("utf-8", errors="surrogatepass") if isinstance(data, str) else data
    if len(raw) <= max_bytes:
        return data if isinstance(data, str) else _decode(raw)
    head = raw[:max_bytes]
    tail = raw[max(len(head), len(raw) - max_bytes) :]
    return _render(head, tail, len(raw) - len(head) - len(tail), max_bytes)


class CappedBuffer:
    """Collects a byte stream and renders it like :func:`cap_output`, in bounded memory.

    Args:
        max_bytes: The cap of the rendered text (positive).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self._head = bytearray()
        self._tail = bytearray()

    def add(self, chunk: bytes | bytearray) -> None:
        """Append a chunk; memory stays under about ``2 * max_bytes``."""
        self.total_bytes += len(chunk)
        room = self.max_bytes - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > 2 * self.max_bytes:
                del self._tail[: len(self._tail) - self.max_bytes]

    def text(self) -> str:
        """The collected output, capped at ``max_bytes`` with head, marker and tail."""
        if self.total_bytes <= self.max_bytes:
            return _decode(bytes(self._head))
        tail = bytes(self._tail[-self.max_bytes :])
        cut = self.total_bytes - len(self._head) - len(tail)
        return _render(bytes(self._head), tail, cut, self.max_bytes)


__all__ = ["MARKER", "CappedBuffer", "cap_output"]
