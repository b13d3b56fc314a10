"""The worker's batching (``stock/batching.py``): concurrent ``generate()`` calls that share a
prompt layout and options run as one call, and every caller gets exactly what its call gives
alone, tokens and scores bit for bit (vLLM's "needle" check of batch invariance); calls that
cannot share a call never do; a batch that fails fails no caller's right answer."""

import json
import os
import random
import threading
import time
import wave

import numpy as np
import pytest
from faster_whisper import decode_audio

from ct2_flash import FlashWhisperModel, transcribe_files
from ct2_flash.stock import batching, invariance
from ct2_flash.stock.client import StockEngine

from .conftest import segments_of

SOT, PREV, NO_TIMESTAMPS = 50257, 50360, 50362
OPTIONS = dict(return_scores=True, return_no_speech_prob=True, suppress_blank=True, suppress_tokens=[-1])


# --- the scheduler's rules, without an engine -------------------------------------------------


def _request(prompts, **options):
    return {"op": "generate", "prompts": prompts, "options": options}


def test_a_batch_key_holds_the_layout_and_every_option():
    plain = batching.batch_key(_request([[SOT]], beam_size=1), 1, SOT, seeded=False)
    assert plain == batching.batch_key(_request([[SOT]], beam_size=1), 1, SOT, seeded=False)
    assert plain != batching.batch_key(_request([[SOT]], beam_size=5), 1, SOT, seeded=False)
    assert plain != batching.batch_key(_request([[SOT, NO_TIMESTAMPS]], beam_size=1), 1, SOT, seeded=False)
    # Previous text of any content, the same length: one layout; another length: another.
    one = batching.batch_key(_request([[PREV, 10, 11, SOT]], beam_size=1), 1, SOT, seeded=False)
    assert one == batching.batch_key(_request([[PREV, 20, 21, SOT]], beam_size=1), 1, SOT, seeded=False)
    assert one != batching.batch_key(_request([[PREV, 20, SOT]], beam_size=1), 1, SOT, seeded=False)


@pytest.mark.parametrize(
    "request_, rows, sot, seeded",
    [
        ({"op": "encode"}, 1, SOT, False),
        (_request([[SOT]], beam_size=1), 1, None, False),  # no start-of-transcript id known
        (_request([[SOT], [PREV, 1, SOT]], beam_size=1), 2, SOT, False),  # two layouts in one call
        (_request([[SOT]], beam_size=1), 2, SOT, False),  # encoder rows that are not the prompts'
        (_request([["<|startoftranscript|>"]], beam_size=1), 1, SOT, False),  # token strings
        (_request([[1, 2]], beam_size=1), 1, SOT, False),  # no start-of-transcript token
        (_request([[SOT]], beam_size=1, sampling_topk=0, sampling_temperature=0.4), 1, SOT, True),  # seeded draws
    ],
)
def test_calls_that_cannot_share_a_call_run_alone(request_, rows, sot, seeded):
    assert batching.batch_key(request_, rows, sot, seeded) is None


def test_the_queue_takes_the_oldest_with_its_partners_and_keeps_the_order_of_the_rest():
    items = ["a1", "b1", "a2", "c", "a3", "b2"]
    queue = batching.Batches(key=lambda item: item[0] if item != "c" else None, rows=lambda item: 1, max_rows=2)
    for item in items:
        queue.put(item)
    taken = []
    for _ in range(4):
        taken.append(queue.take())
        queue.done()
    assert taken == [["a1", "a2"], ["b1", "b2"], ["c"], ["a3"]]


def test_idle_threads_share_the_calls_waiting():
    queue = batching.Batches(key=lambda item: "k", rows=lambda item: 1, max_rows=16, threads=2)
    for item in range(8):
        queue.put(item)
    assert queue.take() == [0, 1, 2, 3]  # two idle threads: half each
    assert queue.take() == [4, 5, 6, 7]


def test_a_lone_call_never_waits_and_a_waiting_one_waits_only_its_bound():
    queue = batching.Batches(key=lambda item: "k", rows=lambda item: 1, max_rows=4, wait_seconds=30.0)
    queue.put("alone")
    started = time.monotonic()
    assert queue.take() == ["alone"]  # nothing else in flight: no wait
    assert time.monotonic() - started < 5.0
    # With another call being served, a call waits for partners up to wait_seconds.
    queue = batching.Batches(key=lambda item: "k", rows=lambda item: 1, max_rows=4, wait_seconds=0.2)
    queue.put("served")
    assert queue.take() == ["served"]  # still being served: no done() yet
    queue.put("first")
    threading.Timer(0.05, queue.put, ("partner",)).start()
    started = time.monotonic()
    assert queue.take() == ["first", "partner"]
    assert time.monotonic() - started < 5.0


def test_rows_split_back_to_their_callers():
    assert batching.split(list("abcdef"), [1, 3, 2]) == [["a"], ["b", "c", "d"], ["e", "f"]]


def test_a_verdict_is_kept_per_machine_and_a_broken_file_is_no_verdict(tmp_path):
    path = str(tmp_path / "verdicts.json")
    key = invariance.machine_key("4.8.5", "int8_float32", 1)
    assert invariance.remembered(path, key) is None
    invariance.remember(path, key, False)
    assert invariance.remembered(path, key) is False
    assert invariance.remembered(path, invariance.machine_key("4.8.5", "int8_float32", 2)) is None
    (tmp_path / "verdicts.json").write_text("not json")
    assert invariance.remembered(path, key) is None


# --- through the worker -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def windows(model_path, clips):
    """(features [1, n_mels, 3000] per clip), from faster-whisper's feature extractor."""
    from faster_whisper import WhisperModel

    extractor = WhisperModel(model_path, compute_type="int8", cpu_threads=1).feature_extractor
    found = []
    for name in sorted(clips)[:14]:
        features = extractor(clips[name][: 30 * 16000])[:, :3000]
        found.append(np.pad(features, ((0, 0), (0, 3000 - features.shape[1])))[None].astype(np.float32))
    return found


@pytest.fixture(scope="module")
def engine(model_path, tmp_path_factory):
    verdicts = str(tmp_path_factory.mktemp("verdicts") / "verdicts.json")
    engine = StockEngine(
        model_path, "int8", intra_threads=1, inter_threads=1, max_batch_rows=16, invariance_file=verdicts
    )
    yield engine
    engine.close()


def _outcome(result):
    return (result.sequences_ids, result.scores, result.no_speech_prob)


def _together(engine, blocker, calls):
    """Run ``calls`` ((encoding, prompt, options) each) at once, queued behind a slow
    ``blocker`` call so that the worker finds them all waiting: their outcomes, in order."""
    results = [None] * len(calls)

    def one(index):
        encoding, prompt, options = calls[index]
        try:
            results[index] = _outcome(engine.generate(encoding, [prompt], options)[0])
        except Exception as error:  # noqa: BLE001 - compared by the test
            results[index] = error

    slow = threading.Thread(target=lambda: engine.generate(blocker, [[SOT]], dict(OPTIONS, beam_size=5)))
    slow.start()
    time.sleep(0.02)
    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads + [slow]:
        thread.join()
    return results


def _varied(layout, rng):
    """``layout`` with other previous text of the same length (the same layout)."""
    if layout[0] != PREV:
        return list(layout)
    return [PREV] + [rng.randrange(300, 9000) for _ in layout[1:-1]] + [SOT]


LAYOUTS = (
    [SOT],
    [SOT, NO_TIMESTAMPS],
    [PREV, 440, 1110, 2068, 13, SOT],  # previous text (condition_on_previous_text), or a hotword prefix
)


def _needle_trials(engine, windows, trials, sizes, seed) -> None:
    """Each trial: a batch of random windows and size, one layout and options; every row's
    tokens, scores and no-speech probability inside the batch must be its call's alone."""
    encodings = [engine.encode(features) for features in windows]
    rng = random.Random(seed)
    batched = 0
    for trial, (beam, layout, max_length) in enumerate(trials):
        options = dict(OPTIONS, beam_size=beam, max_length=max_length)
        chosen = rng.sample(range(len(encodings)), min(rng.choice(sizes), len(encodings)))
        # Partners' previous text differs in content, not in length (one layout).
        calls = [(encodings[index], _varied(layout, rng), options) for index in chosen]
        alone = [_outcome(engine.generate(encoding, [prompt], options)[0]) for encoding, prompt, options in calls]
        before = sum(count for rows, count in engine.rows_in_calls.items() if rows > 1)
        together = _together(engine, encodings[(trial + 1) % len(encodings)], calls)
        assert together == alone, f"trial {trial}: a row decoded differently inside a batch"
        batched += sum(count for rows, count in engine.rows_in_calls.items() if rows > 1) > before
    assert batched >= len(trials) // 2, f"the worker hardly batched ({engine.rows_in_calls}): batching went untested"


def test_a_needle_decodes_the_same_alone_and_inside_random_batches(engine, windows):
    """Beam 1 and 5, timestamps on and off, previous text, a length limit some rows hit (every
    combination: ``test_the_needle_sweep``, slow tier)."""
    trials = [(5, LAYOUTS[0], 448), (1, LAYOUTS[1], 448), (1, LAYOUTS[2], 10)]
    _needle_trials(engine, windows, trials, sizes=[3, 6, 8], seed=0)


@pytest.mark.slow
def test_the_needle_sweep(engine, windows):
    """The sweep: every layout at beam 1 and 5, limits of 10 and 448 tokens, sizes 1-14."""
    trials = [(beam, layout, limit) for beam in (1, 5) for layout in LAYOUTS for limit in (10, 448)]
    _needle_trials(engine, windows, trials, sizes=[1, 2, 4, 8, 14], seed=1)


def test_calls_with_other_options_are_never_batched_together(engine, windows):
    """Half the calls stop at 6 tokens, half do not: batched together, one half would get the
    other's length limit."""
    encodings = [engine.encode(features) for features in windows[:8]]
    calls = [
        (encoding, [SOT], dict(OPTIONS, beam_size=1, max_length=6 if index % 2 else 448))
        for index, encoding in enumerate(encodings)
    ]
    alone = [_outcome(engine.generate(encoding, [prompt], options)[0]) for encoding, prompt, options in calls]
    assert any(len(outcome[0][0]) >= 5 for outcome in alone[::2])  # the long ones are long
    assert _together(engine, encodings[0], calls) == alone


def test_a_batch_that_cannot_run_serves_each_call_alone(engine, windows):
    """One window of other dimensions (an encoder output of 500 frames) cannot be stacked with
    the others: each call is then served alone, with its own result."""
    encodings = [engine.encode(features) for features in windows[:3]]
    encodings.insert(1, engine.encode(windows[3][:, :, :1000].copy()))
    options = dict(OPTIONS, beam_size=1)
    calls = [(encoding, [SOT], options) for encoding in encodings]
    alone = [_outcome(engine.generate(encoding, [prompt], options)[0]) for encoding, prompt, options in calls]
    assert _together(engine, encodings[0], calls) == alone


def test_a_worker_dying_mid_batch_gives_every_caller_a_clear_error(model_path, windows, tmp_path):
    """A prompt token outside the vocabulary crashes the engine (alone too): every call of the
    batch ends in ``StockUnavailable`` (``FlashWhisperModel`` then serves it in the patched
    runtime), and the next call starts a new worker and is answered."""
    from ct2_flash.stock.client import StockUnavailable

    engine = StockEngine(model_path, "int8", intra_threads=1, max_batch_rows=16, invariance_file="")
    try:
        encodings = [engine.encode(features) for features in windows[:4]]
        options = dict(OPTIONS, beam_size=1)
        calls = [(encoding, [PREV, 440, SOT], options) for encoding in encodings[:3]]
        alone = [_outcome(engine.generate(encoding, [prompt], options)[0]) for encoding, prompt, options in calls]
        calls.append((encodings[3], [PREV, 10**7, SOT], options))
        together = _together(engine, encodings[0], calls)
        assert isinstance(together[3], StockUnavailable)
        # Each other call: its own answer (served before the crash) or the clear error.
        assert all(isinstance(got, StockUnavailable) or got == want for got, want in zip(together, alone))
        again = engine.generate(engine.encode(windows[0]), [[SOT]], options)[0]
        assert again.sequences_ids[0] and engine.restarts == 1
    finally:
        engine.close()


def test_a_cpu_found_not_batch_invariant_is_never_batched(model_path, windows, tmp_path):
    """The verdict kept for this machine says no: every call runs alone."""
    path = str(tmp_path / "verdicts.json")
    for threads in (1,):
        invariance.remember(path, invariance.machine_key("4.8.5", "int8_float32", threads), False)
    engine = StockEngine(model_path, "int8", intra_threads=1, max_batch_rows=16, invariance_file=path)
    try:
        encodings = [engine.encode(features) for features in windows[:6]]
        options = dict(OPTIONS, beam_size=1)
        alone = [_outcome(engine.generate(encoding, [[SOT]], options)[0]) for encoding in encodings]
        calls = [(encoding, [SOT], options) for encoding in encodings]
        assert _together(engine, encodings[0], calls) == alone
        assert set(engine.rows_in_calls) == {1}
    finally:
        engine.close()


# --- whole files: a folder through the batching default -------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        dict(beam_size=1, vad_filter=True),
        pytest.param(dict(beam_size=5, word_timestamps=True), marks=pytest.mark.slow),  # 20 s
    ],
)
def test_a_folder_at_int8_is_batched_and_every_file_is_faster_whispers_own(model_path, clips, tmp_path, options):
    """Files of very different lengths (2-25 s and 94 s), one without speech, an empty one and
    a corrupt one, 16 in flight through one int8 model that batches: each good file gives the
    segments faster-whisper's sequential ``transcribe()`` on stock ctranslate2 gives it (the
    same model unbatched, one file at a time: its worker is stock's engine), the bad ones fail
    with their reasons, and the worker did batch."""
    folder = tmp_path / "in"
    folder.mkdir()
    names = sorted(name for name in clips if name.startswith("clip"))[:8] + ["long_multi_voice.ogg"]
    for name in names:
        with wave.open(str(folder / f"{name[:-4]}.wav"), "wb") as stream:
            stream.setnchannels(1)
            stream.setsampwidth(2)
            stream.setframerate(16000)
            stream.writeframes((np.clip(clips[name], -1, 1) * 32767).astype(np.int16).tobytes())
    with wave.open(str(folder / "silence.wav"), "wb") as stream:
        stream.setnchannels(1)
        stream.setsampwidth(2)
        stream.setframerate(16000)
        stream.writeframes(bytes(2 * 16000 * 5))
    (folder / "empty.wav").write_bytes(b"")
    (folder / "corrupt.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    flash = FlashWhisperModel(model_path, compute_type="int8", cpu_threads=1, num_workers=2)
    sequential = FlashWhisperModel(model_path, compute_type="int8", cpu_threads=2, batch_rows=1)
    try:
        results = {
            os.path.basename(r.path): r
            for r in transcribe_files([str(folder)], str(tmp_path / "out"), ("json",), model=flash, jobs=2, **options)
        }
        assert {name: r.status for name, r in results.items() if r.status != "done"} == {
            "empty.wav": "failed",
            "corrupt.wav": "failed",
        }
        assert all(r.error for r in results.values() if r.status == "failed")
        for name in names + ["silence.wav"]:
            path = str(folder / (name if name == "silence.wav" else f"{name[:-4]}.wav"))
            want = segments_of(sequential, decode_audio(path), **options)
            with open(results[os.path.basename(path)].outputs[0], encoding="utf-8") as stream:
                written = json.load(stream)["segments"]
            assert [(s["text"], s["start"], s["end"]) for s in written] == [(t, a, b) for _, a, b, t in want], name
            assert [tuple(s["tokens"]) for s in written] == [tokens for tokens, *_ in want], name
        stock = flash.model.engines.stock
        assert max(stock.rows_in_calls) > 1, f"no batch formed: {stock.rows_in_calls}"
        assert stock.max_batch_rows == 16 and stock.restarts == 0
    finally:
        flash.model.engines.close()
        sequential.model.engines.close()


def test_a_caller_that_gives_up_mid_batch_changes_no_other_callers_answer(engine, windows, monkeypatch):
    """One caller stops waiting (Ctrl-C) once its call is in the worker's queue: the batch runs
    anyway, every other caller gets its own answer, and the engine serves the next call."""
    from ct2_flash.stock import client

    encodings = [engine.encode(features) for features in windows[:5]]
    options = dict(OPTIONS, beam_size=1)
    calls = [(encoding, [SOT], options) for encoding in encodings]
    alone = [_outcome(engine.generate(encoding, [prompt], options)[0]) for encoding, prompt, options in calls]
    waiting = client._Channel.wait

    def wait(call, timeout):
        if threading.current_thread().name == "quitter":
            raise KeyboardInterrupt
        return waiting(call, timeout)

    monkeypatch.setattr(client._Channel, "wait", staticmethod(wait))
    outcomes = [None] * len(calls)

    def one(index):
        encoding, prompt, options = calls[index]
        try:
            outcomes[index] = _outcome(engine.generate(encoding, [prompt], options)[0])
        except KeyboardInterrupt:
            outcomes[index] = "gave up"

    slow = threading.Thread(target=lambda: engine.generate(encodings[0], [[SOT]], dict(OPTIONS, beam_size=5)))
    slow.start()
    time.sleep(0.02)
    threads = [threading.Thread(target=one, args=(i,), name="quitter" if i == 2 else f"caller {i}") for i in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads + [slow]:
        thread.join()
    assert outcomes[2] == "gave up"
    assert [outcome for index, outcome in enumerate(outcomes) if index != 2] == alone[:2] + alone[3:]
    monkeypatch.undo()
    assert _outcome(engine.generate(encodings[0], [[SOT]], options)[0]) == alone[0]
    assert engine.restarts == 0
