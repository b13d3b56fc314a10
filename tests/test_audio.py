"""Reading audio files: faster-whisper's samples, and the garbage collection around it."""

import gc
import weakref

import numpy as np
import pytest
from faster_whisper import decode_audio

from ct2_flash.adapter.audio import checked_audio, young_collections

from .conftest import CLIP_PATHS


class _Node:
    """An object that can sit in a reference cycle and be watched through a weak reference."""

    def __init__(self) -> None:
        self.other = self


@pytest.fixture(autouse=True)
def _no_frozen_objects():
    """Each test starts and must end with nothing frozen (the test process freezes nothing)."""
    gc.unfreeze()
    yield
    assert gc.get_freeze_count() == 0


def test_files_read_as_faster_whisper_reads_them():
    for path in CLIP_PATHS[:3]:
        np.testing.assert_array_equal(checked_audio(path, 16000), decode_audio(path, sampling_rate=16000))


def test_collections_inside_free_what_was_made_inside_and_leave_older_objects_alone():
    older = _Node()
    watch_older = weakref.ref(older)
    with young_collections():
        assert gc.get_freeze_count() > 0
        young = _Node()
        watch_young = weakref.ref(young)
        del older, young
        gc.collect()  # what decode_audio does
        assert watch_young() is None, "a cycle made inside must still be freed"
        assert watch_older() is not None, "a cycle older than the block waits for a later collection"
    gc.collect()
    assert watch_older() is None, "after the block the older cycle is collectable again"


def test_overlapping_calls_share_one_freeze():
    """A second call inside the first (another thread, in practice) must not freeze the cycles
    made after the first one began: the first call's collection is there to free them."""
    with young_collections():
        frozen = gc.get_freeze_count()
        made_in_first = _Node()
        watch = weakref.ref(made_in_first)
        with young_collections():
            assert gc.get_freeze_count() == frozen
            del made_in_first
            gc.collect()
            assert watch() is None
        assert gc.get_freeze_count() == frozen  # the first call is still inside


def test_an_applications_own_frozen_objects_stay_frozen():
    kept = _Node()
    # As a pre-fork server does after loading: collect, then freeze. Garbage an earlier test
    # left in cycles would otherwise be frozen too, and its objects that die meanwhile (two
    # did, after the adaptation test's models) change the count without anything unfreezing.
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with young_collections():
            assert gc.get_freeze_count() == frozen
        checked_audio(CLIP_PATHS[0], 16000)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    del kept


def test_frozen_objects_return_even_when_reading_fails(tmp_path):
    bad = tmp_path / "not_audio.wav"
    bad.write_bytes(b"not audio at all")
    with pytest.raises(ValueError):
        checked_audio(str(bad), 16000)
    assert gc.get_freeze_count() == 0
