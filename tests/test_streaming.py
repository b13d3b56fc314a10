"""The streaming front end: LocalAgreement-2 over a growing buffer, on any WhisperModel."""

import numpy as np
import pytest

from ct2_flash.benchmark.replay import replay, summary
from ct2_flash.jobs.streaming import Agreement, OnlineProcessor, StreamOptions, Word, text_of

RATE = 16000


def words(*pairs):
    """Words from (start, text) pairs, each 0.4 s long."""
    return [Word(start, start + 0.4, text) for start, text in pairs]


def test_two_hypotheses_commit_what_they_start_with_alike():
    agreement = Agreement()
    agreement.insert(words((0.0, " the"), (0.5, " cat")))
    assert agreement.flush() == []  # nothing to agree with yet
    agreement.insert(words((0.0, " the"), (0.5, " cat"), (1.0, " sat")))
    assert text_of(agreement.flush()) == "the cat"
    assert agreement.last_committed_end == pytest.approx(0.9)
    # The next hypothesis says the committed words again at the start: they are dropped.
    agreement.insert(words((0.5, " cat"), (1.0, " sat"), (1.5, " down")))
    assert text_of(agreement.flush()) == "sat"
    agreement.insert(words((1.0, " sat"), (1.5, " up")))  # changed its mind: nothing agrees
    assert agreement.flush() == []
    assert text_of(agreement.uncommitted()) == "up"


def test_words_before_the_last_committed_one_are_ignored():
    agreement = Agreement()
    agreement.insert(words((0.0, " a"), (0.5, " b")))
    agreement.flush()
    agreement.insert(words((0.0, " a"), (0.5, " b")))
    assert text_of(agreement.flush()) == "a b"
    agreement.insert(words((0.1, " x"), (1.0, " c")))  # " x" starts before b ended
    assert [w.text for w in agreement.new] == [" c"]


def _stream(model, audio, chunk=2.0):
    processor = OnlineProcessor(model)
    replay(processor, audio, chunk, wait=False)
    return processor


def test_the_stream_commits_what_faster_whisper_commits(float32_pair, clips):
    """Same policy, same audio: ct2-flash commits exactly the text plain faster-whisper does,
    while its re-decodes draft from the previous hypotheses."""
    audio = clips["long_multi_voice.ogg"][: 12 * RATE]
    flash = float32_pair.flash
    flash.reset_spec_stats()
    expected = _stream(float32_pair.baseline, audio)
    got = _stream(flash, audio)
    assert got.committed == expected.committed
    assert len(text_of(got.committed).split()) > 20
    assert got.iterations == expected.iterations == 6
    assert flash.spec_stats.redecodes > 0


class Ramp:
    """A fake model that hears the stream time in the samples (sample = time / 1000) and says
    a word every 0.5 s (" w<n>" for the n-th half second), in segments of 2 s; the last
    half second of a buffer is not said yet."""

    class Item:
        def __init__(self, **fields):
            self.__dict__.update(fields)

    def transcribe(self, audio, **options):
        offset = round(float(audio[0]) * 1000, 3)
        end = offset + audio.size / RATE
        words = [
            self.Item(start=t - offset, end=t + 0.4 - offset, word=f" w{int(t * 2)}")
            for t in np.arange(np.ceil(offset * 2) / 2, end - 0.5, 0.5)
        ]
        segments = {}
        for word in words:
            segments.setdefault(int((word.start + offset) // 2), []).append(word)
        return [
            self.Item(start=ws[0].start, end=ws[-1].end, no_speech_prob=0.0, words=ws)
            for _, ws in sorted(segments.items())
        ], None


def test_a_long_stream_trims_its_buffer_at_committed_segments_and_loses_no_word():
    processor = OnlineProcessor(Ramp(), StreamOptions(trim_seconds=6.0))
    stream = (np.arange(30 * RATE) / RATE / 1000).astype(np.float64)
    iterations = replay(processor, stream, 1.0, wait=False)
    assert max(it.buffer for it in iterations) <= 8  # cut at completed segments: the start moved
    assert processor._offset >= 20
    said = [word.text for word in processor.committed]
    assert said == [f" w{n}" for n in range(len(said))] and len(said) >= 55  # in order, once each
    result = summary(iterations, 30.0)
    assert result["iterations"] == 30 and result["final_lag_seconds"] is None


class Unused:
    def transcribe(self, *args, **kwargs):
        raise AssertionError("nothing should be transcribed")


@pytest.mark.parametrize(
    "chunk, sampling_rate, message",
    [
        (np.zeros(160, np.int16), RATE, "floating-point samples"),
        (np.zeros((160, 2), np.float32), RATE, "1-D mono waveform"),
        (np.array([0.0, np.nan], np.float32), RATE, "NaN"),
        (np.array([0.0, np.inf], np.float32), RATE, "NaN or infinite"),
        (np.zeros(160, np.float32), 8000, "16000 Hz"),
    ],
)
def test_a_bad_chunk_is_refused_and_nothing_is_appended(chunk, sampling_rate, message):
    processor = OnlineProcessor(Unused())
    processor.insert_audio(np.zeros(1600, np.float32))
    with pytest.raises(ValueError, match=message):
        processor.insert_audio(chunk, sampling_rate)
    assert processor.buffer_seconds == pytest.approx(0.1)


def test_an_empty_chunk_changes_nothing_and_a_finished_stream_takes_no_audio():
    processor = OnlineProcessor(Unused())
    processor.insert_audio(np.zeros(0, np.float32))
    assert processor.process_iter() == []  # an empty buffer is not transcribed
    assert processor.finish() == [] and processor.finish() == []
    with pytest.raises(ValueError, match="finished"):
        processor.insert_audio(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="finished"):
        processor.process_iter()


def test_stream_options_are_checked_once():
    with pytest.raises(ValueError, match="itself"):
        StreamOptions(transcribe_options={"initial_prompt": "x"})
    with pytest.raises(ValueError, match="trim_seconds"):
        StreamOptions(trim_seconds=0)
    assert StreamOptions(transcribe_options={"beam_size": 5}).transcribe_kwargs("")["beam_size"] == 5
    assert StreamOptions().transcribe_kwargs("hi")["beam_size"] == 1


def test_the_stream_command_replays_a_file_and_writes_its_times(tmp_path, capsys):
    import json
    import os

    from ct2_flash.cli import main

    from .conftest import DATA

    out = tmp_path / "stream.json"
    clip = os.path.join(DATA, "clip01_slt.ogg")
    assert main(["stream", clip, "--no-wait", "--compute-type", "float32", "--chunk", "1.5", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    printed = [line.split(None, 2)[2] for line in capsys.readouterr().out.strip().splitlines()]
    assert document["committed"] and " ".join(printed) == document["committed"]  # printed as committed
    assert document["summary"]["iterations"] == len(document["iterations"]) >= 2
    assert document["loop"]["redecodes"] >= 1
    assert main(["stream", str(tmp_path / "missing.ogg")]) == 2
    assert main(["stream", clip, "--chunk", "0"]) == 2
