"""Walks zstd frame and block headers as the compressed bytes go by (no decompression), so that
a stream cut inside a frame is reported as truncated: python-zstandard's bounded stream reader
ends quietly at the end of its input, frame complete or not. Format: RFC 8878, section 3.1."""

from __future__ import annotations

_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MASK, _SKIPPABLE = 0xFFFFFFF0, 0x184D2A50


class ZstdFrameWalker:
    def __init__(self) -> None:
        self._buf = b""  # an incomplete header, carried to the next chunk
        self._skip = 0  # bytes of block content or skippable frame still to pass over
        self._state = "magic"  # magic | fhd | block | checksum
        self._checksum = False
        self.error: str | None = None

    @property
    def at_frame_boundary(self) -> bool:
        return self.error is None and self._state == "magic" and self._skip == 0 and not self._buf

    def feed(self, data: bytes) -> None:
        if self.error:
            return
        pos, n = 0, len(data)
        while pos < n:
            if self._skip:
                step = min(self._skip, n - pos)
                self._skip -= step
                pos += step
                continue
            need = self._need()
            take = min(need - len(self._buf), n - pos)
            self._buf += data[pos : pos + take]
            pos += take
            if len(self._buf) < need:
                return
            if self._state == "fhd" and len(self._buf) == 1:
                # The frame header's size depends on its first byte: read that much more.
                self._header_len = self._fhd_len(self._buf[0])
                if self._header_len > 1:
                    continue
            self._advance()
            if self.error:
                return

    def _need(self) -> int:
        if self._state == "magic":
            return 4
        if self._state == "skippable":
            return 4
        if self._state == "fhd":
            return 1 if not self._buf else self._header_len
        if self._state == "block":
            return 3
        return 4  # checksum

    @staticmethod
    def _fhd_len(fhd: int) -> int:
        fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
        fcs = (1 if single else 0, 2, 4, 8)[fcs_flag]
        did = (0, 1, 2, 4)[fhd & 3]
        return 1 + (0 if single else 1) + did + fcs

    def _advance(self) -> None:
        buf, self._buf = self._buf, b""
        if self._state == "magic":
            magic = int.from_bytes(buf, "little")
            if magic == _ZSTD_MAGIC:
                self._state = "fhd"
            elif magic & _SKIPPABLE_MASK == _SKIPPABLE:
                self._state = "skippable"
            else:
                self.error = "data after a zstd frame is not another frame"
        elif self._state == "skippable":
            self._skip = int.from_bytes(buf, "little")
            self._state = "magic"
        elif self._state == "fhd":
            if buf[0] & 0x08:
                self.error = "reserved bit set in a zstd frame header"
            self._checksum = bool(buf[0] & 0x04)
            self._state = "block"
        elif self._state == "block":
            header = int.from_bytes(buf, "little")
            last, btype, size = header & 1, (header >> 1) & 3, header >> 3
            if btype == 3:
                self.error = "reserved zstd block type"
                return
            self._skip = 1 if btype == 1 else size
            if last:
                self._state = "checksum" if self._checksum else "magic"
        else:  # checksum read
            self._state = "magic"
