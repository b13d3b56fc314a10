"""The stock engine's worker: same outputs as the patched runtime alone, and every way it can
fail ends in one warning and the patched runtime's output, never in a hang or a lost call."""

import gc
import logging
import os
import platform
import signal
import threading
import time

import numpy as np
import pytest

from ct2_flash import FlashWhisperModel
from ct2_flash.adapter.routing import EngineRouter
from ct2_flash.stock import client, protocol
from ct2_flash.stock.allocator import find_tcmalloc, loaded_allocator
from ct2_flash.stock.client import RemoteEncoding, StockEngine, worker_allocator
from ct2_flash.stock.location import STOCK_CTRANSLATE2, installed

from .conftest import THREADS, segments_of

SHORT = ("clip00_kal16.ogg", "clip04_slt.ogg", "clip12_awb.ogg")


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def stock_flash(model_path):
    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS, stock_engine=True)
    yield flash
    flash.model.engines.close()


def test_the_stock_release_is_installed_beside_the_patched_runtime():
    import ctranslate2

    assert installed(), "bash scripts/install.sh installs it (python -m ct2_flash.stock)"
    assert hasattr(ctranslate2.models.Whisper, "forward_batch")  # this process keeps the patched one


def test_worker_answers_as_the_patched_runtime_does(model_path, float32_pair, clips):
    """Encoder output, greedy and beam tokens, alignment: the worker (stock 4.8.5) against the
    patched runtime on the same features."""
    import ctranslate2

    flash = float32_pair.flash
    features = flash.window_features(clips["clip12_awb.ogg"])[None]
    engine = StockEngine(model_path, "float32", THREADS)
    try:
        remote = engine.encode(features)
        assert isinstance(remote, RemoteEncoding) and engine.version == STOCK_CTRANSLATE2
        # The worker's C library keeps freed memory for the next call (worker.keep_freed_memory);
        # every comparison here and below is made with it.
        assert engine.keeps_freed_memory is (platform.libc_ver()[0] == "glibc")
        # It runs tcmalloc where installed (.ci/run installs it), read from its memory maps.
        expected = "tcmalloc" if find_tcmalloc() else "glibc"
        assert engine.allocator == expected == loaded_allocator(engine._process.pid)
        # Nor does it import numpy (its start is on the first call's path).
        assert "_multiarray_umath" not in open(f"/proc/{engine._process.pid}/maps").read()
        local = flash.reference_model.encode(ctranslate2.StorageView.from_array(features))
        np.testing.assert_allclose(engine.fetch(remote), np.asarray(local), rtol=0, atol=1e-4)
        for options in ({"beam_size": 1}, {"beam_size": 5, "return_scores": True}):
            mine = engine.generate(remote, [[50257]], dict(options))[0]
            theirs = flash.reference_model.generate(local, [[50257]], **options)[0]
            assert mine.sequences_ids == theirs.sequences_ids and mine.sequences == theirs.sequences
        tokens = mine.sequences_ids[0]
        aligned = engine.align(remote, [50257], [tokens], [1500])[0]
        reference = flash.reference_model.align(local, [50257], [tokens], [1500])[0]
        assert aligned.alignments == [tuple(pair) for pair in reference.alignments]
        np.testing.assert_allclose(aligned.text_token_probs, reference.text_token_probs, atol=1e-4)
        # The engine's own errors come back as errors, as in-process.
        with pytest.raises(RuntimeError, match="multilingual"):
            engine.detect_language(remote)
    finally:
        engine.close()


@pytest.mark.parametrize(
    "options, names",
    [
        ({"beam_size": 1}, SHORT),
        ({"beam_size": 5}, SHORT[:1]),
        ({"beam_size": 1, "word_timestamps": True}, SHORT[2:]),
        pytest.param({"beam_size": 1}, None, marks=pytest.mark.slow),
        pytest.param({"beam_size": 5}, None, marks=pytest.mark.slow),
        pytest.param({"beam_size": 1, "word_timestamps": True}, None, marks=pytest.mark.slow),
    ],
    ids=["greedy", "beam", "words", "greedy-all", "beam-all", "words-all"],
)
def test_model_with_the_worker_gives_the_same_segments(stock_flash, float32_pair, clips, options, names):
    stock_flash.reset_spec_stats()
    for name in names or clips:
        assert segments_of(stock_flash, clips[name], **options) == float32_pair.reference(
            name, clips[name], **options
        ), name
    engines = stock_flash.model.engines
    assert engines.stock.running and engines.stock_failures == 0


def test_the_workers_allocator_follows_the_memory_setting_and_the_variable(monkeypatch):
    monkeypatch.delenv("CT2_FLASH_WORKER_ALLOCATOR", raising=False)
    assert worker_allocator(keep_freed_memory=True).library == find_tcmalloc()
    assert worker_allocator(keep_freed_memory=False).library is None  # freed memory goes back: glibc
    monkeypatch.setenv("CT2_FLASH_WORKER_ALLOCATOR", "glibc")
    assert worker_allocator(keep_freed_memory=True).library is None
    monkeypatch.setenv("CT2_FLASH_WORKER_ALLOCATOR", "jemalloc")
    with pytest.raises(ValueError, match="'tcmalloc' or 'glibc'"):
        worker_allocator(keep_freed_memory=True)


class OnePatched(EngineRouter):
    """Every greedy call on the patched runtime while ``forced``; the default's choice otherwise."""

    def __init__(self, forced: bool = True) -> None:
        super().__init__(measure=True)
        self.forced = forced

    def use_patched(self, batch_size):
        return self.forced or super().use_patched(batch_size)


def test_greedy_calls_run_on_the_engine_the_router_picks(model_path, float32_pair, clips):
    """Greedy generate() on the patched runtime, over one copy of the worker's encoding per
    window; beam search stays in the worker."""
    from .test_routing import ForcedGenerate

    # Every call outside the loop (no re-decodes: their router tries the loop first).
    flash = FlashWhisperModel(
        model_path,
        compute_type="float32",
        cpu_threads=THREADS,
        stock_engine=True,
        call_router=ForcedGenerate(),
        engine_router=OnePatched(),
        redecodes=False,
    )
    engines = flash.model.engines
    name = SHORT[0]
    for options in ({"beam_size": 1}, {"beam_size": 1}, {"beam_size": 5}):
        assert segments_of(flash, clips[name], **options) == float32_pair.reference(name, clips[name], **options)
    windows = 3  # one each (a short clip); the copy is fetched once per window
    assert engines.generate_calls["patched"] >= 2
    assert engines.generate_calls["stock"] >= 1  # the beam search
    assert engines.stock.timings["fetch"][0] <= windows
    engines.close()


@pytest.fixture(scope="module")
def stock_faster_whisper(model_path):
    """compute type -> faster-whisper on stock ctranslate2 (this environment's faster-whisper
    with the stock release first on its path), in a worker process."""
    from ct2_flash.benchmark.stock import StockWorker, local_baseline

    workers = {}

    def worker(compute_type):
        if compute_type not in workers:
            python, path = local_baseline()
            workers[compute_type] = StockWorker(python, model_path, compute_type, THREADS, path)
        return workers[compute_type]

    yield worker
    for worker in workers.values():
        worker.close()


@pytest.mark.parametrize("compute_type", ["int8", "float32"])
def test_the_default_model_is_faster_whisper_on_stock_ctranslate2(
    stock_faster_whisper, clips, model_path, compute_type
):
    """What users run today is the reference: the default model (worker on) gives its tokens,
    also with every greedy call on the patched runtime (from the worker's encoder output)."""
    router = OnePatched(forced=False)
    flash = FlashWhisperModel(model_path, compute_type=compute_type, cpu_threads=THREADS, engine_router=router)
    stock = stock_faster_whisper(compute_type)
    assert stock.version == STOCK_CTRANSLATE2
    engines = flash.model.engines
    for forced in (False, True):
        router.forced = forced
        flash.forget_windows()  # the second pass is not a re-decode (their router tries the loop first)
        for name in SHORT[1:]:
            expected = stock.measure(name, clips[name], seed=0, beam_size=1).tokens
            assert [list(s.tokens) for s in flash.transcribe(clips[name], beam_size=1)[0]] == expected, name
        # The patched model loads when the router first sends a call to it, not before.
        assert flash.reference_model.model_is_loaded == forced
    assert engines.generate_calls["patched"] > 0  # (the loop may take a call at float32)
    assert engines.stock.running and engines.stock_failures == 0
    engines.close()


def test_the_default_engine_router_keeps_greedy_calls_in_the_worker():
    default, measuring = EngineRouter(), EngineRouter(measure=True)
    for router in (default, measuring):
        for _ in range(40):  # the patched runtime measured twice as fast as the worker
            patched = router.use_patched(1)
            router.record(patched, 1, 0.005 if patched else 0.010, 100)
    assert not default.use_patched(1) and default.patched_cost is None
    assert measuring.use_patched(1)


def test_int8_through_the_worker_is_faster_whispers_output(model_path, clips):
    """At int8 every call goes outside the loop, so here the worker serves the whole path."""
    from .conftest import _PAIRS, ModelPair

    pair = _PAIRS.setdefault("int8", None) or ModelPair(model_path, "int8")
    _PAIRS["int8"] = pair
    flash = FlashWhisperModel(model_path, compute_type="int8", cpu_threads=THREADS, stock_engine=True)
    for name in SHORT:
        assert segments_of(flash, clips[name], beam_size=1) == pair.reference(name, clips[name], beam_size=1), name
    assert flash.model.engines.stock.running and flash.model.engines.stock_failures == 0
    assert not flash.reference_model.model_is_loaded  # nothing needed the patched model (engine.deferred_model)


def test_a_model_used_in_a_forked_child_gives_the_same_segments(model_path, clips):
    """A process forked from one that built the model and transcribed with it (the patched
    model not loaded: engine.deferred_model) transcribes with it through a worker of its own,
    with the parent's segments; the parent's worker serves on."""
    flash = FlashWhisperModel(model_path, compute_type="int8", cpu_threads=THREADS, stock_engine=True)
    stock = flash.model.engines.stock
    try:
        name = SHORT[0]
        expected = segments_of(flash, clips[name], beam_size=1)
        worker = stock._process.pid

        def child() -> bool:
            same = segments_of(flash, clips[name], beam_size=1) == expected
            own = stock._process.pid != worker and stock.restarts == 0 and flash.model.engines.stock_failures == 0
            stock.close()
            return same and own

        assert _in_a_forked_child(child) == 0
        assert segments_of(flash, clips[name], beam_size=1) == expected
        assert stock._process.pid == worker and stock.restarts == 0 and not flash.reference_model.model_is_loaded
    finally:
        stock.close()


def test_a_forked_child_runs_the_loop_on_models_and_drafter_sessions_of_its_own(model_path, clips):
    """The parent ran the loop (float32, every call speculative), so its patched model and
    drafter sessions are loaded, on threads a forked child does not have: the child loads and
    opens its own at first use (engine.forks) and gets the parent's segments; before, its
    first call waited forever."""
    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS, adaptive=False)
    try:
        name = SHORT[1]
        expected = segments_of(flash, clips[name], beam_size=1)
        assert flash.reference_model.model_is_loaded and flash.model.stats.target_calls > 0

        def child() -> bool:
            calls = flash.model.stats.target_calls
            same = segments_of(flash, clips[name], beam_size=1) == expected
            return same and flash.model.stats.target_calls > calls and flash.reference_model.model_is_loaded

        assert _in_a_forked_child(child, within=60.0) == 0
        assert segments_of(flash, clips[name], beam_size=1) == expected
    finally:
        flash.model.engines.close()


def test_a_killed_worker_loses_nothing_and_is_started_again(model_path, float32_pair, clips, caplog):
    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS, stock_engine=True)
    engine = flash.model.engines.stock
    name = "clip12_awb.ogg"
    expected = float32_pair.reference(name, clips[name], beam_size=1)
    assert segments_of(flash, clips[name], beam_size=1) == expected
    first = engine._process.pid
    # Killed while transcribing: encodings it held are gone, the patched runtime takes over.
    killer = threading.Timer(0.05, os.kill, (first, signal.SIGKILL))
    with caplog.at_level(logging.WARNING, logger="ct2_flash"):
        killer.start()
        for _ in range(3):
            assert segments_of(flash, clips[name], beam_size=1) == expected
        killer.join()
    assert not _alive(first)
    assert engine.running and engine._process.pid != first and engine.restarts == 1  # started again
    assert flash.model.engines.stock_failures >= 1
    assert len([r for r in caplog.records if "patched runtime serves this call" in r.getMessage()]) == 1
    worker = engine._process.pid
    del flash, engine
    gc.collect()
    assert not _alive(worker)  # stopped with the model, no zombie


def test_a_hung_worker_times_out(model_path, float32_pair, clips, monkeypatch):
    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS, stock_engine=True)
    name = "clip04_slt.ogg"
    expected = float32_pair.reference(name, clips[name], beam_size=1)
    assert segments_of(flash, clips[name], beam_size=1) == expected
    # Short only now: on a loaded machine the load or a window can take more than 2 s.
    monkeypatch.setattr(client, "REQUEST_TIMEOUT", 2.0)
    hung = flash.model.engines.stock._process.pid
    os.kill(hung, signal.SIGSTOP)
    try:
        assert segments_of(flash, clips[name], beam_size=1) == expected
    finally:
        try:
            os.kill(hung, signal.SIGCONT)
        except ProcessLookupError:  # killed at the deadline, as it should be
            pass
    assert not _alive(hung)  # killed after the deadline
    flash.model.engines.close()


def test_a_missing_stock_engine_warns_once_and_changes_nothing(
    model_path, float32_pair, clips, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("CT2_FLASH_STOCK_DIR", str(tmp_path / "nowhere"))
    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS, stock_engine=True)
    with caplog.at_level(logging.WARNING, logger="ct2_flash"):
        for name in SHORT[:2]:
            assert segments_of(flash, clips[name], beam_size=1) == float32_pair.reference(
                name, clips[name], beam_size=1
            )
    warnings = [r.getMessage() for r in caplog.records if "stock ctranslate2 is not installed" in r.getMessage()]
    assert len(warnings) == 1 and "scripts/install.sh" in warnings[0]
    assert flash.model.engines.stock.disabled and not flash.model.engines.stock.running


def _break(failure, tmp_path, monkeypatch):
    """Make the stock engine fail one way before a model is made."""
    if failure == "broken install":  # installed as far as the files show, but its import fails
        package = tmp_path / "stock" / "ctranslate2"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("raise ImportError('a broken stock install')\n")
        (tmp_path / "stock" / f"ctranslate2-{STOCK_CTRANSLATE2}.dist-info").mkdir()
        monkeypatch.setenv("CT2_FLASH_STOCK_DIR", str(tmp_path / "stock"))
    elif failure == "unloadable model":  # a model directory the stock release cannot read
        original = StockEngine.__init__

        def init(self, model_path, *args, **kwargs):
            original(self, str(tmp_path / "not a model"), *args, **kwargs)

        monkeypatch.setattr(StockEngine, "__init__", init)
    else:  # /dev/shm full: no block for the features

        def full(self, size):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(protocol.Blocks, "create", full)


@pytest.mark.parametrize(
    "failure, message",
    [
        pytest.param("broken install", "did not start", marks=pytest.mark.slow),
        pytest.param("unloadable model", "could not load", marks=pytest.mark.slow),
        ("no shared memory", "shared memory of"),
    ],
)
def test_a_stock_engine_that_cannot_serve_warns_once_and_changes_nothing(
    model_path, float32_pair, clips, tmp_path, monkeypatch, caplog, failure, message
):
    _break(failure, tmp_path, monkeypatch)
    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS)
    with caplog.at_level(logging.WARNING, logger="ct2_flash"):
        for name in SHORT[:2]:
            assert segments_of(flash, clips[name], beam_size=1) == float32_pair.reference(
                name, clips[name], beam_size=1
            )
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "patched runtime serves" in r.getMessage()
    ]
    assert len(warnings) == 1 and message in warnings[0], warnings
    assert flash.model.engines.stock_failures >= 1
    flash.model.engines.close()


def test_four_threads_share_one_worker(model_path, float32_pair, clips):
    from concurrent.futures import ThreadPoolExecutor

    flash = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=THREADS, num_workers=4, stock_engine=True)
    names = list(SHORT) * 2 + ["clip06_awb.ogg", "clip09_kal16.ogg"]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda name: segments_of(flash, clips[name], beam_size=1), names))
    assert got == [float32_pair.reference(name, clips[name], beam_size=1) for name in names]
    assert flash.model.engines.stock_failures == 0
    flash.model.engines.close()


def _in_parallel(count: int, function) -> list:
    """``function(index)`` on ``count`` threads released together; results (or exceptions) in order."""
    barrier = threading.Barrier(count)
    results = [None] * count

    def run(index):
        barrier.wait()
        try:
            results[index] = function(index)
        except Exception as error:  # handed back to the test
            results[index] = error

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_the_worker_serves_inter_threads_requests_at_once(model_path, float32_pair, clips):
    """Two threads' requests run in the worker at the same time (one per replica of the model),
    each answered with its own result: served one at a time, the worker's own seconds for the
    two could never add up to more than the wall time that held them both."""
    names = ["clip12_awb.ogg", "clip04_slt.ogg"]
    features = [float32_pair.flash.window_features(clips[name])[None] for name in names]
    engine = StockEngine(model_path, "float32", intra_threads=1, inter_threads=2)
    try:
        alone = [engine.generate(engine.encode(f), [[50257]], {"beam_size": 5})[0].sequences_ids for f in features]
        assert alone[0] != alone[1]
        overlapped = 0
        for _ in range(10):  # a busy host may serialise a pair now and then: one overlap suffices
            seconds = engine.timings["generate"][2]
            started = time.perf_counter()
            got = _in_parallel(
                2,
                lambda index: (
                    engine.generate(engine.encode(features[index]), [[50257]], {"beam_size": 5})[0].sequences_ids
                ),
            )
            wall = time.perf_counter() - started
            assert got == alone  # each thread its own answer
            overlapped += engine.timings["generate"][2] - seconds > wall
            if overlapped:
                break
        assert overlapped >= 1
        assert engine.restarts == 0 and len(engine._free) == 2  # a block per request in flight, reused
    finally:
        engine.close()


def test_a_worker_dying_under_two_requests_fails_both_and_starts_once(model_path, float32_pair, clips):
    features = float32_pair.flash.window_features(clips["clip12_awb.ogg"])[None]
    engine = StockEngine(model_path, "float32", intra_threads=1, inter_threads=2)
    try:
        remote = engine.encode(features)
        first = engine._process.pid
        os.kill(first, signal.SIGSTOP)  # both requests are sent before it dies
        results = []
        asking = threading.Thread(
            target=lambda: results.extend(
                _in_parallel(2, lambda index: engine.generate(remote, [[50257]], {"beam_size": 1}))
            )
        )
        asking.start()
        deadline = time.monotonic() + 30
        while len(engine._channel._calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(engine._channel._calls) == 2
        os.kill(first, signal.SIGKILL)
        asking.join()
        assert [type(r) for r in results] == [client.StockUnavailable] * 2, results
        assert not _alive(first) and not engine.holds(remote)
        again = engine.generate(engine.encode(features), [[50257]], {"beam_size": 1})  # a new worker, started once
        assert again[0].sequences_ids and engine.restarts == 1 and engine._process.pid != first
        second = engine._process.pid
        assert _reader_ended(first) and not _reader_ended(second, within=0)  # the dead one's ended with its pipe
    finally:
        engine.close()
    assert _reader_ended(second)


def _reader_ended(pid: int, within: float = 5.0) -> bool:
    """Whether the client's reader thread for worker ``pid`` has ended, or does within ``within`` s."""
    deadline = time.monotonic() + within
    while any(thread.name == f"ct2-flash stock worker {pid}" for thread in threading.enumerate()):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


_FAKE_WORKER = """
import json, sys
for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "load":
        sys.stdout.write(json.dumps({"id": request["id"], "ready": True, "version": "4.8.5"}) + "\\n")
    else:
        sys.stdout.write(%r + "\\n")
    sys.stdout.flush()
"""


@pytest.mark.parametrize("answer", ["not JSON", "[1, 2]", '{"id": 99, "shape": [1]}'])
def test_a_worker_answering_garbage_fails_the_request_and_is_killed(model_path, tmp_path, monkeypatch, answer):
    """A worker that loads, then answers with something that is not an answer to the request."""
    script = tmp_path / "worker.py"
    script.write_text(_FAKE_WORKER % answer)
    monkeypatch.setattr(client, "WORKER", str(script))
    engine = StockEngine(model_path, "float32", 1)
    try:
        with pytest.raises(client.StockUnavailable, match="stopped answering"):
            engine.encode(np.zeros((1, 80, 3000), np.float32))
        assert engine.version == "4.8.5" and not engine.running and engine._died
    finally:
        engine.close()


def _shared_blocks_mapped(pid: int) -> set:
    """The names of the shared-memory blocks process ``pid`` maps (Python's, unlinked or not)."""
    with open(f"/proc/{pid}/maps") as maps:
        paths = (line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6)
        return {os.path.basename(path.replace(" (deleted)", "")) for path in paths if path.startswith("/dev/shm/psm_")}


@pytest.mark.parametrize("error, raised", [(28, True), (95, False)])
def test_a_block_that_shared_memory_cannot_hold_is_refused_at_once(monkeypatch, error, raised):
    """/dev/shm full (ENOSPC from allocating the block's pages): an OSError at creation and
    nothing left behind, not a SIGBUS at the first write past the limit (checked by hand on a
    4 MB /dev/shm: the writing process died with it before). A file system that cannot allocate
    ahead (EOPNOTSUPP) gets the block as before."""
    before = set(os.listdir("/dev/shm"))

    def fallocate(fd, offset, length):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(protocol.os, "posix_fallocate", fallocate)
    blocks = protocol.Blocks(owner=True)
    try:
        if raised:
            with pytest.raises(OSError, match="No space"):
                blocks.create(1 << 20)
        else:
            block = blocks.create(1 << 20)
            np.ndarray((4,), np.float32, buffer=block.buf)[...] = 1.0
            del block
    finally:
        blocks.close()
    assert set(os.listdir("/dev/shm")) == before


def test_a_block_smaller_than_its_array_is_refused_by_the_worker(model_path):
    """The worker reads and writes blocks by address (it has no numpy to check a view's size):
    a block smaller than the array a request names is an error answer, not a write past the
    mapping, and the worker goes on serving."""
    engine = StockEngine(model_path, "float32", 1)
    try:
        encoding = engine.encode(np.zeros((1, 80, 3000), np.float32))
        for request, about in (({"op": "fetch"}, encoding), ({"op": "encode", "shape": [1, 80, 3000]}, None)):
            lease = client._Lease(engine._blocks.create(1024))
            try:
                with pytest.raises(RuntimeError, match="holds 1024 bytes"):
                    engine._ask(request, about, lease)
            finally:
                engine._drop(lease.block.name)
        assert engine.fetch(encoding).shape == (1, 1500, 384) and engine.restarts == 0
    finally:
        engine.close()


def test_close_leaves_a_block_mapped_while_a_request_holds_it(model_path):
    """``close`` from one thread while another request still copies out of its block: that
    block is unmapped when the request ends, not under it (numpy's views do not pin a
    mapping: reading one unmapped would crash the process)."""
    engine = StockEngine(model_path, "float32", 1)
    try:
        engine.encode(np.zeros((1, 80, 3000), np.float32))
        spare = engine._free[0].name
        with engine._block(1 << 20) as lease:
            held = lease.block
            closer = threading.Thread(target=engine.close)
            closer.start()
            closer.join(30)
            assert not closer.is_alive() and not engine.running
            assert held.name in engine._blocks and held.name.lstrip("/") in _shared_blocks_mapped(os.getpid())
            assert spare not in engine._blocks  # the free one went at once
        assert held.name not in engine._blocks and held.name.lstrip("/") not in _shared_blocks_mapped(os.getpid())
    finally:
        engine.close()


def test_the_worker_unmaps_the_blocks_the_client_drops(model_path):
    """Each larger request replaces the free block; the worker unmaps the one replaced with the
    next request, so a block's pages do not stay in the worker until it exits."""
    engine = StockEngine(model_path, "float32", 1)
    try:
        for batch in (1, 2, 3, 1):  # three blocks made, two of them dropped
            engine.encode(np.zeros((batch, 80, 3000), np.float32))
        assert engine.restarts == 0 and len(engine._free) == 1
        assert _shared_blocks_mapped(engine._process.pid) == {engine._free[0].name.lstrip("/")}
    finally:
        engine.close()


def _in_a_forked_child(check, within: float = 120.0) -> int:
    """Run ``check()`` (True or False) in a forked child; its exit code: 0 if True, 2 if False,
    1 for an error, -9 if it ran past ``within`` s."""
    pid = os.fork()
    if pid == 0:  # the child leaves only through os._exit: pytest's own teardown is the parent's
        code = 1
        try:
            code = 0 if check() else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + within
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -9
        time.sleep(0.05)


def test_no_block_keeps_its_name_once_a_worker_has_mapped_it(model_path):
    """A block's name leaves /dev/shm once the worker has answered a request naming it, so
    nothing is left there however the processes end (here: killed). A worker started again
    cannot map such a block: a request gets a copy under a new name, with the same output."""
    before = set(os.listdir("/dev/shm"))
    features = np.random.default_rng(2).standard_normal((1, 80, 3000)).astype(np.float32)

    def killed_after_a_request() -> bool:
        engine = StockEngine(model_path, "float32", 1)
        engine.fetch(engine.encode(features))
        os.kill(os.getpid(), signal.SIGKILL)
        return False

    assert _in_a_forked_child(killed_after_a_request) == -signal.SIGKILL
    assert set(os.listdir("/dev/shm")) == before
    engine = StockEngine(model_path, "float32", 1)
    try:
        expected = engine.fetch(engine.encode(features))
        assert set(os.listdir("/dev/shm")) == before and len(engine._free) == 1
        engine._process.kill()
        engine._process.wait()
        stale = engine._free[0].name
        assert np.array_equal(engine.fetch(engine.encode(features)), expected)
        assert engine.restarts == 1 and stale not in engine._blocks
        assert set(os.listdir("/dev/shm")) == before
    finally:
        engine.close()
    assert set(os.listdir("/dev/shm")) == before


def test_a_forked_child_gets_a_worker_of_its_own_and_leaves_the_parents_alone(model_path):
    """A process forked after the engine started: the child's requests go to a worker of its
    own, with blocks of its own, and neither its requests nor its exit touch the parent's
    worker or blocks; the parent's close does not wait on the child's copy of the pipe."""
    engine = StockEngine(model_path, "float32", 1)
    try:
        features = np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32)
        expected = engine.fetch(engine.encode(features))
        worker, blocks = engine._process.pid, {block.name for block in engine._free}

        def child() -> bool:
            output = engine.fetch(engine.encode(features))
            own = engine._process.pid != worker and not blocks & {block.name for block in engine._free}
            engine.close()  # unlinks the child's blocks only
            return np.array_equal(output, expected) and own and engine.restarts == 0

        assert _in_a_forked_child(child) == 0
        assert engine._process.pid == worker and engine.restarts == 0
        assert {name.lstrip("/") for name in blocks} <= _shared_blocks_mapped(worker)  # still mapped there
        assert np.array_equal(engine.fetch(engine.encode(features)), expected)
        # A child alive with its copy of the worker's stdin: the parent's close is not held up.
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write)
            os.read(read, 1)  # until the parent closes its end
            os._exit(0)
        os.close(read)
        try:
            started = time.monotonic()
            engine.close()
            assert time.monotonic() - started < 5.0 and not _alive(worker)
        finally:
            os.close(write)
            os.waitpid(pid, 0)
    finally:
        engine.close()


def _interrupt_in_the_wait(worker: int, request) -> None:
    """Run ``request`` with the worker stopped (so that it waits until the interrupt has come)
    and Ctrl-C this process in its wait; the worker goes on after."""
    os.kill(worker, signal.SIGSTOP)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            request()
    finally:
        timer.cancel()  # if the request ended some other way first
        timer.join()
        os.kill(worker, signal.SIGCONT)


def test_ctrl_c_interrupts_the_callers_wait_and_leaves_the_worker_serving(model_path):
    """Ctrl-C at a terminal goes to the whole process group. The worker ignores it: it goes on
    (no restart, its outputs kept). The caller's wait ends at once with KeyboardInterrupt; the
    worker may still write that request's block, so the block is never given to another request,
    and the worker unmaps it only once it has answered that request; the next requests get the
    right outputs."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive program has it
    engine = StockEngine(model_path, "float32", 1)
    try:
        features = np.random.default_rng(1).standard_normal((1, 80, 3000)).astype(np.float32)
        encoding = engine.encode(features)
        expected = engine.fetch(encoding)
        worker, held = engine._process.pid, engine._free[0].name
        os.kill(worker, signal.SIGINT)
        _interrupt_in_the_wait(worker, lambda: engine.fetch(encoding))
        assert engine._free == [] and held not in engine._blocks and held in engine._orphaned
        assert np.array_equal(engine.fetch(engine.encode(features)), expected)
        assert np.array_equal(engine.fetch(encoding), expected)
        assert engine._process.pid == worker and engine.restarts == 0
        # The interrupted request was answered before these (one request at a time): the next
        # request after that told the worker to unmap its block; only the one in use is left.
        assert not engine._orphaned
        assert _shared_blocks_mapped(worker) == {engine._free[0].name.lstrip("/")}
    finally:
        signal.signal(signal.SIGINT, previous)
        engine.close()


def test_an_interrupted_encode_leaves_no_output_in_the_worker(model_path):
    """An encode interrupted in the caller's wait still runs to its end in the worker, which
    keeps the output under a handle nobody on this side holds: once the worker has answered,
    the next request tells it to drop that output, as for an encoding this side let go."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    engine = StockEngine(model_path, "float32", 1)
    try:
        features = np.random.default_rng(2).standard_normal((1, 80, 3000)).astype(np.float32)
        kept = engine.encode(features)
        _interrupt_in_the_wait(engine._process.pid, lambda: engine.encode(features))
        [(call, _)] = engine._orphaned.values()
        assert call.done.wait(60) and "handle" in call.answer
        lost = RemoteEncoding(engine, call.answer["handle"], engine.generation, call.answer["shape"], features)
        expected = engine.fetch(kept)  # the request after the answer: it releases the lost output
        assert not engine._orphaned
        with pytest.raises(client.StockUnavailable, match="no longer holds"):
            engine.fetch(lost)
        assert np.array_equal(engine.fetch(kept), expected) and engine.restarts == 0
    finally:
        signal.signal(signal.SIGINT, previous)
        engine.close()


@pytest.mark.slow
def test_batched_pipeline_through_the_worker(stock_flash, float32_pair, clips):
    """Batched windows: one encoding of several rows in the worker, rows copied out for the loop."""
    from faster_whisper import BatchedInferencePipeline as FasterBatched

    from ct2_flash import BatchedInferencePipeline

    audio = clips["long_multi_voice.ogg"]
    expected = FasterBatched(float32_pair.baseline).transcribe(audio, batch_size=4, beam_size=1)[0]
    got = BatchedInferencePipeline(stock_flash).transcribe(audio, batch_size=4, beam_size=1)[0]
    assert [(s.tokens, s.start, s.end) for s in got] == [(s.tokens, s.start, s.end) for s in expected]
    assert stock_flash.model.engines.stock_failures == 0 and stock_flash.model.engines.stock.timings["encode"][0] > 0
