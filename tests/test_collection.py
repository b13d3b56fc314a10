"""Whole collections (``ct2_flash.jobs.collection``, ``ct2-flash transcribe`` over folders): what is
found, what is skipped on a rerun, what a bad file does, and that nothing half-written is left."""

import os
import shutil
import subprocess
import sys

import pytest

from ct2_flash.jobs.collection import (
    AudioFile,
    CollectionError,
    FileResult,
    find_audio,
    largest_first,
    transcribe_files,
)
from ct2_flash.jobs.outputs import FORMATS, WRITERS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _collection(root):
    """Two clips at the top, one in a sub-folder, and three files that cannot be decoded."""
    (root / "sub").mkdir(parents=True)
    shutil.copy(os.path.join(DATA, "clip01_slt.ogg"), root / "first.ogg")
    shutil.copy(os.path.join(DATA, "clip08_slt.ogg"), root / "second.ogg")
    shutil.copy(os.path.join(DATA, "clip03_rms.ogg"), root / "sub" / "third.ogg")
    (root / "empty.wav").write_bytes(b"")
    (root / "notes.mp3").write_text("not audio at all\n")
    corrupt = open(os.path.join(DATA, "clip02_awb.ogg"), "rb").read()
    (root / "sub" / "corrupt.ogg").write_bytes(bytes(200) + corrupt[200:])  # its header gone
    (root / "readme.md").write_text("not taken: not an audio extension\n")
    return root


def test_folders_mirror_their_sub_folders_and_lists_name_files(tmp_path):
    root = _collection(tmp_path / "in")
    found = {audio.stem: audio.path for audio in find_audio([str(root)])}
    assert set(found) == {"empty", "first", "notes", "second", "sub/corrupt", "sub/third"}
    listing = tmp_path / "list.txt"
    listing.write_text("# what to do\nin/first.ogg\n\n" + str(root / "sub" / "third.ogg") + "  # absolute\n")
    assert [(a.stem, os.path.basename(a.path)) for a in find_audio([str(listing)])] == [
        ("first", "first.ogg"),
        ("third", "third.ogg"),
    ]
    # A file named directly and again through its folder is one file.
    assert len(find_audio([str(root / "first.ogg"), str(root)])) == 6


def test_names_that_cannot_be_transcribed_as_asked_say_so_before_anything_runs(tmp_path):
    root = _collection(tmp_path / "in")
    with pytest.raises(CollectionError, match="no such file or folder: .*nowhere.ogg"):
        find_audio([str(root), str(tmp_path / "nowhere.ogg")])
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(root / "first.ogg", other / "first.ogg")
    with pytest.raises(CollectionError, match="would write the same outputs"):
        find_audio([str(root / "first.ogg"), str(other / "first.ogg")])
    listing = tmp_path / "list.txt"
    listing.write_text("in/first.ogg\nin/gone.ogg\n")
    with pytest.raises(CollectionError, match="gone.ogg .listed in"):
        find_audio([str(listing)])


def test_a_collection_is_transcribed_as_faster_whisper_transcribes_each_file(float32_pair, tmp_path):
    root = _collection(tmp_path / "in")
    out = tmp_path / "out"
    results = {
        os.path.relpath(r.path, root): r
        for r in transcribe_files([str(root)], str(out), FORMATS, model=float32_pair.flash, beam_size=1)
    }
    assert {name: r.status for name, r in results.items()} == {
        "first.ogg": "done",
        "second.ogg": "done",
        os.path.join("sub", "third.ogg"): "done",
        "empty.wav": "failed",
        "notes.mp3": "failed",
        os.path.join("sub", "corrupt.ogg"): "failed",
    }
    assert all(r.error for r in results.values() if r.status == "failed")
    for name, stem in (
        ("first.ogg", "first"),
        ("second.ogg", "second"),
        (os.path.join("sub", "third.ogg"), "sub/third"),
    ):
        segments, info = float32_pair.baseline.transcribe(str(root / name), beam_size=1)
        segments = list(segments)
        for form in FORMATS:
            written = (out / f"{stem}.{form}").read_text(encoding="utf-8")
            assert written == WRITERS[form](segments, info), (name, form)
        assert results[name].audio_seconds == pytest.approx(info.duration)
    assert sorted(p.name for p in out.rglob("*") if p.is_file() and p.name.startswith(".")) == []


def test_a_rerun_skips_finished_files_and_redoes_the_rest(float32_pair, tmp_path, monkeypatch):
    """An interruption mid-run (here Ctrl-C in the second file's decode) leaves the first file's
    outputs and no partial file; the rerun leaves those untouched and does the rest."""
    root = _collection(tmp_path / "in")
    for bad in ("empty.wav", "notes.mp3", os.path.join("sub", "corrupt.ogg")):
        os.remove(root / bad)
    out = tmp_path / "out"
    flash = float32_pair.flash
    transcribe = type(flash).transcribe
    calls = []

    def interrupted(self, audio, *args, **kwargs):
        calls.append(audio)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return transcribe(self, audio, *args, **kwargs)

    monkeypatch.setattr(type(flash), "transcribe", interrupted)
    done = []
    with pytest.raises(KeyboardInterrupt):
        for result in transcribe_files([str(root)], str(out), ("txt", "json"), model=flash):
            done.append(result)
    assert [r.status for r in done] == ["done"]
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["first.json", "first.txt"]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    monkeypatch.setattr(type(flash), "transcribe", transcribe)
    again = list(transcribe_files([str(root)], str(out), ("txt", "json"), model=flash))
    assert [(os.path.basename(r.path), r.status) for r in again] == [
        ("first.ogg", "skipped"),
        ("second.ogg", "done"),
        ("third.ogg", "done"),
    ]
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in before.items())
    assert isinstance(again[0], FileResult) and again[0].outputs == [str(out / "first.txt"), str(out / "first.json")]


def test_an_output_half_written_is_never_left_under_its_name(tmp_path, monkeypatch):
    from ct2_flash.jobs import outputs

    def failing(segments, info):
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(outputs.WRITERS, "json", failing)
    with pytest.raises(OSError):
        outputs.write_outputs([], None, "x.ogg", str(tmp_path), ("txt", "json"))
    assert list(tmp_path.iterdir()) == []


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "ct2_flash.cli", "transcribe", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_the_command_writes_a_failures_file_and_says_so_in_its_exit_code(tmp_path):
    root = _collection(tmp_path / "in")
    os.remove(root / "second.ogg")
    os.remove(root / "sub" / "third.ogg")
    out = tmp_path / "out"
    run = _cli(str(root), "--output-dir", str(out), "--temperature", "0")
    assert run.returncode == 1, run.stderr
    assert (out / "first.txt").is_file()
    failures = (out / "failures.tsv").read_text(encoding="utf-8").splitlines()
    assert sorted(line.split("\t")[0] for line in failures) == sorted(
        str(root / name) for name in ("empty.wav", "notes.mp3", os.path.join("sub", "corrupt.ogg"))
    )
    assert "1 transcribed" in run.stderr and "3 failed" in run.stderr and "failures.tsv" in run.stderr
    assert " left" in run.stderr  # the bar's time left, by the audio the containers state
    for bad in ("empty.wav", "notes.mp3", os.path.join("sub", "corrupt.ogg")):
        os.remove(root / bad)
    rerun = _cli(str(root), "--output-dir", str(out))
    assert rerun.returncode == 0, rerun.stderr
    assert "1 skipped" in rerun.stderr and not (out / "failures.tsv").exists()


def test_the_command_refuses_what_it_cannot_do_before_starting(tmp_path):
    root = _collection(tmp_path / "in")
    missing = _cli(str(root / "nowhere.ogg"), "--output-dir", str(tmp_path / "out"))
    assert missing.returncode == 2 and "no such file or folder" in missing.stderr
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    unwritable = _cli(str(root / "first.ogg"), "--output-dir", str(blocked / "out"))
    assert unwritable.returncode == 2 and "cannot write to the output folder" in unwritable.stderr
    assert not (tmp_path / "out").exists()


def test_two_jobs_write_what_one_job_writes(model_path, tmp_path):
    """Two files at a time on one model (two CTranslate2 replicas, the loop taken by one call at a
    time): the same transcripts as one at a time."""
    from ct2_flash import FlashWhisperModel

    from .conftest import THREADS

    root = _collection(tmp_path / "in")
    for bad in ("empty.wav", "notes.mp3", os.path.join("sub", "corrupt.ogg")):
        os.remove(root / bad)
    shutil.copy(os.path.join(DATA, "clip06_awb.ogg"), root / "fourth.ogg")
    model = FlashWhisperModel(model_path, compute_type="float32", cpu_threads=max(1, THREADS // 2), num_workers=2)
    one = list(transcribe_files([str(root)], str(tmp_path / "one"), ("txt", "srt"), model=model))
    two = list(transcribe_files([str(root)], str(tmp_path / "two"), ("txt", "srt"), model=model, jobs=2))
    assert sorted(r.path for r in two) == sorted(r.path for r in one) and {r.status for r in two} == {"done"}
    for path in sorted((tmp_path / "one").rglob("*.*")):
        assert path.read_text() == (tmp_path / "two" / path.relative_to(tmp_path / "one")).read_text(), path
    with pytest.raises(ValueError, match="jobs"):
        list(transcribe_files([str(root)], str(tmp_path / "three"), model=model, jobs=0))


@pytest.mark.parametrize(
    "files, jobs, threads, cores, layout",
    [
        (10, None, None, 2, (2, 1)),  # one job per core, one thread each
        (1, None, None, 2, (1, 2)),  # one file: one job on both cores
        (3, None, None, 4, (3, 1)),  # no more jobs than files
        (10, 1, None, 2, (1, 2)),  # jobs given: the cores divided among them
        (10, None, 2, 4, (2, 2)),  # threads given: as many jobs as fit
        (0, None, None, 2, (1, 2)),  # nothing left to do
    ],
)
def test_the_default_layout_is_a_job_per_core(files, jobs, threads, cores, layout):
    from ct2_flash.jobs.collection import default_layout

    assert default_layout(files, jobs, threads, cores) == layout


def test_files_in_flight_start_largest_first_ties_in_their_order(tmp_path):
    sizes = {"a": 10, "b": 30, "c": 10, "d": 20}
    for name, size in sizes.items():
        (tmp_path / name).write_bytes(b"x" * size)
    files = [AudioFile(str(tmp_path / name), name) for name in [*sizes, "gone"]]
    assert [audio.stem for audio in largest_first(files)] == ["b", "d", "a", "c", "gone"]


def test_without_ray_the_ray_option_says_how_to_get_it(tmp_path, monkeypatch):
    import builtins

    from ct2_flash.jobs.collection import transcribe_on_ray

    real_import = builtins.__import__

    def without_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_ray)
    root = _collection(tmp_path / "in")
    with pytest.raises(CollectionError, match=r"pip install 'ct2-flash\[ray\]'"):
        list(transcribe_on_ray(find_audio([str(root / "first.ogg")]), str(tmp_path / "out"), ("txt",), {}))
    assert not (tmp_path / "out" / "first.txt").exists()


@pytest.mark.slow
def test_a_collection_on_a_local_ray_instance_writes_what_one_machine_writes(model_path, tmp_path):
    """The same job as Ray Data (one model per actor, two actors of one thread on a local
    instance): the same outputs and failures as the single-machine run, and a rerun skips."""
    ray = pytest.importorskip("ray")
    from ct2_flash import FlashWhisperModel
    from ct2_flash.jobs.collection import transcribe_on_ray

    root = _collection(tmp_path / "in")
    model = FlashWhisperModel(model_path, compute_type="int8", cpu_threads=1)
    here = {r.path: r for r in transcribe_files([str(root)], str(tmp_path / "here"), ("txt", "srt"), model=model)}
    files = find_audio([str(root)])
    options = dict(model_size_or_path=model_path, compute_type="int8", cpu_threads=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        there = {r.path: r for r in transcribe_on_ray(files, str(tmp_path / "there"), ("txt", "srt"), options)}
        assert {p: r.status for p, r in there.items()} == {p: r.status for p, r in here.items()}
        assert all(there[p].error for p, r in here.items() if r.status == "failed")
        for path in sorted((tmp_path / "here").rglob("*.*")):
            assert path.read_text() == (tmp_path / "there" / path.relative_to(tmp_path / "here")).read_text(), path
        again = list(transcribe_on_ray(files, str(tmp_path / "there"), ("txt", "srt"), options))
        assert sorted(r.status for r in again) == ["failed"] * 3 + ["skipped"] * 3
    finally:
        ray.shutdown()


def test_a_ray_address_that_does_not_answer_is_refused_at_once():
    import socket

    from ct2_flash.jobs.collection import _check_reachable

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(CollectionError, match="does not answer"):
        _check_reachable(f"127.0.0.1:{port}")
    with pytest.raises(CollectionError, match="does not answer"):
        _check_reachable(f"ray://127.0.0.1:{port}")
    with pytest.raises(CollectionError, match="not a Ray address"):
        _check_reachable("head-node")


def test_a_killed_run_is_resumed_and_leaves_no_partial_file(tmp_path):
    """SIGKILL while the command works through a folder, then the same command again: the
    files finished before the kill keep their outputs untouched, the rest are done, and no
    temporary file is left (one a kill left mid-write is removed when its target is written)."""
    import signal
    import time

    root = tmp_path / "in"
    root.mkdir()
    names = ["clip01_slt", "clip02_awb", "clip03_rms", "clip04_slt", "clip05_kal16", "clip06_awb", "clip07_rms"]
    for name in names:
        shutil.copy(os.path.join(DATA, f"{name}.ogg"), root / f"{name}.ogg")
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "ct2_flash.cli",
        "transcribe",
        str(root),
        "--output-dir",
        str(out),
        "--jobs",
        "1",
        "--files-in-flight",
        "1",  # in order: the kill leaves the last files to do
        "--output-format",
        "all",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (out / "clip01_slt.json").exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = {p: p.stat().st_mtime_ns for p in out.glob("*.*") if not p.name.startswith(".")}
    assert finished, "the command wrote nothing before the kill"
    stale = out / f".clip07_rms.txt.partial-{2**22 + 7}"  # what a kill mid-write leaves (no such process)
    stale.write_text("half a transcr")
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert all(p.stat().st_mtime_ns == mtime for p, mtime in finished.items())
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{n}.{f}" for n in names for f in FORMATS)


def test_audio_without_speech_is_an_empty_transcript_not_a_failure(float32_pair, tmp_path):
    import wave

    (tmp_path / "in").mkdir()
    with wave.open(str(tmp_path / "in" / "silence.wav"), "wb") as stream:
        stream.setnchannels(1)
        stream.setsampwidth(2)
        stream.setframerate(16000)
        stream.writeframes(bytes(2 * 16000 * 3))
    (result,) = transcribe_files([str(tmp_path / "in")], str(tmp_path / "out"), ("txt",), model=float32_pair.flash)
    segments, info = float32_pair.baseline.transcribe(str(tmp_path / "in" / "silence.wav"), beam_size=1)
    assert result.status == "done" and result.audio_seconds == pytest.approx(3.0)
    assert (tmp_path / "out" / "silence.txt").read_text() == WRITERS["txt"](list(segments), info)


def test_transcribe_options_are_flags_of_faster_whispers_names():
    """Flags given reach transcribe() under faster-whisper's names; flags not given leave its
    defaults (they are not passed)."""
    import argparse
    import inspect

    from faster_whisper import WhisperModel

    from ct2_flash.cli import transcribe

    parser = argparse.ArgumentParser()
    transcribe.add_parser(parser.add_subparsers(dest="command"))
    given = ["x.wav", "--temperature", "0", "--no-condition-on-previous-text", "--best-of", "3"]
    given += ["--without-timestamps", "--no-suppress-blank", "--hotwords", "ct2", "--log-prob-threshold", "-0.5"]
    options = transcribe._transcribe_options(parser.parse_args(["transcribe", *given]))
    assert options == dict(
        beam_size=1,
        language=None,
        word_timestamps=False,
        vad_filter=False,
        temperature=0.0,
        condition_on_previous_text=False,
        best_of=3,
        without_timestamps=True,
        suppress_blank=False,
        hotwords="ct2",
        log_prob_threshold=-0.5,
    )
    names = set(inspect.signature(WhisperModel.transcribe).parameters)
    assert {name for name, _ in transcribe.MORE_OPTIONS} <= names
    plain = transcribe._transcribe_options(parser.parse_args(["transcribe", "x.wav"]))
    assert plain == dict(beam_size=1, language=None, word_timestamps=False, vad_filter=False)


def test_durations_come_from_the_container_and_the_time_left_from_them(tmp_path):
    from faster_whisper import decode_audio

    from ct2_flash.cli.transcribe import _Eta
    from ct2_flash.jobs.collection import audio_duration

    clip = os.path.join(DATA, "clip01_slt.ogg")
    assert audio_duration(clip) == pytest.approx(len(decode_audio(clip)) / 16000, abs=0.05)
    (tmp_path / "notes.mp3").write_text("not audio at all\n")
    (tmp_path / "empty.wav").write_bytes(b"")
    assert audio_duration(str(tmp_path / "notes.mp3")) is None
    assert audio_duration(str(tmp_path / "empty.wav")) is None
    assert audio_duration(str(tmp_path / "missing.wav")) is None
    eta = _Eta({"a": 10.0, "b": 30.0, "c": None})  # c counts as the mean of the others: 20 s
    assert eta.seconds(5.0) is None  # nothing finished yet: no rate
    eta.finished("a")  # 10 s of audio in 5 s of wall time: 50 s left at that rate
    assert eta.seconds(5.0) == pytest.approx(25.0)
    eta.finished("c")
    eta.finished("b")
    assert eta.seconds(30.0) == 0.0
