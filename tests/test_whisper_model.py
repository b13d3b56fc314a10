"""The faster-whisper adapter: options behave as in faster-whisper, fallbacks, statistics."""

import logging
from dataclasses import asdict

import numpy as np
import pytest
from faster_whisper import BatchedInferencePipeline

from ct2_flash.drafting.reference import OracleDrafter

from .conftest import segments_of


@pytest.fixture()
def oracle_flash(float32_pair):
    """The float32 FlashWhisperModel with a perfect oracle drafter, restored afterwards."""
    flash = float32_pair.flash
    with flash.use_drafter(OracleDrafter(flash.reference_model)):
        flash.reset_spec_stats()
        yield flash


def words_of(model, audio, **options):
    segments, _ = model.transcribe(audio, **options)
    return [[asdict(w) for w in s.words] for s in segments]


@pytest.mark.parametrize(
    "options",
    [
        # Six more prompt and fallback variations, in the slow tier (the fast tier's 10 minutes;
        # the fast tier's fuzz draws prefixes, and VAD with its parameters in 5 of its 10 cases).
        pytest.param(dict(initial_prompt="Edinburgh, Glasgow, Carlisle."), id="initial_prompt", marks=pytest.mark.slow),
        pytest.param(dict(prefix="The train"), id="prefix", marks=pytest.mark.slow),
        pytest.param(dict(hotwords="platform refreshments"), id="hotwords", marks=pytest.mark.slow),
        pytest.param(dict(condition_on_previous_text=False), id="no-previous-text", marks=pytest.mark.slow),
        pytest.param(dict(vad_filter=True), id="vad", marks=pytest.mark.slow),
        pytest.param(dict(without_timestamps=True, max_new_tokens=12), id="max_new_tokens"),
        pytest.param(
            dict(temperature=0.0, log_prob_threshold=None, compression_ratio_threshold=None),
            id="no-thresholds",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_transcribe_options_identical(float32_pair, oracle_flash, clips, options):
    for name in ("clip09_kal16.ogg", "long_multi_voice.ogg"):
        expected = float32_pair.reference(name, clips[name], beam_size=1, **options)
        assert segments_of(oracle_flash, clips[name], beam_size=1, **options) == expected, name
    assert oracle_flash.spec_stats.accepted > 0


def test_word_timestamps_identical(float32_pair, oracle_flash, clips):
    audio = clips["clip10_awb.ogg"]
    expected = words_of(float32_pair.baseline, audio, beam_size=1, word_timestamps=True)
    assert words_of(oracle_flash, audio, beam_size=1, word_timestamps=True) == expected


def test_word_timestamps_identical_while_positions_are_tracked(float32_pair, clips):
    """The shipped drafter has the engine return alignment attention with every pass (on the
    same model faster-whisper aligns words with, at float32): words stay faster-whisper's."""
    flash = float32_pair.flash
    decoder = flash.decoder
    audio = clips["clip10_awb.ogg"]
    expected = words_of(float32_pair.baseline, audio, beam_size=1, word_timestamps=True)
    with decoder.use_drafter(decoder.drafter, adaptive=False):
        assert decoder.drafter.wants_position
        assert words_of(flash, audio, beam_size=1, word_timestamps=True) == expected
        assert decoder.runtime.tracking_positions


def test_batched_pipeline_identical(float32_pair, oracle_flash, clips):
    audio = clips["long_multi_voice.ogg"]
    options = dict(beam_size=1, batch_size=4)
    expected, _ = BatchedInferencePipeline(model=float32_pair.baseline).transcribe(audio, **options)
    got, _ = BatchedInferencePipeline(model=oracle_flash).transcribe(audio, **options)
    expected = [(s.tokens, s.start, s.end, s.text) for s in expected]
    assert [(s.tokens, s.start, s.end, s.text) for s in got] == expected
    assert oracle_flash.spec_stats.rows_in_loop >= 4  # rows decoded one at a time


def test_beam_search_falls_back_once_logged_and_sampling_does_not(float32_pair, clips, caplog):
    flash = float32_pair.flash
    flash.reset_spec_stats()
    audio = clips["clip03_rms.ogg"]
    with caplog.at_level(logging.INFO, logger="ct2_flash"):
        expected = float32_pair.reference("clip03_rms.ogg", audio, beam_size=5)
        assert segments_of(flash, audio, beam_size=5) == expected
        segments_of(flash, audio, beam_size=5)
    assert flash.spec_stats.unchanged_calls >= 2 and flash.spec_stats.rows_in_loop == 0
    beam = [r for r in caplog.records if "beam search is not speculative" in r.getMessage()]
    assert len(beam) == 1 and beam[0].levelno == logging.WARNING and "beam_size=1" in beam[0].getMessage()
    encoder_output = flash.encode_window(audio)
    fallbacks = flash.spec_stats.unchanged_calls
    sampled = flash.model.generate(encoder_output, [[50257]], beam_size=1, sampling_topk=0, sampling_temperature=0.7)
    assert sampled[0].sequences_ids[0]
    assert flash.spec_stats.unchanged_calls == fallbacks  # sampling is decoded by the loop (or the router's generate())


def test_language_detection_on_an_english_only_model_fails_as_faster_whispers_does(float32_pair, clips):
    """tiny.en is English-only: ``detect_language`` raises faster-whisper's own error through the
    proxy, not another one from the loop (base's detection is compared in test_base_model)."""
    audio = clips["clip01_slt.ogg"]
    with pytest.raises(Exception) as theirs:
        float32_pair.baseline.detect_language(audio)
    with pytest.raises(Exception) as ours:
        float32_pair.flash.detect_language(audio)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert "multilingual" in str(ours.value).lower()


def test_spec_stats_are_consistent(oracle_flash, clips):
    segments, _ = oracle_flash.transcribe(clips["clip08_slt.ogg"], beam_size=1, without_timestamps=True)
    segments = list(segments)
    stats = oracle_flash.spec_stats
    # Every window emits its tokens plus one end-of-text (this clip has one window).
    assert stats.rows_in_loop == 1
    assert stats.emitted == sum(len(s.tokens) for s in segments) + 1
    assert stats.accepted <= stats.proposed
    assert stats.acceptance_rate == pytest.approx(stats.accepted / stats.proposed)
    assert stats.tokens_per_call == pytest.approx(stats.emitted / stats.target_calls)
    assert stats.tokens_per_call > 4  # a perfect oracle at K=8
    assert sum(stats.accepted_by_position) == stats.accepted
    assert sum(stats.proposed_by_position) == stats.proposed
    assert stats.encoder_seconds > 0 and stats.verify_seconds > 0
    oracle_flash.reset_spec_stats()
    assert stats.target_calls == 0 and stats.accepted_by_position == [] and stats.encoder_seconds == 0


def test_num_draft_tokens_validated(model_path):
    from ct2_flash import FlashWhisperModel

    with pytest.raises(ValueError, match="num_draft_tokens"):
        FlashWhisperModel(model_path, stock_engine=False, num_draft_tokens=0)


def test_decoder_threads_split_gives_the_same_tokens(model_path, clips, float32_pair):
    """The loop on a one-thread copy of the model: int8 logits bit-identical (the split "auto"
    makes), float32 within rounding (on AVX2-only CPUs CTranslate2's float32 GEMM splits the
    work differently per thread count: 7e-6 seen), and identical output."""
    import numpy as np

    from ct2_flash import FlashWhisperModel

    from .conftest import THREADS

    pair = {}
    for compute_type in ("float32", "int8"):
        split = FlashWhisperModel(
            model_path,
            stock_engine=False,
            compute_type=compute_type,
            cpu_threads=THREADS,
            decoder_threads=1,
            near_exact=True,
        )
        runtime = split.decoder.runtime
        assert runtime.model is not split.reference_model  # encoder and fallbacks keep cpu_threads
        encoder_output = split.encode_window(clips["clip12_awb.ogg"])
        tokens = split.reference_model.generate(encoder_output, [[50257]], beam_size=1)[0].sequences_ids[0]
        for model in (runtime.model, split.reference_model):
            state, _ = model.prefill(encoder_output, [50257])
            pair[model is runtime.model] = np.asarray(model.forward_batch(state, tokens)).copy()
        if compute_type == "int8":
            assert np.array_equal(pair[True], pair[False])
        else:
            np.testing.assert_allclose(pair[True], pair[False], rtol=0, atol=1e-4)
            assert np.array_equal(pair[True].argmax(-1), pair[False].argmax(-1))
        if compute_type == "float32":  # int8 batch rows are a separate matter (test_exactness)
            with split.use_drafter(OracleDrafter(split.reference_model, error_rate=0.3)):
                got = segments_of(split, clips["clip09_kal16.ogg"], beam_size=1)
            assert got == float32_pair.reference("clip09_kal16.ogg", clips["clip09_kal16.ogg"], beam_size=1)
    for bad in (0, -1, 1.5, True, "all"):
        with pytest.raises(ValueError, match="decoder_threads"):
            FlashWhisperModel(model_path, stock_engine=False, decoder_threads=bad)
    # "auto" (the default) times a one-thread decoder against the shared model for int8 tiny.en
    # and keeps the faster (which one is the CPU's business); float32 never splits. With the
    # worker on, that model is loaded for the timing, and the worker started after it.
    model = FlashWhisperModel(model_path, compute_type="int8", cpu_threads=THREADS, near_exact=True)
    choice = model.decoder_split
    assert choice.shared_ms > 0 and choice.one_thread_ms > 0
    assert (model.decoder.runtime.model is not model.reference_model) is choice.split
    assert model.reference_model.model_is_loaded and type(model.reference_model).__name__ == "Whisper"
    model.model.engines.close()
    model = FlashWhisperModel(model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS)
    assert model.decoder_split is None and model.decoder.runtime.model is model.reference_model
    single = FlashWhisperModel(
        model_path, stock_engine=False, compute_type="int8", decoder_threads=None, near_exact=True
    )
    assert single.decoder.runtime.model is single.reference_model
    # Without near_exact the int8 loop never runs: no second model, nothing timed.
    unused = FlashWhisperModel(
        model_path, stock_engine=False, compute_type="int8", cpu_threads=THREADS, decoder_threads=1
    )
    assert unused.decoder_split is None and unused.decoder.runtime.model is unused.reference_model


def test_num_draft_tokens_beyond_the_drafter_is_clamped_with_a_warning(model_path, caplog):
    import os

    from ct2_flash import FlashWhisperModel
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS

    with caplog.at_level(logging.WARNING, logger="ct2_flash"):  # named: unnamed, int8 loads no drafter
        flash = FlashWhisperModel(
            model_path,
            stock_engine=False,
            compute_type="int8",
            num_draft_tokens=12,
            drafter=os.path.join(SHIPPED_DRAFTERS, "tiny.en"),
        )
    assert flash.decoder.num_draft_tokens == flash.drafter.num_draft_tokens == 8
    assert any("proposes at most 8 per round" in r.getMessage() for r in caplog.records)


def test_use_drafter_swaps_and_restores(float32_pair, clips):
    from ct2_flash import Adaptive
    from ct2_flash.drafting.reference import RandomDrafter

    flash = float32_pair.flash
    before, adaptive = flash.drafter, flash.decoder.adaptive
    with flash.use_drafter(RandomDrafter(51864, seed=1)) as drafter:
        assert flash.drafter is drafter and flash.decoder.adaptive == Adaptive(False, False, False)
        flash.reset_spec_stats()
        name = "clip01_slt.ogg"
        assert segments_of(flash, clips[name], beam_size=1) == float32_pair.reference(name, clips[name], beam_size=1)
        assert flash.spec_stats.proposed > 0
    assert flash.drafter is before and flash.decoder.adaptive is adaptive
    with pytest.raises(ValueError, match="vocabulary of 100 tokens"):
        with flash.use_drafter(RandomDrafter(100, vocab_size_check=100)):
            pass


def test_use_drafter_checks_k_as_the_constructor_does(float32_pair, caplog):
    """One check, one behaviour: more drafts than the drafter proposes are clamped with a
    warning inside the block too (K is speed, not output); K < 1 is refused."""
    flash = float32_pair.flash
    before = flash.decoder.num_draft_tokens
    with caplog.at_level(logging.WARNING, logger="ct2_flash"):
        with flash.use_drafter(flash.drafter, num_draft_tokens=12):
            assert flash.decoder.num_draft_tokens == flash.drafter.num_draft_tokens == 8
    assert any("proposes at most 8 per round" in r.getMessage() for r in caplog.records)
    assert flash.decoder.num_draft_tokens == before
    with pytest.raises(ValueError, match="num_draft_tokens must be an int >= 1"):
        with flash.use_drafter(flash.drafter, num_draft_tokens=0):
            pass
    assert flash.reference_model is flash.reference_model


def test_audio_frames_found_where_faster_whisper_pads(float32_pair, clips):
    """The drafter reads the audio frames of a window (plus a second), found from the zero padding
    faster-whisper adds; the transcript does not depend on it (exactness tests), only the cost."""
    from faster_whisper.audio import pad_or_trim

    from ct2_flash.adapter.audio import audio_frames

    flash = float32_pair.flash
    audio = clips["clip04_slt.ogg"]
    features = flash.feature_extractor(audio)
    padded = pad_or_trim(features)
    mel_frames = features.shape[-1] - 1  # faster-whisper's content_frames
    assert audio_frames(padded[None]) == [pytest.approx((mel_frames + 1) // 2, abs=1)]
    # A batch: one row per window, each its own length; an all-padding row has none.
    batch = np.stack([padded, pad_or_trim(features[:, :300]), np.zeros_like(padded)])
    assert audio_frames(batch)[1:] == [150, 0]
    seen = []
    decoder = flash.decoder
    decode = decoder.decode
    decoder.decode = lambda *args, **kwargs: seen.append(kwargs["audio_frames"]) or decode(*args, **kwargs)
    try:
        # Not adaptive: the router may have sent such calls to generate() after earlier tests.
        with decoder.use_drafter(decoder.drafter, adaptive=False):
            list(flash.transcribe(audio, beam_size=1)[0])
    finally:
        del decoder.decode
    assert seen and seen[0] == audio_frames(padded[None])[0]


def test_drafter_audio_keeps_a_second_after_the_audio():
    from ct2_flash.drafting.audio_window import PADDING_FRAMES_SEEN
    from ct2_flash.drafting.base import DraftWindow
    from ct2_flash.loop.options import DecodingOptions

    output = np.arange(1500 * 2, dtype=np.float32).reshape(1500, 2)
    assert DraftWindow(output, (1,), DecodingOptions(), 2).drafter_audio().shape == (1500, 2)
    cut = DraftWindow(output, (1,), DecodingOptions(), 2, audio_frames=100).drafter_audio()
    np.testing.assert_array_equal(cut, output[: 100 + PADDING_FRAMES_SEEN])
    assert DraftWindow(output, (1,), DecodingOptions(), 2, audio_frames=1490).drafter_audio().shape == (1500, 2)


@pytest.mark.slow  # the fast tier's threads share the worker (test_stock_engine::test_four_threads_share_one_worker)
def test_one_model_shared_by_four_threads_gives_sequential_outputs(model_path, float32_pair, clips):
    """faster-whisper's ``num_workers``: four threads transcribe through one model at once. One
    call at a time runs in the loop, the others go to ``generate()`` rather than wait; every
    transcript equals faster-whisper's, nothing raises, and no row goes uncounted."""
    import dataclasses
    import threading

    from ct2_flash import FlashWhisperModel

    from .conftest import THREADS

    flash = FlashWhisperModel(
        model_path, stock_engine=False, compute_type="float32", cpu_threads=THREADS, num_workers=4, adaptive=False
    )
    names = sorted(n for n in clips if n.startswith("clip"))[:6]
    options = dict(beam_size=1, temperature=0.0)
    results, errors = {}, []

    def work(part):
        try:
            for name in part:
                results[name] = segments_of(flash, clips[name], **options)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(names[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for name in names:
        assert results[name] == float32_pair.reference(name, clips[name], **options), name
    concurrent = dataclasses.replace(flash.spec_stats)  # a copy: the reset below works in place
    flash.reset_spec_stats()
    for name in names:
        segments_of(flash, clips[name], **options)
    sequential = flash.spec_stats
    assert sequential.busy_calls == 0 and sequential.rows_in_generate == 0
    assert concurrent.rows_in_loop + concurrent.rows_in_generate == sequential.rows_in_loop
    assert 0 < concurrent.busy_calls == concurrent.rows_in_generate  # the threads did overlap


def test_transcribe_command_writes_what_faster_whisper_segments_give(float32_pair, clips, tmp_path, capsys):
    """``ct2-flash transcribe``: txt, srt, vtt and json per file from the model's segments,
    equal to the same writers on faster-whisper's own segments; a bad file is reported and
    skipped, the others are written."""
    import json
    import os

    from faster_whisper import decode_audio

    from ct2_flash.cli import main
    from ct2_flash.jobs.outputs import WRITERS

    from .conftest import DATA

    bad = tmp_path / "bad.ogg"
    bad.write_text("not audio")
    names = ["clip01_slt.ogg", "clip06_awb.ogg"]
    files = [os.path.join(DATA, name) for name in names]
    code = main(
        [
            "transcribe",
            *files,
            str(bad),
            "--compute-type",
            "float32",
            "--output-format",
            "all",
            "--output-dir",
            str(tmp_path / "out"),
            "--word-timestamps",
        ]
    )
    assert code == 1 and "cannot read audio" in capsys.readouterr().err
    for name, path in zip(names, files):
        segments, info = float32_pair.baseline.transcribe(decode_audio(path), beam_size=1, word_timestamps=True)
        segments = list(segments)
        stem = tmp_path / "out" / name.replace(".ogg", "")
        for format_name, writer in WRITERS.items():
            written = (stem.parent / f"{stem.name}.{format_name}").read_text(encoding="utf-8")
            expected = writer(segments, info)
            if format_name == "json":
                # Scores match CTranslate2's within 1e-4 and no-speech probabilities within 1e-6
                # (docs/exactness.md); everything else exactly.
                written, expected = json.loads(written), json.loads(expected)
                for ours, theirs in zip(written["segments"], expected["segments"]):
                    for key, tolerance in (("avg_logprob", 1e-4), ("no_speech_prob", 1e-6)):
                        assert ours.pop(key) == pytest.approx(theirs.pop(key), abs=tolerance)
                    for word_ours, word_theirs in zip(ours.get("words", ()), theirs.get("words", ())):
                        assert word_ours.pop("probability") == pytest.approx(word_theirs.pop("probability"), abs=1e-4)
            assert written == expected, (name, format_name)
    assert (tmp_path / "out" / "clip01_slt.srt").read_text().startswith("1\n00:00:00,000 --> 00:00:0")
    assert not (tmp_path / "out" / "bad.txt").exists()


def test_transcribe_command_names_a_device_or_compute_type_it_cannot_load(capsys):
    """``--device cuda`` without a GPU, or a GPU compute type on the CPU: one line naming what
    was asked and CTranslate2's reason, exit 2, no traceback."""
    import os

    import ctranslate2

    from ct2_flash.cli import main

    from .conftest import DATA

    clip = os.path.join(DATA, "clip01_slt.ogg")
    asked = [["--compute-type", "float16"]]
    if ctranslate2.get_cuda_device_count() == 0:
        asked.append(["--device", "cuda"])
    for options in asked:
        assert main(["transcribe", clip, "--no-stock-engine", *options]) == 2
        error = capsys.readouterr().err
        assert error.startswith("ct2-flash transcribe: cannot load tiny.en on ") and "Traceback" not in error


def test_the_shipped_drafter_loads_only_where_the_loop_runs(model_path, tmp_path):
    """At int8 without near_exact no call runs the loop, so the shipped drafter is not loaded;
    near_exact loads it, and a drafter named by the caller is loaded, and checked, at int8 too."""
    import os

    from ct2_flash import CheckpointError, FlashWhisperModel, PromptLookupDrafter
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter

    if not os.path.isfile(os.path.join(SHIPPED_DRAFTERS, "tiny.en", "drafter.json")):
        pytest.skip("no shipped drafter in this checkout")
    common = dict(stock_engine=False, cpu_threads=2, decoder_threads=None)
    assert type(FlashWhisperModel(model_path, compute_type="int8", **common).drafter) is PromptLookupDrafter
    assert isinstance(
        FlashWhisperModel(model_path, compute_type="int8", near_exact=True, **common).drafter, OnnxDrafter
    )
    named = FlashWhisperModel(
        model_path, compute_type="int8", drafter=os.path.join(SHIPPED_DRAFTERS, "tiny.en"), **common
    )
    assert isinstance(named.drafter, OnnxDrafter)
    with pytest.raises(CheckpointError):
        FlashWhisperModel(model_path, compute_type="int8", drafter=str(tmp_path / "missing"), **common)


def test_features_on_one_blas_thread_are_the_same_bytes(model_path, clips):
    """The model computes faster-whisper's log-mel features with numpy's BLAS on one thread
    (``OneThreadFeatures``: its threads would spin on the engine's cores); they are the bytes
    faster-whisper's own extractor gives on two, from any number of threads at once, and BLAS
    is left as it was."""
    import threading

    from faster_whisper.feature_extractor import FeatureExtractor
    from threadpoolctl import ThreadpoolController

    from ct2_flash import FlashWhisperModel
    from ct2_flash.adapter.audio import OneThreadFeatures

    flash = FlashWhisperModel(model_path, stock_engine=False, compute_type="int8")
    assert isinstance(flash.feature_extractor, OneThreadFeatures)
    assert flash.feature_extractor.n_samples == FeatureExtractor().n_samples  # its attributes read through
    blas = ThreadpoolController().select(user_api="blas")
    with blas.limit(limits=2):
        assert {info["num_threads"] for info in blas.info()} == {2}
        expected = {name: FeatureExtractor()(audio) for name, audio in clips.items()}
    before = blas.info()
    inner, seen, got = flash.feature_extractor.extractor, [], {}

    def recording(*args, **kwargs):
        seen.extend(info["num_threads"] for info in blas.info())
        return inner(*args, **kwargs)

    object.__setattr__(flash.feature_extractor, "extractor", recording)

    def extract(name):
        got[name] = flash.feature_extractor(clips[name])

    threads = [threading.Thread(target=extract, args=(name,)) for name in clips]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(seen) == {1} and blas.info() == before
    assert {name: array.tobytes() for name, array in got.items()} == {
        name: array.tobytes() for name, array in expected.items()
    }
