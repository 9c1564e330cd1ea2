"""config/gpulayer.example.toml documents every setting, and only real ones."""

from __future__ import annotations

import tomllib
from pathlib import Path

from gpulayer.config import Settings

EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "gpulayer.example.toml"


def test_example_covers_every_setting_and_loads():
    keys = set(tomllib.loads(EXAMPLE.read_text())["gpulayer"])
    public = {name for name, f in Settings.model_fields.items() if not f.exclude}
    assert keys == public
    Settings(**tomllib.loads(EXAMPLE.read_text())["gpulayer"])
