"""A patched-runtime Whisper model that loads at its first use.

With the stock worker on, the worker encodes every window and serves every call outside the
loop, and the engine and call routers send the first calls there (``routing``): the patched
model in the caller's process is used only by the loop (at float32 from its first probe on
fresh audio, a re-decode, or a decode that outgrows its audio), the engine router's first
probe of it, or a worker that fails. Loading it at construction took as long as the worker's
own load, before the worker started, so a process that transcribes one short file paid it for
nothing (docs/measurements.md, "Start-up"). ``DeferredWhisper`` answers what faster-whisper
and ct2-flash read at construction (compute type, device, languages, mel bins) from the
model's files, and loads the model when anything else is asked of it.

Only compute types whose resolution is certain without loading are deferred
(``deferred_compute_type``); everything else loads at once, as before.
"""

from __future__ import annotations

import contextlib
import threading
from typing import AbstractSet, Any, Callable, Iterator, Optional, Sequence

from ct2_flash.engine import forks
from ct2_flash.engine.model_files import CT2ModelFile, ModelFileError

# Requested compute types that CTranslate2 resolves to int8_float32 on a CPU with int8
# kernels, whatever type the model was saved in ("auto" picks the fastest supported).
_RESOLVED_TO_INT8 = ("int8", "int8_float32", "auto")
# Whisper vocabularies: English-only 51864 tokens, multilingual from 51865. CTranslate2 derives
# is_multilingual and num_languages from the vocabulary size the same way.
_MULTILINGUAL_VOCABULARY = 51865
_LANGUAGE_TOKENS_FROM = 51765


def deferred_compute_type(
    device: str,
    device_index: Any,
    compute_type: str,
    saved: AbstractSet[str],
    supported: Callable[[str], Sequence[str]],
    cuda_devices: Callable[[], int],
) -> Optional[str]:
    """The compute type ``ctranslate2.models.Whisper(device=device, compute_type=compute_type)``
    resolves to on a CPU, where that is certain without loading; None otherwise (another
    device, or a resolution that depends on more than this knows).

    Args:
        saved: the dtypes of the model's saved weights (``CT2ModelFile.weight_dtypes``).
        supported, cuda_devices: the runtime's ``get_supported_compute_types`` and
            ``get_cuda_device_count``.
    """
    if device == "auto":
        device = "cpu" if cuda_devices() == 0 else "cuda"
    if device != "cpu" or device_index not in (0, [0], (0,)):
        return None
    if compute_type in _RESOLVED_TO_INT8:
        return "int8_float32" if "int8" in supported("cpu") else None
    if compute_type == "float32":
        return "float32"
    # "default" keeps the saved type, and a float16 one becomes float32 where the CPU has no
    # float16 kernels; a quantized or bfloat16 model is left to the runtime.
    if compute_type != "default" or not saved or not saved <= {"float32", "float16"}:
        return None
    return None if "float16" in saved and "float16" in supported("cpu") else "float32"


class DeferredWhisper:
    """Stands in for ``load(model_path, **options)`` (a ``ctranslate2.models.Whisper`` on the
    CPU at ``compute_type``) until first used.

    ``compute_type``, ``device``, ``device_index``, ``is_multilingual``, ``num_languages`` and
    ``n_mels`` are read without loading: the last three from ``model.bin``'s header (the
    decoder embedding's rows, the first convolution's input channels), whose index is read
    whole, so a missing or truncated file raises ``ModelFileError`` here. ``model_is_loaded``
    says whether it has loaded; ``load_model()`` loads now. Any other attribute loads the model
    (once, under a lock) and is the model's. In a forked child a model the parent loaded is
    loaded again at first use (``engine.forks``), with the alignment heads it was given.
    """

    device = "cpu"

    def __init__(self, load: Callable[..., Any], model_path: str, compute_type: str, **options: Any) -> None:
        header = CT2ModelFile(model_path)
        if header.spec_name != "WhisperSpec":
            raise ModelFileError(f"{model_path} holds a {header.spec_name}, not a Whisper model")
        vocabulary_size = int(header["decoder/embeddings/weight"].shape[0])
        self.is_multilingual = vocabulary_size >= _MULTILINGUAL_VOCABULARY
        self.num_languages = vocabulary_size - _LANGUAGE_TOKENS_FROM - int(self.is_multilingual)
        self.n_mels = int(header["encoder/conv1/weight"].shape[1])  # [d_model, n_mels, width]
        self.compute_type = compute_type
        self.device_index = [0]
        self._load = load
        self._path = model_path
        self._options = options
        self._model = None
        self._loading = threading.Lock()
        self._alignment_heads: Optional[list] = None  # as last set: given again to a model loaded anew
        forks.forget_parent_in_children(self)

    @property
    def model_is_loaded(self) -> bool:
        return self._model is not None

    def load_model(self) -> Any:
        """The loaded model (loaded now if it was not)."""
        with self._loading:
            if self._model is None:
                model = self._load(self._path, device="cpu", compute_type=self.compute_type, **self._options)
                told = {
                    name: getattr(self, name) for name in ("compute_type", "is_multilingual", "num_languages", "n_mels")
                }
                found = {name: getattr(model, name) for name in told}
                if told != found:
                    # faster-whisper and the loop decided by what they were told (at float32
                    # the loop is exact, at int8 it does not run): a runtime that resolves
                    # otherwise would make those decisions wrong, so nothing runs on it.
                    raise RuntimeError(
                        f"ct2-flash: the patched model loaded as {found}, not {told} as read from "
                        f"its files; build the model with stock_engine=False, which loads it at "
                        f"once (and please report this)"
                    )
                if self._alignment_heads is not None:
                    model.set_alignment_heads(self._alignment_heads)
                self._model = model
        return self._model

    def set_alignment_heads(self, heads) -> None:
        """The model's ``set_alignment_heads``, remembered for a model loaded anew."""
        self.load_model().set_alignment_heads(heads)
        self._alignment_heads = list(heads)

    def forget_parent(self) -> None:
        """In a forked child: the parent's model runs on threads that did not come along, so it
        is kept, never destroyed (its destructor would join them), and loaded anew at first use."""
        self._loading = threading.Lock()  # another thread of the parent may have held it
        forks.keep_forever(self._model)
        self._model = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not the model's API (and this object's own, before __init__ set them)
            raise AttributeError(name)
        return getattr(self.load_model(), name)


def load_before_timing(model) -> None:
    """Load ``model`` now if it was deferred (a ``DeferredWhisper`` not yet used); any other
    model is left as it is. For callers about to time a call on it: the load is not the cost of
    the call a router is measuring."""
    if not getattr(model, "model_is_loaded", True):
        model.load_model()


class _ModelsSwitch:
    """Stands in for a module's ``ctranslate2`` global: the same module, except that
    ``models.Whisper`` called from a thread inside ``deferring_loads`` builds what that thread
    asked for. Other threads get the real class."""

    def __init__(self, runtime) -> None:
        self._runtime = runtime
        self.models = _ModelsNamespace(runtime.models)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


class _ModelsNamespace:
    building = threading.local()

    def __init__(self, models) -> None:
        self._models = models

    def Whisper(self, *args, **kwargs):  # noqa: N802 (the name it stands in for)
        build = getattr(self.building, "build", None)
        return (build or self._models.Whisper)(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._models, name)


_switching = threading.Lock()
_switched = {}  # module name -> [threads inside, its own ctranslate2 global]


@contextlib.contextmanager
def deferring_loads(module, build: Callable[..., Any]) -> Iterator[None]:
    """Inside, ``module.ctranslate2.models.Whisper(...)`` called from this thread is
    ``build(...)``: faster-whisper's constructor builds its model through its module's
    ``ctranslate2`` global, and this is how ct2-flash gives it a ``DeferredWhisper``. The
    global is switched while any thread is inside, and put back after the last leaves."""
    with _switching:
        entry = _switched.setdefault(module.__name__, [0, module.ctranslate2])
        if entry[0] == 0:
            module.ctranslate2 = _ModelsSwitch(entry[1])
        entry[0] += 1
    outer = getattr(_ModelsNamespace.building, "build", None)  # this thread's, if it is inside already
    _ModelsNamespace.building.build = build
    try:
        yield
    finally:
        _ModelsNamespace.building.build = outer
        with _switching:
            entry[0] -= 1
            if entry[0] == 0:
                module.ctranslate2 = entry[1]
                del _switched[module.__name__]
