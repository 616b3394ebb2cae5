"""The media the serve probe sends: a valid PNG made here (zlib, no imaging library), a valid
MP4 made with the image's PyAV when the model takes video, and the bad-media cases, each an
OpenAI content part that a correct server refuses with a 4xx."""

from __future__ import annotations

import base64
import struct
import zlib


def png(width: int = 32, height: int = 32) -> bytes:
    """A whole RGB PNG of a gradient."""
    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in ((x * 8) % 256, (y * 8) % 256, 128))
        for y in range(height)
    )

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def mp4(frames: int = 8, size: int = 64) -> bytes:
    """A whole MP4 (mpeg4) made with the image's PyAV; raises ImportError without it."""
    import io

    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        s = out.add_stream("mpeg4", rate=8)
        s.width, s.height, s.pix_fmt = size, size, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame(size, size, "yuv420p")
            for n, plane in enumerate(frame.planes):
                plane.update(bytes((i * 9 + n * 40 + k) % 256 for k in range(plane.buffer_size)))
            frame.pts = i
            for packet in s.encode(frame):
                out.mux(packet)
        for packet in s.encode():
            out.mux(packet)
    return buf.getvalue()


def data_url(mime: str, raw: bytes) -> str:
    return "data:%s;base64,%s" % (mime, base64.b64encode(raw).decode("ascii"))


def part(kind: str, url: str) -> dict:
    key = "image_url" if kind == "image" else "video_url"
    return {"type": key, key: {"url": url}}


def garbage(n: int, seed: int) -> bytes:
    """Deterministic noise: the same bytes in every run, so a record can be repeated."""
    out, x = bytearray(), seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(x >> 16 & 0xFF)
    return bytes(out)


def bad_cases(unreachable_port: int) -> list:
    """(case name, media kind, content part): every one a correct server refuses with a 4xx."""
    whole = png()
    return [
        ("truncated_png", "image", part("image", data_url("image/png", whole[: len(whole) // 2]))),
        ("garbage_png", "image", part("image", data_url("image/png", garbage(2048, 1)))),
        ("garbage_jpeg", "image", part("image", data_url("image/jpeg", b"\xff\xd8\xff" + garbage(2048, 2)))),
        ("empty_payload", "image", part("image", "data:image/png;base64,")),
        ("invalid_base64", "image", part("image", "data:image/png;base64,@@not*base64@@")),
        (
            "unreachable_url",
            "image",
            part("image", "http://127.0.0.1:%d/imagegate-missing.png" % unreachable_port),
        ),
        ("garbage_mp4", "video", part("video", data_url("video/mp4", garbage(4096, 3)))),
    ]
