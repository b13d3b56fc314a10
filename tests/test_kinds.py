"""Which drafter a model decodes with (``drafting/kinds.py``)."""

import os
import shutil

import pytest

from ct2_flash.drafting.files import SHIPPED_DRAFTERS, CheckpointError
from ct2_flash.drafting.kinds import NAMED, checked_options, kind_named, kind_of, open_drafter
from ct2_flash.drafting.prompt_lookup import PromptLookupDrafter

SHIPPED = os.path.join(SHIPPED_DRAFTERS, "tiny.en")


def test_a_converted_drafter_is_onnx_and_a_bare_checkpoint_pytorch(tmp_path):
    assert kind_of(SHIPPED).name == "onnx"
    bare = tmp_path / "checkpoint"
    bare.mkdir()
    shutil.copy(os.path.join(SHIPPED, "drafter.json"), bare / "drafter.json")
    assert kind_of(str(bare)).name == "pytorch"


def test_a_kind_is_named_or_the_kinds_there_are_are_listed():
    assert kind_named("onnx").name == "onnx"
    with pytest.raises(ValueError, match="one of \\('onnx', 'pytorch'\\)"):
        kind_named("tensorrt")


def test_what_a_user_passes_opens_or_says_why(tmp_path, model_path):
    given = PromptLookupDrafter()
    assert open_drafter(given, "tiny.en", model_path) is given
    assert isinstance(open_drafter(None, "no-such-model", str(tmp_path)), PromptLookupDrafter)  # nothing shipped
    with pytest.raises(CheckpointError, match="does not exist"):
        open_drafter(str(tmp_path / "missing"), "tiny.en", model_path)
    with pytest.raises(TypeError, match="drafter must be"):
        open_drafter(3, "tiny.en", model_path)


def test_one_registry_names_the_drafters_that_need_no_directory(tmp_path, model_path):
    """The adapter, the bench and the command line resolve a drafter by the same function: a
    name, None, a directory, with options where the drafter is built here."""
    assert set(NAMED) == {"builtin", "oracle"}
    assert isinstance(open_drafter("builtin", "tiny.en", model_path), PromptLookupDrafter)
    assert open_drafter("builtin", "tiny.en", model_path, options={"max_ngram": 2}).max_ngram == 2
    with pytest.raises(ValueError, match="apply to a drafter built here"):
        open_drafter(PromptLookupDrafter(), "tiny.en", model_path, options={"max_ngram": 2})
    with pytest.raises(ValueError, match="need a Whisper-Flash drafter"):
        open_drafter(None, "no-such-model", str(tmp_path), options={"precision": "float32"})
    with pytest.raises(ValueError, match="need a Whisper-Flash drafter"):
        open_drafter(str(tmp_path), "tiny.en", model_path, options={"precision": "float32"})


def test_an_option_a_drafter_does_not_take_is_named():
    assert checked_options(PromptLookupDrafter, {"max_ngram": 4}) == {"max_ngram": 4}
    with pytest.raises(ValueError, match="takes no option colour"):
        checked_options(PromptLookupDrafter, {"colour": 1})
