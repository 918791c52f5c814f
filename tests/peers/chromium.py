"""Run Debian's headless ``chromium`` on a local file: screenshot and serialized DOM.

Every call gets a fresh profile folder and the flags that keep Chromium off the network and away
from a GPU; ``tests/run.sh`` installs the package.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

INSTALL_HINT = "apt-get update && apt-get install -y chromium  (Debian package)"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


def chromium_path() -> str:
    """The browser binary. A missing browser skips the calling test, naming the package to install
    (the machine's gap, not the report's failure; ``tests/run.sh`` installs it where it can)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip(f"headless Chromium not found; install it: {INSTALL_HINT}")
    return path


def _run(page: Path, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="mmtrace-chromium-") as profile:
        proc = subprocess.run(
            [chromium_path(), *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    if proc.returncode != 0:
        raise AssertionError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def screenshot(page: Path, out: Path, width: int = 1400, height: int = 2000) -> Path:
    _run(page, f"--screenshot={out}", f"--window-size={width},{height}")
    if not out.exists():
        raise AssertionError(f"chromium wrote no screenshot to {out}")
    return out


def ink(page: Path, out: Path) -> tuple[float, int]:
    """Screenshot ``page`` into ``out``: (fraction of non-white pixels, distinct colours), for the
    tests that check a rendered chart is not blank."""
    import numpy as np
    from PIL import Image

    with Image.open(screenshot(page, out)) as img:
        pixels = np.asarray(img.convert("RGB"))
    return float((pixels.min(axis=2) < 235).mean()), len(np.unique(pixels.reshape(-1, 3), axis=0))


def dump_dom(page: Path) -> str:
    """The DOM after the page loaded, serialized as HTML (what the browser built, not the file)."""
    return _run(page, "--dump-dom").stdout


class Element:
    """A parsed DOM element: tag, attributes, children and the text directly inside it."""

    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Element | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Element] = []
        self.text = ""

    def iter(self, tag: str | None = None, cls: str | None = None):
        """Every descendant (depth first) with this tag and/or this class."""
        for child in self.children:
            if (tag is None or child.tag == tag) and (cls is None or cls in (child.attrs.get("class") or "").split()):
                yield child
            yield from child.iter(tag, cls)

    def text_content(self) -> str:
        return self.text + "".join(c.text_content() for c in self.children)


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {}, None)
        self.current = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, dict(attrs), self.current)
        self.current.children.append(el)
        if tag not in VOID:
            self.current = el

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Element(tag, dict(attrs), self.current))

    def handle_endtag(self, tag: str) -> None:
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.current = node.parent

    def handle_data(self, data: str) -> None:
        self.current.text += data


def parse_dom(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root
