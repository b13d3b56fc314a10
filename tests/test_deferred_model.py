"""The patched model deferred until first used (``engine.deferred_model``): what it answers
without loading is what the runtime loads, only certain compute types are deferred, and
faster-whisper's module gets its own ``ctranslate2`` back."""

import gc
import shutil
import threading
import types

import ctranslate2
import faster_whisper
import pytest

from ct2_flash import FlashWhisperModel, available_models, resolve_model
from ct2_flash.adapter import speculative_whisper
from ct2_flash.drafting.files import CheckpointError
from ct2_flash.engine.deferred_model import DeferredWhisper, deferred_compute_type, deferring_loads
from ct2_flash.engine.model_files import CT2ModelFile, ModelFileError
from ct2_flash.stock.client import StockEngine

from .conftest import THREADS

READ_FROM_FILES = ("compute_type", "device", "device_index", "is_multilingual", "num_languages", "n_mels")


def _resolved(
    device="cpu", index=0, asked="int8", saved=("float16",), supported=("float32", "int8", "int8_float32"), gpus=0
):
    return deferred_compute_type(device, index, asked, set(saved), lambda device: supported, lambda: gpus)


def test_only_what_surely_resolves_on_the_cpu_is_deferred():
    for asked in ("int8", "int8_float32", "auto"):
        assert _resolved(asked=asked) == "int8_float32"
        assert _resolved(asked=asked, saved=("int8", "float32")) == "int8_float32"
    assert _resolved(device="auto") == "int8_float32"
    assert _resolved(device="auto", gpus=1) is None  # faster-whisper's "auto" means CUDA there
    assert _resolved(device="cuda") is None
    assert _resolved(index=[0, 1]) is None
    assert _resolved(supported=("float32",)) is None  # a CPU without int8 kernels
    assert _resolved(asked="float32", saved=("int8", "float32")) == "float32"
    # "default" keeps what was saved: float16 becomes float32 on a CPU without float16 kernels.
    assert _resolved(asked="default") == _resolved(asked="default", saved=("float32",)) == "float32"
    assert _resolved(asked="default", supported=("float32", "float16")) is None
    for saved in (("int8", "float32"), ("int16", "float32"), ("bfloat16",), ()):
        assert _resolved(asked="default", saved=saved) is None, saved
    for asked in ("int8_float16", "int16", "float16", "bfloat16"):
        assert _resolved(asked=asked) is None, asked


@pytest.mark.parametrize(
    "name",
    [
        "tiny.en",
        pytest.param(
            "base",
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif("base" not in available_models(), reason="the multilingual base is not installed"),
            ],
        ),
    ],
)
def test_what_it_reads_from_the_files_is_what_the_runtime_loads(name):
    path = resolve_model(name)
    saved = CT2ModelFile(path).weight_dtypes()
    for asked in ("int8", "auto", "default", "float32"):
        resolved = deferred_compute_type(
            "cpu", 0, asked, saved, ctranslate2.get_supported_compute_types, ctranslate2.get_cuda_device_count
        )
        deferred = DeferredWhisper(ctranslate2.models.Whisper, path, resolved, intra_threads=1)
        told = {attribute: getattr(deferred, attribute) for attribute in READ_FROM_FILES}
        assert not deferred.model_is_loaded
        loaded = ctranslate2.models.Whisper(path, compute_type=asked, intra_threads=1)
        assert {attribute: getattr(loaded, attribute) for attribute in READ_FROM_FILES} == told, asked
    assert deferred.is_multilingual == (name == "base")
    assert deferred.load_model() is deferred.load_model()  # loaded once
    assert deferred.model_is_loaded and deferred.encode is not None  # the model's own methods now


def test_a_runtime_that_loads_otherwise_than_it_was_told_is_refused(model_path):
    deferred = DeferredWhisper(ctranslate2.models.Whisper, model_path, "int8_float32", intra_threads=1)
    deferred.is_multilingual = True  # as a rule that no longer held would have told it
    with pytest.raises(RuntimeError, match="loaded as .*'is_multilingual': False.*stock_engine=False"):
        deferred.load_model()


def test_the_switch_serves_only_the_thread_that_asked_and_puts_the_module_back():
    class Model:
        def __init__(self, *args, **kwargs):
            self.args = args

    runtime = types.SimpleNamespace(models=types.SimpleNamespace(Whisper=Model), StorageView="the runtime's")
    module = types.SimpleNamespace(__name__="a_client", ctranslate2=runtime)
    seen = {}
    with deferring_loads(module, lambda *args, **kwargs: "deferred"):
        assert module.ctranslate2 is not runtime and module.ctranslate2.StorageView == "the runtime's"
        assert module.ctranslate2.models.Whisper("path") == "deferred"
        other = threading.Thread(target=lambda: seen.update(built=module.ctranslate2.models.Whisper("path")))
        other.start()
        other.join()
        with deferring_loads(module, lambda *args, **kwargs: "nested"):
            assert module.ctranslate2.models.Whisper("path") == "nested"
        assert module.ctranslate2.models.Whisper("path") == "deferred"  # still switched, the outer build back
    assert isinstance(seen["built"], Model)
    assert module.ctranslate2 is runtime
    with pytest.raises(KeyError), deferring_loads(module, lambda *args, **kwargs: None):
        raise KeyError("a failed construction")
    assert module.ctranslate2 is runtime


def test_files_that_cannot_load_raise_faster_whispers_error_at_construction(model_path, tmp_path):
    with pytest.raises(ModelFileError, match="no CTranslate2 model file"):
        DeferredWhisper(ctranslate2.models.Whisper, str(tmp_path), "int8_float32")
    broken = tmp_path / "truncated"
    shutil.copytree(model_path, broken)
    with open(broken / "model.bin", "r+b") as stream:
        stream.truncate(30_000_000)
    for build in (faster_whisper.WhisperModel, FlashWhisperModel):
        with pytest.raises(RuntimeError, match="model.bin is incomplete"):
            build(str(broken), compute_type="int8", cpu_threads=THREADS)
    assert faster_whisper.transcribe.ctranslate2 is ctranslate2


def test_the_worker_started_before_faster_whispers_constructor_stops_when_construction_fails(
    model_path, tmp_path, monkeypatch
):
    """At int8 the worker starts first (nothing in this process loads a model); a constructor
    that raises after that (here: a drafter directory that does not exist) leaves no worker."""
    started = []
    original = StockEngine.start
    monkeypatch.setattr(StockEngine, "start", lambda engine: (started.append(engine), original(engine)))
    with pytest.raises(CheckpointError, match="does not exist"):
        FlashWhisperModel(model_path, compute_type="int8", cpu_threads=THREADS, drafter=str(tmp_path / "none"))
    gc.collect()
    assert len(started) == 1 and not started[0].running


def test_the_loops_first_call_loads_the_model_before_its_timer_starts(model_path, clips, monkeypatch):
    """At float32 the loop's first call loads the deferred model and solves the recovery
    outside the time the call router measures it by (else one load would make the loop look
    slower than it is)."""
    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS, adaptive=False)
    runtime = flash.decoder.runtime
    assert not flash.reference_model.model_is_loaded and runtime._recovery_pinv is None
    ready_when_timed = []

    class Watched(speculative_whisper.Stopwatch):
        def __enter__(self):
            ready_when_timed.append(runtime.model.model_is_loaded and runtime._recovery_pinv is not None)
            return super().__enter__()

    monkeypatch.setattr(speculative_whisper, "Stopwatch", Watched)
    list(flash.transcribe(clips["clip00_kal16.ogg"], beam_size=1)[0])
    assert flash.spec_stats.target_calls > 0  # it ran in the loop
    assert ready_when_timed[-1]  # the generate() call's timer (the encoder's came before)
    flash.model.engines.close()


def test_a_forked_child_loads_the_model_anew_with_its_alignment_heads():
    """In a forked child (``forget_parent``, run by ``engine.forks`` at each fork) the parent's
    loaded model is kept, never destroyed, and the next use loads another, given the alignment
    heads the first was given last."""
    loaded = []

    class Model(types.SimpleNamespace):
        def set_alignment_heads(self, heads):
            self.heads = list(heads)

    def load(path, **options):
        model = Model(
            compute_type=options["compute_type"], is_multilingual=False, num_languages=99, n_mels=80, heads=None
        )
        loaded.append(model)
        return model

    deferred = DeferredWhisper(load, resolve_model("tiny.en"), "float32")
    deferred.set_alignment_heads([(2, 1), (3, 0)])
    first = loaded[0]
    assert first.heads == [(2, 1), (3, 0)] and deferred.model_is_loaded
    deferred.forget_parent()
    assert not deferred.model_is_loaded and len(loaded) == 1
    assert deferred.load_model() is loaded[1] and loaded[1].heads == [(2, 1), (3, 0)]
