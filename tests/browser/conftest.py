"""Fixtures shared by the real-browser tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import labdriver as L
import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's Chromium, installed if missing (skip with the installer's reason if that fails)."""
    path = L.find_chromium()
    if path is None:
        r = subprocess.run(
            ["sh", str(HERE / "ensure_chromium.sh")], capture_output=True, text=True, timeout=600
        )
        path = L.find_chromium()
        if path is None:
            pytest.skip(f"headless Chromium is not installed and could not be installed: "
                        f"{(r.stderr or r.stdout).strip()[-500:]}")
    return path
