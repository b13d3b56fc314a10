"""Audio checks before anything is decoded: one clear error for input faster-whisper would
turn into an engine error deep inside a call (or into silent nonsense).

faster-whisper takes a path, a file object or a 1-D float waveform at 16 kHz. What goes wrong
there today: NaN or infinite samples reach the int8 encoder and fail with "In
ChooseQuantizationParams, min should be less than or equal to max"; a 2-D array fails inside
the VAD's ONNX graph or gives a meaningless transcript; int16 samples are taken as floats 32,768
times too loud; a truncated or non-audio file fails somewhere in PyAV.

Also what the rest of the package asks of a window's audio: how many of its encoder frames hold
audio rather than padding (``audio_frames``); and faster-whisper's log-mel features computed
with numpy's BLAS at one thread (``OneThreadFeatures``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Any, Dict, Iterator, List, Optional

import numpy as np

# The bundled sample the demo transcribes and the drafter converter validates on.
SAMPLE_AUDIO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "sample.ogg")


class AudioError(ValueError):
    """The audio given to ``transcribe()`` cannot be decoded as speech.

    For a file PyAV cannot read, the error raised is also an instance of PyAV's own exception
    (``av.error.InvalidDataError`` for a file that is not audio), with its attributes
    (``errno``, ``filename``): a program written for faster-whisper that catches PyAV's errors
    catches it as before. ``readable_error`` makes it.
    """


# PyAV's exception class -> the class deriving from both AudioError and it (one per class, so
# that ``type(a) is type(b)`` holds for two unreadable files).
_UNREADABLE: Dict[type, type] = {}


def readable_error(error: Exception, message: str) -> Exception:
    """The exception to raise for ``error``, PyAV's, with ``message`` as its text: an AudioError
    that is also of ``type(error)`` (same ``args`` and attributes), or ``error`` itself, with
    ``message`` added as a note, for PyAV's OSError family (a class deriving from ValueError
    and OSError would skip OSError's ``__init__``: no ``errno``; they are OSErrors, as in
    faster-whisper) and wherever no class can derive from both."""
    kind = type(error)
    combined = _UNREADABLE.get(kind)
    if combined is None:
        combined = _UNREADABLE[kind] = kind if issubclass(kind, OSError) else _audio_error_of(kind)
    if combined is kind:
        error.add_note(message)
        return error
    try:
        readable = combined(*error.args)
    except Exception:  # a constructor that does not take its own args back
        error.add_note(message)
        return error
    readable.__dict__.update(getattr(error, "__dict__", {}))
    readable.message = message
    return readable


def _audio_error_of(kind: type) -> type:
    """The class deriving from AudioError and PyAV's ``kind`` (``kind`` itself where none can)."""
    try:
        return type(
            kind.__name__,
            (AudioError, kind),
            {
                "__module__": __name__,
                "__qualname__": f"AudioError[{kind.__qualname__}]",
                "__str__": lambda self: self.message,
                # The class is made here, so pickle rebuilds it through this module.
                "__reduce__": lambda self: (_rebuild, (kind, self.args, self.message)),
            },
        )
    except TypeError:
        return kind


def _rebuild(kind: type, args: tuple, message: str) -> Exception:
    """Unpickle what ``readable_error`` made."""
    return readable_error(kind(*args), message)


def checked_audio(audio: Any, sampling_rate: int) -> np.ndarray:
    """[samples] float32 mono waveform at ``sampling_rate`` from what ``transcribe()`` accepts.

    Args:
        audio: a path or file object (decoded with faster-whisper's ``decode_audio``, PyAV),
            or a 1-D floating-point array already at ``sampling_rate``.
    Raises:
        AudioError: an unreadable file (also an instance of PyAV's exception, see
            ``readable_error``), an array that is not 1-D, not floating point, or has NaN or
            infinite samples. Nothing has been decoded when it is raised. A missing file raises
            FileNotFoundError, a file PyAV fails to open for a reason of the system (its OSError
            family) that error with our message as a note, and empty audio is no error (no
            segments), all as in faster-whisper.
    """
    if not isinstance(audio, np.ndarray):
        from faster_whisper import decode_audio

        name = getattr(audio, "name", audio)
        try:
            with young_collections():
                return decode_audio(audio, sampling_rate=sampling_rate)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            raise  # already says what is wrong, as faster-whisper's own call would
        except Exception as error:  # PyAV raises many types for unreadable input
            raise readable_error(error, f"cannot read audio {name!r}: {type(error).__name__}: {error}") from error
    if audio.ndim != 1:
        raise AudioError(
            f"expected a 1-D mono waveform at {sampling_rate} Hz, got an array of shape {audio.shape} "
            "(mix the channels down, for example audio.mean(axis=...))"
        )
    if not np.issubdtype(audio.dtype, np.floating):
        hint = " (int16 PCM: divide by 32768 into float32)" if np.issubdtype(audio.dtype, np.integer) else ""
        raise AudioError(f"expected floating-point samples in [-1, 1], got dtype {audio.dtype}{hint}")
    bad = int(np.count_nonzero(~np.isfinite(audio)))
    if bad:
        raise AudioError(f"the waveform has {bad} NaN or infinite samples (of {audio.size})")
    return audio.astype(np.float32, copy=False)


def check_features(features: Any) -> None:
    """Raise AudioError when log-mel features readable on the host are not all finite.

    The last line of defence for paths that do not go through ``checked_audio`` (faster-whisper's
    ``BatchedInferencePipeline`` computes features itself): NaN samples give NaN features, which
    the float32 encoder turns into a transcript of nonsense and the int8 one into an engine
    error. Features on a GPU are not checked.
    """
    try:
        array = np.asarray(features)
    except (TypeError, ValueError, RuntimeError, AttributeError):  # not on the host
        return
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise AudioError("the audio has NaN or infinite samples (its log-mel features are not finite)")


_freezing = threading.Lock()
_freezers = 0  # calls inside ``young_collections`` sharing the freeze, across threads


@contextlib.contextmanager
def young_collections() -> Iterator[None]:
    """Inside the block, a full garbage collection examines only the objects made in it.

    faster-whisper's ``decode_audio`` ends with ``gc.collect()``: PyAV's resampler leaves
    reference cycles that hold native buffers. A full collection walks every object the
    process tracks, and once faster-whisper is imported that takes longer than decoding a
    short clip (docs/history.md, "Reading audio files"). The cycles it is there for are made during
    the call, so the objects that exist before it are frozen (``gc.freeze``) for its length
    and returned to the oldest generation after (``gc.unfreeze``): the collection still frees
    the resampler's cycles, and older garbage waits for the next automatic collection. Where
    the application keeps frozen objects of its own (``gc.get_freeze_count() > 0``, as
    pre-fork servers do), nothing is touched, since unfreezing would hand its heap back to the
    collector. Threads share one freeze: the first in freezes, the last out unfreezes.
    """
    global _freezers
    with _freezing:
        # A second thread joins the first one's freeze: freezing again would freeze the
        # cycles the first thread's collection is there to free.
        joined = _freezers > 0 or gc.get_freeze_count() == 0
        if joined:
            if _freezers == 0:
                gc.freeze()
            _freezers += 1
    try:
        yield
    finally:
        if joined:
            with _freezing:
                _freezers -= 1
                if _freezers == 0:
                    gc.unfreeze()


def audio_frames(features) -> Optional[List[int]]:
    """Per row of [batch, n_mels, 3000] log-mel features, the encoder frames that hold audio.

    faster-whisper pads every window to 30 s with exact zeros (``pad_or_trim``), and a column
    of real audio is never all zeros in the normalised log-mel scale, so the audio ends after
    the last column with a non-zero value. The encoder halves the frame rate. None when the
    features are not readable on the host (a GPU StorageView).
    """
    try:
        array = np.asarray(features)
    except (TypeError, ValueError, RuntimeError, AttributeError):  # not on the host
        return None
    if array.ndim != 3:
        return None
    columns = np.any(array != 0, axis=1)  # [batch, mel frames]
    last = np.where(columns.any(axis=1), array.shape[2] - np.argmax(columns[:, ::-1], axis=1), 0)
    return [int(-(-frames // 2)) for frames in last]


_blas_lock = threading.Lock()
_blas: Any = None  # numpy's BLAS libraries (threadpoolctl), found at the first call


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Inside the block, numpy's BLAS runs on one thread (``threadpoolctl``), one block at a time
    across the process's threads: OpenBLAS's thread count is the whole process's, and
    threadpoolctl lets one thread at a time change it (another thread's change is ignored while
    one holds it). BLAS calls of other threads meanwhile run on one thread too."""
    global _blas
    with _blas_lock:
        if _blas is None:
            from threadpoolctl import ThreadpoolController

            _blas = ThreadpoolController().select(user_api="blas")
        with _blas.limit(limits=1):
            yield


class OneThreadFeatures:
    """faster-whisper's ``FeatureExtractor`` (``extractor``), its log-mel features computed with
    numpy's BLAS at one thread (``one_blas_thread``); every attribute is the extractor's.

    The features' one matrix product (the mel filters over the power spectrum) runs in BLAS,
    whose threads, left spinning for more work after it, take cores from the engine's work
    (docs/measurements.md, "Batching"). The features are the same bytes on one thread as on
    several (docs/exactness.md, "Features"; ``tests/test_whisper_model.py`` checks it).
    """

    def __init__(self, extractor) -> None:
        object.__setattr__(self, "extractor", extractor)

    def __call__(self, *args, **kwargs):
        with one_blas_thread():
            return self.extractor(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.extractor, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.extractor, name, value)
