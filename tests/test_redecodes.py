"""Re-decodes of a growing buffer: the previous hypothesis is offered, the output stays faster-whisper's.

A streaming client transcribes its whole buffer again as audio arrives. The model finds the
window it decoded before by its first second of audio and offers that hypothesis to the loop
(``redecodes``); every token is still verified, so each buffer's
segments must equal plain faster-whisper's on the same engine, whatever the options.
"""

import time

import numpy as np
import pytest

from .conftest import segments_of

RATE = 16000


def _growing(audio, ends):
    return [audio[: int(end * RATE)] for end in ends]


def _check_buffers(pair, name, buffers, **options):
    """Every buffer transcribed by the loop (every round drafting) equals faster-whisper's.

    Returns the loop's counters over the buffers."""
    flash = pair.flash
    flash.reset_spec_stats()
    flash.model.recent.clear()
    with flash.use_drafter(flash.drafter, adaptive=False):
        for index, buffer in enumerate(buffers):
            expected = pair.reference(f"{name}[{index}]", buffer, **options)
            assert segments_of(flash, buffer, **options) == expected, (name, index, len(buffer) / RATE)
    return flash.spec_stats


OPTIONS = {
    "timestamps": dict(beam_size=1),
    "no timestamps": dict(beam_size=1, without_timestamps=True),
    "word timestamps": dict(beam_size=1, word_timestamps=True),
    "a prefix": dict(beam_size=1, prefix="So"),
    "vad": dict(beam_size=1, vad_filter=True),
    # Each window is decoded greedily twice in a row (the second a re-decode of the same audio).
    "fallback to the same temperature": dict(beam_size=1, temperature=(0.0, 0.0), compression_ratio_threshold=0.5),
}
FAST = ("timestamps", "fallback to the same temperature")


@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=() if case in FAST else pytest.mark.slow) for case in OPTIONS]
)
def test_growing_buffers_are_decoded_as_faster_whisper_decodes_them(float32_pair, clips, case):
    audio = clips["long_multi_voice.ogg"]
    buffers = _growing(audio, [3, 5, 7] if case in FAST else [3, 6, 9, 12, 15, 18])
    stats = _check_buffers(float32_pair, case, buffers, **OPTIONS[case])
    assert stats.redecodes >= len(buffers) - 1  # every buffer after the first found its window
    assert stats.offered_rounds > 0 and stats.offered_accepted > 0


@pytest.mark.slow
def test_a_longer_buffer_re_decodes_every_window_that_starts_where_it_did(float32_pair, clips):
    """Over 30 s a buffer has two windows; the second starts where the first one's last
    timestamp put it, and is found again when that did not move (here it does not)."""
    audio = clips["long_multi_voice.ogg"]
    stats = _check_buffers(float32_pair, "two windows", _growing(audio, [40, 41]), beam_size=1)
    assert stats.redecodes == 2


def test_a_buffer_whose_start_moved_or_other_audio_is_decoded_afresh(float32_pair, clips):
    audio = clips["long_multi_voice.ogg"]
    trimmed = [audio[: 4 * RATE], audio[int(1.5 * RATE) : 5 * RATE]]  # the client trimmed 1.5 s
    stats = _check_buffers(float32_pair, "trimmed", trimmed, beam_size=1)
    assert stats.redecodes == 0
    other = clips["clip01_slt.ogg"][: 4 * RATE]  # another stream after this one
    assert _check_buffers(float32_pair, "others", [trimmed[0], other], beam_size=1).redecodes == 0


def test_a_changed_prompt_still_decodes_exactly(float32_pair, clips):
    """The previous hypothesis came from another prompt: it only drafts."""
    audio = clips["long_multi_voice.ogg"][: 8 * RATE]
    flash = float32_pair.flash
    flash.model.recent.clear()
    with flash.use_drafter(flash.drafter, adaptive=False):
        segments_of(flash, audio, beam_size=1, initial_prompt="Hello there.")
        flash.reset_spec_stats()
        assert segments_of(flash, audio, beam_size=1) == float32_pair.reference("prompt", audio, beam_size=1)
    assert flash.spec_stats.redecodes == 1


def test_remembered_windows_are_kept_per_thread(float32_pair, clips):
    import threading

    audio = clips["long_multi_voice.ogg"][: 5 * RATE]
    flash = float32_pair.flash
    flash.model.recent.clear()
    segments_of(flash, audio, beam_size=1)
    flash.reset_spec_stats()
    thread = threading.Thread(target=segments_of, args=(flash, audio), kwargs=dict(beam_size=1))
    thread.start()
    thread.join()
    assert flash.spec_stats.redecodes == 0  # another thread's stream is its own
    segments_of(flash, audio, beam_size=1)
    assert flash.spec_stats.redecodes == 1


def test_an_encoded_window_carries_its_audio_and_fingerprint_to_generate(float32_pair, clips):
    """What the loop, the routers and the re-decode memory know of a window travels with its
    encoder output: a window handed back after another one was encoded is still found again,
    and an output encoded elsewhere is decoded as faster-whisper decodes it."""
    import ctranslate2

    from ct2_flash.adapter.audio import audio_frames
    from ct2_flash.adapter.speculative_whisper import EncodedWindow

    flash = float32_pair.flash
    speculative = flash.model

    def storage(audio):  # as faster-whisper hands features to encode()
        return ctranslate2.StorageView.from_array(np.ascontiguousarray(flash.window_features(audio)[None]))

    features = storage(clips["long_multi_voice.ogg"][: 6 * RATE])
    other = storage(clips["clip01_slt.ogg"][: 4 * RATE])
    prompt = [[50257]]  # <|startoftranscript|>, timestamps on
    speculative.recent.clear()
    flash.reset_spec_stats()
    window = speculative.encode(features)
    assert isinstance(window, EncodedWindow) and window.frames == audio_frames(features)
    assert window.fingerprint is not None and tuple(window.shape) == tuple(window.output.shape)
    first = speculative.generate(window, prompt, beam_size=1)
    speculative.generate(speculative.encode(other), prompt, beam_size=1)  # another window in between
    again = speculative.generate(window, prompt, beam_size=1)
    assert again[0].sequences_ids == first[0].sequences_ids
    assert flash.spec_stats.redecodes == 1
    # Encoded by the plain model: nothing known of its audio, the plain model's tokens.
    elsewhere = flash.reference_model.encode(features)
    expected = flash.reference_model.generate(elsewhere, prompt, beam_size=1)[0].sequences_ids
    assert speculative.generate(elsewhere, prompt, beam_size=1)[0].sequences_ids == expected
    assert flash.spec_stats.redecodes == 1


def test_remembered_tokens_keep_the_end_of_text_only_where_the_decode_ended():
    from ct2_flash.redecodes.memory import remembered_tokens

    assert remembered_tokens([5, 6], True, 99) == (5, 6, 99)
    assert remembered_tokens(np.array([5, 6]), False, 99) == (5, 6)


def test_only_a_one_row_batch_on_the_host_has_a_fingerprint():
    from ct2_flash.redecodes.memory import window_fingerprint

    assert window_fingerprint(np.zeros((1, 80, 3000), np.float32)) is not None
    assert window_fingerprint(np.zeros((2, 80, 3000), np.float32)) is None
    assert window_fingerprint(object()) is None


# A decode that outgrows its audio: generate() stops, the loop finishes the window.

# whisperlivekit's buffer at 74 s of the test clip (trimmed at 66.02 s) and its committed-text
# prompt: the window after the seek holds 0.02 s of audio, where tiny.en says one token again
# and again up to the length limit.
LOOPING_BUFFER = (1056320, 1184000)
LOOPING_PROMPT = (
    " where a connecting service departs 20 minutes later. refreshments are available in Coachec. "
    "I work waterly report shows revenue of 42 million and increase of 11% over last"
)


def _routed_to_generate(monkeypatch, flash):
    """Every greedy call goes to generate() first (a fresh router, no re-decodes)."""
    from ct2_flash.adapter.routing import CallRouter

    monkeypatch.setattr(flash.model, "recent", None)
    monkeypatch.setattr(flash.model.routes, "greedy", CallRouter())
    flash.reset_spec_stats()


def _with_scores(model, audio, **options):
    segments, _ = model.transcribe(audio, **options)
    return [((tuple(s.tokens), s.start, s.end, s.text), s.avg_logprob, s.no_speech_prob) for s in segments]


def test_a_decode_stopped_early_is_finished_in_the_loop_exactly(float32_pair, clips, monkeypatch):
    """With the cap at 4 tokens every window is stopped and finished in the loop: the same
    segments, words and scores as faster-whisper's."""
    from ct2_flash.adapter import speculative_whisper

    flash = float32_pair.flash
    _routed_to_generate(monkeypatch, flash)
    monkeypatch.setattr(speculative_whisper, "PLAUSIBLE_BASE_TOKENS", 4)
    monkeypatch.setattr(speculative_whisper, "PLAUSIBLE_TOKENS_PER_SECOND", 0)
    options = dict(beam_size=1, word_timestamps=True)
    windows = 0
    for name in ("clip08_slt.ogg", "clip03_rms.ogg"):
        audio = clips[name]
        expected = _with_scores(float32_pair.baseline, audio, **options)
        got = _with_scores(flash, audio, **options)
        assert [segment for segment, _, _ in got] == [segment for segment, _, _ in expected], name
        assert [score for _, score, _ in got] == pytest.approx([score for _, score, _ in expected], abs=1e-4)
        assert [p for _, _, p in got] == pytest.approx([p for _, _, p in expected], abs=1e-4)
        windows += 1
    assert flash.spec_stats.continued_rows >= windows
    assert flash.spec_stats.rows_in_generate >= windows
    assert flash.model.routes.greedy.setup_paid  # the loop ran: fresh audio's first probe need not wait


def test_a_window_that_repeats_itself_to_the_limit_is_decoded_as_faster_whisper_decodes_it(
    float32_pair, clips, monkeypatch
):
    flash = float32_pair.flash
    _routed_to_generate(monkeypatch, flash)
    taught = []  # tokens of the calls the router learnt from
    router = flash.model.routes.greedy
    monkeypatch.setattr(router, "record", lambda *args: taught.append(args[3]))
    audio = clips["long_multi_voice.ogg"][LOOPING_BUFFER[0] : LOOPING_BUFFER[1]]
    options = dict(beam_size=1, word_timestamps=True, temperature=0.0, initial_prompt=LOOPING_PROMPT)
    assert segments_of(flash, audio, **options) == float32_pair.reference("looping", audio, **options)
    stats = flash.spec_stats
    assert stats.continued_rows >= 1
    assert stats.emitted >= 200 and stats.target_calls < stats.emitted / 4  # the repeats went in blocks
    assert max(taught, default=0) < 200  # the call that ran to its limit taught the router nothing


def test_a_window_given_a_looping_prompt_is_stopped_early_and_decoded_exactly(float32_pair, clips, monkeypatch):
    """A prompt whose text ends in a loop (the previous window repeated itself) stops
    ``generate()`` after ``LOOPED_PROMPT_CAP`` tokens whatever the audio, and the loop finishes the window: the
    same segments and scores as faster-whisper's."""
    from ct2_flash.adapter import speculative_whisper

    flash = float32_pair.flash
    _routed_to_generate(monkeypatch, flash)
    taught = []
    monkeypatch.setattr(flash.model.routes.greedy, "record", lambda *args: taught.append(args))
    audio = clips["clip11_rms.ogg"]  # 18.7 s, 74 tokens: over the cap, under the audio's own
    options = dict(beam_size=1, temperature=0.0, initial_prompt=" Okay." * 20)
    expected = _with_scores(float32_pair.baseline, audio, **options)
    assert sum(len(segment[0]) for segment, _, _ in expected) > speculative_whisper.LOOPED_PROMPT_CAP
    started = time.perf_counter()
    got = _with_scores(flash, audio, **options)
    wall = time.perf_counter() - started
    assert [segment for segment, _, _ in got] == [segment for segment, _, _ in expected]
    assert [score for _, score, _ in got] == pytest.approx([score for _, score, _ in expected], abs=1e-4)
    stats = flash.spec_stats
    assert stats.continued_rows == 1
    # Each second once: generate()'s part in generate_seconds, the loop's in its own timers.
    assert stats.generate_seconds + stats.encoder_seconds + stats.decode_seconds <= wall
    assert taught == []  # part generate(), part loop: its router learns nothing from it
