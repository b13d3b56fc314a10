"""``ct2-flash adapt``: a user's recordings found, split by file, cut, and a drafter adapted on them."""

import json
import os
import shutil
import wave

import numpy as np
import pytest

from ct2_flash.drafting.files import DrafterMismatchError
from ct2_flash.train import user_audio

from .conftest import DATA, LONG_PATH, segments_of

torch = pytest.importorskip("torch")

from ct2_flash.train.adapt import AdaptError, AdaptOptions, adapt, summary_lines, work_dir_for  # noqa: E402

CLIPS = [os.path.join(DATA, name) for name in ("clip01_slt.ogg", "clip02_awb.ogg", "clip05_kal16.ogg")]


def _write_wav(path, samples: np.ndarray) -> str:
    with wave.open(str(path), "wb") as stream:
        stream.setnchannels(1)
        stream.setsampwidth(2)
        stream.setframerate(16000)
        stream.writeframes((samples * 32767).astype(np.int16).tobytes())
    return str(path)


@pytest.fixture
def user_folder(tmp_path):
    """Three speech clips and every kind of bad file, in nested folders."""
    root = tmp_path / "recordings"
    (root / "calls").mkdir(parents=True)
    for clip in CLIPS:
        shutil.copy(clip, root / "calls")
    (root / "empty.wav").write_bytes(b"")
    (root / "notes.wav").write_text("not audio")
    _write_wav(root / "silence.wav", np.zeros(16000 * 3))
    _write_wav(root / "click.wav", np.full(800, 0.1))  # 50 ms
    (root / "readme.txt").write_text("ignored: not an audio extension")
    return root


def test_files_are_found_recursively_and_split_by_file_stably(user_folder, tmp_path):
    (tmp_path / "nothing").mkdir()
    files, empty = user_audio.find_audio([str(user_folder), str(tmp_path / "nothing")])
    assert len(files) == 7 and not any(f.endswith(".txt") for f in files)
    assert [s.skipped for s in empty] == ["folder without audio files"]
    split = user_audio.split_by_file(files, 0.2)
    assert list(split.values()).count("validation") == 1  # round(0.2 * 7)
    assert user_audio.split_by_file(list(reversed(files)), 0.2) == split  # by path, not by order
    assert list(user_audio.split_by_file(files[:2], 0.9).values()).count("train") == 1  # never all held out
    with pytest.raises(ValueError, match="at least two audio files"):
        user_audio.split_by_file(files[:1], 0.2)
    with pytest.raises(ValueError, match="between 0 and 1"):
        user_audio.split_by_file(files, 1.0)
    with pytest.raises(FileNotFoundError, match="typo"):
        user_audio.find_audio([str(tmp_path / "typo")])


def test_bad_files_are_skipped_with_their_reason_and_windows_keep_their_files_side(user_folder, tmp_path):
    files, _ = user_audio.find_audio([str(user_folder)])
    split = {path: ("validation" if "clip02" in path else "train") for path in files}
    data = tmp_path / "work"
    sources = user_audio.prepare(str(data), split, progress=False)
    reasons = {os.path.basename(s.path): s.skipped for s in sources}
    assert reasons["empty.wav"].startswith("unreadable") and reasons["notes.wav"].startswith("unreadable")
    assert reasons["silence.wav"] == "no speech found by the VAD"
    assert reasons["click.wav"] == "shorter than 0.2 s"
    assert all(not reasons[os.path.basename(c)] for c in CLIPS)
    summary = user_audio.summarize(sources)
    assert summary["train"]["files"] == 2 and summary["validation"]["files"] == 1 and len(summary["skipped"]) == 4
    with open(data / "manifest.jsonl", encoding="utf-8") as stream:
        entries = [json.loads(line) for line in stream]
    assert len(entries) == 3 and all(e["split"] == split[e["voice"]] for e in entries)
    # Resumes: a second pass writes nothing more, and a window a killed run wrote is not listed twice.
    with open(data / "sources.jsonl", encoding="utf-8") as stream:
        lines = stream.readlines()
    with open(data / "sources.jsonl", "w", encoding="utf-8") as stream:
        stream.writelines(lines[:-1] + [lines[-1][:10]])  # the last file's record cut short
    again = user_audio.prepare(str(data), split, progress=False)
    assert [s.path for s in again] == [s.path for s in sources]
    with open(data / "manifest.jsonl", encoding="utf-8") as stream:
        assert len(stream.readlines()) == 3


def test_long_recordings_are_cut_at_the_vads_speech_into_windows_of_at_most_30_s(clips):
    audio = clips[os.path.basename(LONG_PATH)]
    windows = user_audio.speech_windows(audio)
    assert len(windows) >= 4 and all(0.2 * 16000 <= w.size <= 30 * 16000 for w in windows)
    assert sum(w.size for w in windows) <= audio.size
    (short,) = user_audio.speech_windows(audio[: 16000 * 10])
    assert short.size == 16000 * 10  # a recording of up to 30 s stays whole


def test_nothing_usable_is_an_error_before_training(tmp_path, user_folder):
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("empty.wav", "notes.wav", "silence.wav"):
        shutil.copy(user_folder / name, bad)
    with pytest.raises(AdaptError, match="no usable training audio|no usable held-out audio"):
        adapt([str(bad)], str(tmp_path / "drafter"), AdaptOptions(steps=10), progress=False)
    assert not os.path.exists(tmp_path / "drafter")
    (tmp_path / "none").mkdir()
    with pytest.raises(AdaptError, match="no audio files"):
        adapt([str(tmp_path / "none")], str(tmp_path / "d2"), AdaptOptions(steps=10), progress=False)


@pytest.mark.slow  # 40 s: three clips through every step twice, and the schedule once more
def test_adapt_writes_a_drafter_that_loads_decodes_exactly_and_resumes_its_schedule(
    tmp_path, user_folder, model_path, clips, monkeypatch
):
    """A few updates on two clips, one held out: the report, the exported drafter, the checks
    at load, the float32 loop's identity with it, and a killed run resumed."""
    from ct2_flash import FlashWhisperModel
    from ct2_flash.train import adapt as adapt_module
    from ct2_flash.train import fit as fit_module

    out = str(tmp_path / "drafter")
    options = AdaptOptions(steps=12, threads=2)
    # Killed in the middle of training (after the state saved at step 25 would be; here at 8).
    real_step = fit_module.train_step

    def dies_at_8(model, optimizer, batch, full_to_short, config, step):
        if step == 8:
            raise KeyboardInterrupt
        return real_step(model, optimizer, batch, full_to_short, config, step)

    monkeypatch.setattr(fit_module, "train_step", dies_at_8)
    monkeypatch.setattr(adapt_module, "SAVE_EVERY", 4)  # saved at 4 and 8, as every 25 in a real run
    with pytest.raises(KeyboardInterrupt):
        adapt([str(user_folder / "calls")], out, options, progress=False)
    assert not os.path.exists(out)
    with pytest.raises(FileExistsError, match="--resume"):
        adapt([str(user_folder / "calls")], out, options, progress=False)
    monkeypatch.setattr(fit_module, "train_step", real_step)
    report = adapt([str(user_folder / "calls")], out, options, resume=True, progress=False)

    work = work_dir_for(out)
    with open(os.path.join(work, "run", "train_state.json"), encoding="utf-8") as stream:
        resumed = json.load(stream)
    # The same schedule from scratch, uninterrupted: the same losses.
    config = fit_module.FitConfig(**resumed["fit_config"])
    straight = fit_module.fit(
        work, str(tmp_path / "straight"), config, model_name=model_path, init_from=report["start"], progress=False
    )
    np.testing.assert_allclose(resumed["losses"], straight["losses"], rtol=1e-5)
    assert len(resumed["losses"]) == 12

    assert report["data"]["train"]["files"] == 2 and report["data"]["validation"]["files"] == 1
    every = report["held_out"]["every_round"]
    # The start is validated too, so what is kept is never worse on the held-out windows.
    assert every["adapted"]["mean_accepted_length"] >= every["start"]["mean_accepted_length"]
    assert report["held_out"]["defaults"]["identical"] == report["held_out"]["defaults"]["greedy_files"] == 1
    assert any("same tokens on 1/1 files decoded greedily" in line for line in summary_lines(report))
    assert set(os.listdir(out)) >= {
        "adapt_report.json",
        "adapt_report.png",
        "adapted.json",
        "drafter.json",
        "export.json",
        "propose.onnx",
    }
    with pytest.raises(FileExistsError, match="--force"):
        adapt([str(user_folder / "calls")], out, options, progress=False)

    # Loads for its model and compute type, refused at another; exact in the float32 loop.
    flash = FlashWhisperModel(
        model_path,
        compute_type="float32",
        cpu_threads=2,
        drafter=out,
        stock_engine=False,
        adaptive=False,
        redecodes=False,
    )
    with pytest.raises(DrafterMismatchError, match="compute type 'float32'"):
        FlashWhisperModel(model_path, compute_type="int8", cpu_threads=2, drafter=out, stock_engine=False)
    from faster_whisper import WhisperModel

    baseline = WhisperModel(model_path, compute_type="float32", cpu_threads=2)
    for name in ("clip01_slt.ogg", "clip05_kal16.ogg"):
        assert segments_of(flash, clips[name], beam_size=1) == segments_of(baseline, clips[name], beam_size=1)
    assert flash.spec_stats.draft_rounds > 0
    # The teacher's labels are the target's own greedy output: faster-whisper's text per clip.
    with open(os.path.join(work, "manifest.jsonl"), encoding="utf-8") as stream:
        source = {e["id"]: e["voice"] for e in map(json.loads, stream)}
    with open(os.path.join(work, "teacher.jsonl"), encoding="utf-8") as stream:
        records = [json.loads(line) for line in stream]
    assert len(records) == 3
    for record in records:
        segments, _ = baseline.transcribe(
            source[record["id"]], beam_size=1, temperature=0.0, without_timestamps=not record["timestamps"]
        )
        assert record["hypothesis"] == "".join(s.text for s in segments).strip()


def test_a_drafter_adapted_for_another_model_is_refused(tmp_path, model_path):
    from ct2_flash.drafting.files import check_adapted, write_adapted

    drafter = tmp_path / "drafter"
    drafter.mkdir()
    copy = tmp_path / "model"
    shutil.copytree(model_path, copy)
    with open(copy / "model.bin", "r+b") as stream:  # another fine-tune of the same architecture
        stream.seek(-4, os.SEEK_END)
        stream.write(b"\x00\x01\x02\x03")
    write_adapted(str(drafter), str(copy), "float32", {})
    check_adapted(str(drafter), str(copy), "float32")
    with pytest.raises(DrafterMismatchError, match="adapted for the model in"):
        check_adapted(str(drafter), model_path, "float32")
    (drafter / "adapted.json").write_text("{")
    with pytest.raises(ValueError, match="not a valid adaptation record"):
        check_adapted(str(drafter), model_path, "float32")


def test_speed_copies_are_training_windows_of_the_same_file_only(tmp_path):
    split = {CLIPS[0]: "train", CLIPS[1]: "validation"}
    data = tmp_path / "work"
    sources = user_audio.prepare(str(data), split, progress=False, copies=2)
    with open(data / "manifest.jsonl", encoding="utf-8") as stream:
        entries = [json.loads(line) for line in stream]
    copies = [e for e in entries if "c" in e["id"][-2:]]
    assert [e["split"] for e in copies] == ["train", "train"] and {e["voice"] for e in copies} == {CLIPS[0]}
    original = next(e for e in entries if e["id"] == "f00000w000")
    assert all(0.85 * original["seconds"] <= e["seconds"] <= 1.15 * original["seconds"] for e in copies)
    assert all(e["seconds"] != original["seconds"] for e in copies)
    assert sources[0].windows == 1 and sources[0].seconds == original["seconds"]  # the user's audio, counted once
    again = user_audio.speed_copies(np.ones(16000, np.float32), 2, "0/0")
    assert [a.size for a in again] == [a.size for a in user_audio.speed_copies(np.ones(16000, np.float32), 2, "0/0")]
