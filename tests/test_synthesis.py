"""Training speech synthesis: augmentation, text sources and voice checks (no TTS engine needed)."""

import random

import numpy as np
import pytest

from ct2_flash.train import augment, corpus, voices


def _tone(seconds=2.0):
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * 300 * t) * 32767).astype(np.int16)


def test_a_chain_picks_only_channels_this_build_can_encode():
    assert set(augment.channels()) <= set(augment.CHANNELS)
    assert {"telephone", "mulaw", "alaw"} <= set(augment.channels())  # FFmpeg's own PCM codecs
    assert not augment.encodable("no-such-codec")


@pytest.mark.parametrize("channel", augment.channels())
def test_channel_round_trip_keeps_length_and_signal(channel):
    audio = _tone().astype(np.float32) / 32768
    out = augment.through_channel(audio, channel)
    assert out.shape == audio.shape and out.dtype == np.float32
    # A lossy channel, not a broken one: most of the energy survives.
    assert 0.3 < np.sqrt(np.mean(out**2)) / np.sqrt(np.mean(audio**2)) < 2.0


def test_augment_is_a_function_of_the_seed_and_records_each_step():
    speech = _tone()
    others = [_tone(1.0), _tone(3.0)]
    seen = set()
    for seed in range(40):
        first, info = augment.augment(speech, np.random.default_rng(seed), lambda: others[0])
        again, info_again = augment.augment(speech, np.random.default_rng(seed), lambda: others[0])
        assert np.array_equal(first, again) and info == info_again
        assert first.dtype == np.int16
        assert -26 <= info["peak_dbfs"] <= -1
        if "speed" not in info:
            assert first.size == speech.size
        seen.update(info)
    # Forty chains exercise every kind of step.
    assert {"speed", "rt60", "noise", "snr_db", "channel", "gain_ride_db"} <= seen


def test_babble_falls_back_without_other_utterances():
    for seed in range(20):
        _, info = augment.augment(_tone(), np.random.default_rng(seed), None)
        assert info.get("noise") != "babble"


@pytest.mark.parametrize("kind", sorted(corpus.ALL_TEMPLATES))
def test_every_template_formats(kind):
    rng = random.Random(0)
    for template in corpus.ALL_TEMPLATES[kind]:
        text = corpus.fill(template, rng)
        assert "{" not in text and len(text.split()) >= 4


def test_passages_mix_template_families_deterministically():
    mix = {"numbers": 0.5, "conversation": 0.3, "dialogue": 0.2}
    first = [next(corpus.passages(3, 10, 20, mix)) for _ in range(2)]
    assert first[0] == first[1]
    generator = corpus.passages(3, 10, 20, mix)
    for _ in range(5):
        assert 10 <= len(next(generator).split()) <= 20 + 60


def test_voice_without_its_engine_is_skipped_with_the_install_command(monkeypatch):
    monkeypatch.setattr(voices.shutil, "which", lambda name: None)
    working, missing = voices.installed([voices.Voice("espeak-ng", "en-us"), voices.Voice("flite", "slt")])
    assert working == []
    assert "apt-get install espeak-ng" in missing["espeak-ng:en-us"]
    assert "apt-get install flite" in missing["flite:slt"]


def test_voice_settings_are_recorded_per_engine():
    rng = np.random.default_rng(0)
    for voice, _ in voices.catalogue():
        options = voices.settings(voice, rng)
        assert options and all(isinstance(v, (int, float, str)) for v in options.values())
