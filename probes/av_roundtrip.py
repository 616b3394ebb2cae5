"""av_roundtrip: the media stack works. Encode N frames of W×H (mpeg4) into an in-memory MP4,
decode it with PyAV, and check the decoded frame count and width."""

from __future__ import annotations

import io


def _frame(av, width: int, height: int, index: int):
    frame = av.VideoFrame(width, height, "yuv420p")
    for n, plane in enumerate(frame.planes):
        # A moving gradient, so the encoder has real content and every frame differs.
        size = plane.buffer_size
        base = (index * 7 + n * 50) % 256
        plane.update(bytes((base + i) % 256 for i in range(size)))
    frame.pts = index
    return frame


def run(params: dict) -> dict:
    frames = int(params.get("frames", 8))
    width = int(params.get("width", 64))
    height = int(params.get("height", 64))
    codec = params.get("codec", "mpeg4")
    try:
        import av
    except ImportError as e:
        return {"status": "FAIL", "detail": f"the image lacks PyAV: import av failed: {e}", "data": {}}
    data = {"av_version": getattr(av, "__version__", None), "codec": codec, "width": width, "height": height}
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream(codec, rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            for packet in stream.encode(_frame(av, width, height, i)):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    data["mp4_bytes"] = buf.tell()
    buf.seek(0)
    decoded, widths, heights = 0, set(), set()
    with av.open(buf, mode="r") as inp:
        for frame in inp.decode(video=0):
            decoded += 1
            widths.add(frame.width)
            heights.add(frame.height)
    data.update(decoded_frames=decoded, decoded_widths=sorted(widths), decoded_heights=sorted(heights))
    return judge(data, frames)


def judge(data: dict, frames: int) -> dict:
    """PASS when every encoded frame came back at the encoded width. Apart so the FAIL path can be
    tested: a working PyAV, given valid parameters, always roundtrips."""
    width, height, decoded = data["width"], data["height"], data["decoded_frames"]
    if decoded == frames and data["decoded_widths"] == [width]:
        return {"status": "PASS", "detail": "frames=%d" % decoded, "data": data}
    return {
        "status": "FAIL",
        "detail": "encoded %d frames %dx%d, decoded %d frames of widths %s"
        % (frames, width, height, decoded, data["decoded_widths"]),
        "data": data,
    }
