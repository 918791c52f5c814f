"""Deterministic test audio clips for the harness, in the style of ``images.make_image``.

Each seed gives a different clip (a chord of seed-chosen tones under a seed-chosen envelope), so a
new seed is a guaranteed cache miss in SGLang's multimodal/radix caches, while the same seed,
length and rate give the same bytes, so a repeated request is a guaranteed hit. The clips are
16-bit PCM mono WAV (stdlib ``wave``), which every audio loader SGLang uses reads.
"""

from __future__ import annotations

import base64
import io
import random
import wave

import numpy as np

SAMPLE_RATE: int = 16_000
"""The rate Qwen2-Audio's and Gemma 4's feature extractors expect (SGLang resamples others to it)."""


def make_audio(seconds: float, seed: int, sample_rate: int = SAMPLE_RATE) -> bytes:
    """Render a seed-dependent mono clip of ``seconds`` and return it as 16-bit PCM WAV bytes.

    Two to four sine tones (110..1760 Hz) with seed-dependent amplitudes and phases, faded in and
    out so the clip has no clicks; fixed arithmetic, so the bytes are reproducible.
    """
    if seconds <= 0 or sample_rate <= 0:
        raise ValueError(f"clip length and rate must be positive, got {seconds} s at {sample_rate} Hz")
    rng = random.Random(seed)
    n = max(1, round(seconds * sample_rate))
    t = np.arange(n, dtype=np.float64) / sample_rate
    signal = np.zeros(n, dtype=np.float64)
    for _ in range(rng.randint(2, 4)):
        freq = 110.0 * 2 ** rng.uniform(0.0, 4.0)
        signal += rng.uniform(0.2, 1.0) * np.sin(2 * np.pi * freq * t + rng.uniform(0.0, 2 * np.pi))
    fade = min(n // 2, max(1, sample_rate // 50))  # 20 ms ramps
    envelope = np.ones(n)
    envelope[:fade] = np.linspace(0.0, 1.0, fade)
    envelope[n - fade :] = np.linspace(1.0, 0.0, fade)
    signal *= envelope * 0.8 / max(float(np.max(np.abs(signal))), 1e-9)
    pcm = np.round(signal * 32767).astype("<i2")

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def audio_data_url(data: bytes) -> str:
    """A WAV's bytes as a ``data:`` URL, the form OpenAI-style ``audio_url`` parts take."""
    return f"data:audio/wav;base64,{base64.b64encode(data).decode('ascii')}"


def audio_message(question: str, clips: list[str], audio_first: bool = True) -> dict[str, object]:
    """An OpenAI ``user`` message with one ``audio_url`` part per URL and one text part
    (``server.image_message``'s shape for audio)."""
    parts: list[dict[str, object]] = [{"type": "audio_url", "audio_url": {"url": url}} for url in clips]
    text: dict[str, object] = {"type": "text", "text": question}
    return {"role": "user", "content": [*parts, text] if audio_first else [text, *parts]}


__all__ = ["SAMPLE_RATE", "audio_data_url", "audio_message", "make_audio"]
