"""Reading headless Chromium's screenshots in the browser tests: an 8-bit PNG decoder (the
zlib and filter steps of the PNG spec, no imaging dependency) and a pixel count by colour."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def read_png(path: Path) -> tuple[int, int, int, bytes]:
    """(width, height, channels, raw pixels) of an 8-bit RGB/RGBA non-interlaced PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    channels = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * channels
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        out += line
        prev = line
    return width, height, channels, bytes(out)


def count_pixels(path: Path, rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    width, height, channels, pixels = read_png(path)
    r0, g0, b0 = rgb
    return sum(
        1
        for i in range(0, width * height * channels, channels)
        if abs(pixels[i] - r0) <= tolerance
        and abs(pixels[i + 1] - g0) <= tolerance
        and abs(pixels[i + 2] - b0) <= tolerance
    )
