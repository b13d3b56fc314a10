"""Models shipped in parts: joined once into the cache, again when the parts change, with a
clear error naming the packages when one is missing (fake packages here; the real ``base``
is exercised by ``tests/test_base_model.py`` when it is installed)."""

import json
import os

import pytest

from ct2_flash.engine import models
from ct2_flash.engine.models import ModelPart, UnknownModelError, resolve_model


@pytest.fixture
def parted(tmp_path, monkeypatch):
    """A model "fake" in two fake packages, and an empty cache."""
    roots = {}
    for index, payload in ((1, b"first half|"), (2, b"second half")):
        data = tmp_path / f"pkg{index}" / "data"
        data.mkdir(parents=True)
        (data / f"model.bin.part{index}").write_bytes(payload)
        roots[f"fake_part{index}"] = str(tmp_path / f"pkg{index}")
    (tmp_path / "pkg1" / "data" / "config.json").write_text('{"suppress_ids": []}')
    (tmp_path / "pkg1" / "data" / "vocabulary.txt").write_text("a\nb\n")
    parts = tuple(ModelPart(f"fake_part{i}", "data", f"model.bin.part{i}", f"fake-part{i}==1.0") for i in (1, 2))
    monkeypatch.setitem(models.PARTED_MODELS, "fake", parts)
    monkeypatch.setattr(models, "_package_dir", lambda package: roots.get(package))
    monkeypatch.setenv("CT2_FLASH_MODELS", str(tmp_path / "cache"))
    return tmp_path, roots


def test_parts_are_joined_once_into_the_cache(parted):
    tmp_path, _ = parted
    path = resolve_model("fake")
    assert path == str(tmp_path / "cache" / "fake")
    with open(os.path.join(path, "model.bin"), "rb") as stream:
        assert stream.read() == b"first half|second half"
    assert open(os.path.join(path, "vocabulary.txt")).read() == "a\nb\n"
    assert json.load(open(os.path.join(path, "config.json"))) == {"suppress_ids": []}
    assert sorted(os.listdir(path)) == ["config.json", "ct2_flash_parts.json", "model.bin", "vocabulary.txt"]
    # A second use finds it: nothing is rewritten.
    written = os.stat(os.path.join(path, "model.bin")).st_mtime_ns
    assert resolve_model("fake") == path
    assert os.stat(os.path.join(path, "model.bin")).st_mtime_ns == written
    assert "fake" in models.available_models() and models.embedded_name(path) == "fake"


def test_changed_or_half_written_parts_are_joined_again(parted):
    tmp_path, _ = parted
    path = resolve_model("fake")
    (tmp_path / "pkg2" / "data" / "model.bin.part2").write_bytes(b"new second half")  # another version
    resolve_model("fake")
    assert open(os.path.join(path, "model.bin"), "rb").read() == b"first half|new second half"
    with open(os.path.join(path, "model.bin"), "r+b") as stream:  # a join cut short
        stream.truncate(5)
    resolve_model("fake")
    assert open(os.path.join(path, "model.bin"), "rb").read() == b"first half|new second half"


def test_a_missing_part_names_the_packages(parted, monkeypatch):
    _, roots = parted
    monkeypatch.setattr(models, "_package_dir", lambda package: roots.get(package) if package == "fake_part1" else None)
    with pytest.raises(UnknownModelError, match=r"'fake-part2==1.0' is not installed: pip install 'ct2-flash\[fake\]'"):
        resolve_model("fake")
    assert "fake" not in models.available_models()
