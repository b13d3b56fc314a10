"""Guard margins measured per model, compute type and block row (ct2_flash/guard.py)."""

import json

import pytest

from ct2_flash.drafter_files import target_identity
from ct2_flash.guard import GUARD_TABLE, derive_margins, margins_for, write_margins
from ct2_flash.whisper_model import FLOAT32_GUARD, QUANTIZED_GUARD, default_guard


def test_margins_grow_along_the_block_and_cover_unmeasured_rows():
    margins = derive_margins({0: 0.4, 1: 0.3, 2: 0.8}, rows=5, safety=1.5)
    assert margins == [0.6, 0.6, 1.2, 1.2, 1.2]
    with pytest.raises(ValueError):
        derive_margins({}, rows=3, safety=1.5)
    with pytest.raises(ValueError):
        derive_margins({0: 1.0}, rows=3, safety=0.5)


def test_table_round_trip_matches_the_model_not_its_name(tmp_path, model_path):
    table = str(tmp_path / "guard.json")
    write_margins("some-name", "int8_float32", [0.5, 0.7], "a test", table=table, model_path=model_path)
    identity = target_identity(model_path, "any other name")
    assert margins_for(identity, "int8_float32", table) == (0.5, 0.7)
    assert margins_for(identity, "float32", table) is None
    other = target_identity(model_path, "x").__class__(**{**target_identity(model_path, "x").__dict__, "d_model": 512})
    assert margins_for(other, "int8_float32", table) is None
    with open(table, encoding="utf-8") as stream:
        assert json.load(stream)["some-name"]["margins"]["int8_float32"]["source"] == "a test"


def test_default_guard_uses_the_shipped_measurement_or_the_fixed_margins(model_path):
    identity = target_identity(model_path, "tiny.en")
    for compute_type, fixed in (("int8_float32", QUANTIZED_GUARD), ("float32", FLOAT32_GUARD)):
        measured = margins_for(identity, compute_type, GUARD_TABLE)
        assert default_guard(model_path, compute_type) == (measured if measured is not None else fixed)
    assert default_guard(model_path, "int16") == QUANTIZED_GUARD
