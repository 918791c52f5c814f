"""Deterministic test images (and videos, made of them) for the harness.

Each seed gives a different picture (gradients plus shapes), so a new seed is a guaranteed cache
miss in SGLang's multimodal/radix caches, while the same seed and size give the same bytes, so a
repeated request is a guaranteed hit.
"""

from __future__ import annotations

import base64
import io
import random
import shutil
import subprocess
from typing import Literal

import numpy as np
from PIL import Image, ImageDraw

ImageFormat = Literal["PNG", "JPEG"]

_MIME: dict[str, str] = {"PNG": "image/png", "JPEG": "image/jpeg", "JPG": "image/jpeg"}


def make_image(width: int, height: int, seed: int, fmt: ImageFormat = "PNG", label: str | None = None) -> bytes:
    """Render a seed-dependent RGB image and return it encoded as PNG or JPEG bytes.

    Structured content (not noise) keeps the files small and realistic for an image processor,
    and the encoder settings are fixed so the bytes are reproducible. ``label`` draws that text on
    a box in the top-left corner (the bench labels its images with a run nonce, so "new" images
    are new even on a long-lived server that saw the same seeds before).
    """
    fmt_u = fmt.upper()
    if fmt_u not in _MIME:
        raise ValueError(f"unsupported image format {fmt!r}; use 'PNG' or 'JPEG'")
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    rng = random.Random(seed)

    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    xs /= max(width - 1, 1)
    ys /= max(height - 1, 1)
    channels = []
    for _ in range(3):
        a, b = rng.uniform(-1.0, 1.0), rng.uniform(-1.0, 1.0)
        freq, phase = rng.uniform(1.0, 6.0), rng.uniform(0.0, 6.283)
        base = rng.uniform(0.2, 0.8)
        plane = base + 0.25 * (a * xs + b * ys) + 0.15 * np.sin(freq * (xs + ys) * 3.1416 + phase)
        channels.append(np.clip(plane * 255.0, 0, 255).astype(np.uint8))
    img = Image.fromarray(np.stack(channels, axis=-1))

    draw = ImageDraw.Draw(img)
    for _ in range(rng.randint(4, 9)):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1 = min(width - 1, x0 + rng.randint(1, max(2, width // 3)))
        y1 = min(height - 1, y0 + rng.randint(1, max(2, height // 3)))
        color = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        shape = rng.choice(("rect", "ellipse", "line"))
        if shape == "rect":
            draw.rectangle((x0, y0, x1, y1), fill=color)
        elif shape == "ellipse":
            draw.ellipse((x0, y0, x1, y1), fill=color)
        else:
            draw.line((x0, y0, x1, y1), fill=color, width=rng.randint(1, 6))
    if label:
        box = draw.textbbox((4, 4), label)
        draw.rectangle((box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2), fill=(255, 255, 255))
        draw.text((4, 4), label, fill=(0, 0, 0))

    buf = io.BytesIO()
    if fmt_u == "PNG":
        img.save(buf, format="PNG", optimize=False, compress_level=6)
    else:
        img.save(buf, format="JPEG", quality=90, optimize=False, progressive=False, subsampling=0)
    return buf.getvalue()


def data_url(data: bytes, fmt: ImageFormat = "PNG") -> str:
    """Wrap encoded image bytes as a ``data:`` URL, the form OpenAI ``image_url`` parts accept."""
    mime = _MIME.get(fmt.upper())
    if mime is None:
        raise ValueError(f"unsupported image format {fmt!r}; use 'PNG' or 'JPEG'")
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def make_video(width: int, height: int, frames: int, seed: int, fps: int = 4) -> bytes:
    """An MP4 (H.264 in yuv420p, what players and SGLang's decoders read) of ``frames`` seed-dependent
    images at ``fps``, encoded by the ``ffmpeg`` command, which SGLang's video decoder (torchcodec)
    needs as a library anyway. The same arguments give the same frames.
    """
    if shutil.which("ffmpeg") is None:
        raise RuntimeError("making a test video needs the ffmpeg command (apt-get install ffmpeg)")
    raw = b"".join(
        np.asarray(Image.open(io.BytesIO(make_image(width, height, seed * 1000 + i)))).tobytes() for i in range(frames)
    )
    cmd = ["ffmpeg", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}"]
    cmd += ["-r", str(fps), "-i", "-", "-pix_fmt", "yuv420p", "-f", "mp4", "-movflags", "frag_keyframe+empty_moov", "-"]
    return subprocess.run(cmd, input=raw, capture_output=True, check=True).stdout


def video_data_url(data: bytes) -> str:
    """An MP4's bytes as a ``data:`` URL, the form OpenAI-style ``video_url`` parts take."""
    return f"data:video/mp4;base64,{base64.b64encode(data).decode('ascii')}"


__all__ = ["ImageFormat", "data_url", "make_image", "make_video", "video_data_url"]
