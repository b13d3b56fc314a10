"""The benchmark: statistics helpers, manifests, speech-set unpacking, and one end-to-end run."""

import io
import json
import os
import tarfile

import numpy as np
import pytest

from ct2_flash.benchmark.analysis import bucket_labels, bucket_of, paired_bootstrap, word_error_rate
from ct2_flash.benchmark.manifest import Utterance, from_directory, read_manifest, write_manifest
from ct2_flash.benchmark.speech_sets import _unpack_mfa, _unpack_pocketsphinx
from ct2_flash.stock.allocator import find_tcmalloc
from ct2_flash.stock.location import STOCK_CTRANSLATE2

from .conftest import DATA


def test_buckets_have_half_open_edges():
    assert [bucket_of(s) for s in (0.0, 4.99, 5.0, 9.99, 10.0, 19.9, 20.0, 29.99, 30.0, 94.0)] == [
        "[0,5)",
        "[0,5)",
        "[5,10)",
        "[5,10)",
        "[10,20)",
        "[10,20)",
        "[20,30)",
        "[20,30)",
        ">=30",
        ">=30",
    ]
    assert bucket_labels() == ["[0,5)", "[5,10)", "[10,20)", "[20,30)", ">=30"]
    with pytest.raises(ValueError):
        bucket_of(-1.0)


def test_paired_bootstrap():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.5, 3.0, size=40)
    same = paired_bootstrap(base, base)
    assert same == {"speedup": 1.0, "low": pytest.approx(1.0), "high": pytest.approx(1.0)}
    twice = paired_bootstrap(base, base / 2 * rng.uniform(0.9, 1.1, size=40))
    assert twice["low"] < twice["speedup"] < twice["high"]
    assert twice["low"] < 2.0 < twice["high"] and twice["high"] - twice["low"] < 0.3
    # Pairing matters: the same times shuffled give a much wider interval.
    unpaired = paired_bootstrap(base, rng.permutation(base / 2))
    assert unpaired["high"] - unpaired["low"] > twice["high"] - twice["low"]
    one = paired_bootstrap([2.0], [1.0])
    assert one == {"speedup": 2.0, "low": 2.0, "high": 2.0}
    with pytest.raises(ValueError):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [0.0])


def test_word_error_rate_normalises_like_whisper():
    assert word_error_rate(["Mister Smith, uh, has twenty-two apples."], ["mr smith has 22 apples"]) == 0.0
    assert word_error_rate(["The cat sat down."], ["the cat sat"]) == pytest.approx(0.25)
    assert word_error_rate(["", ""], ["a", "b"]) is None  # no reference text at all


def test_manifest_round_trip_and_errors(tmp_path):
    clip = os.path.join(DATA, "clip00_kal16.ogg")
    manifest = tmp_path / "sub" / "set.tsv"
    write_manifest(str(manifest), [Utterance(clip, "hello\tworld"), Utterance(clip, "")])
    read = read_manifest(str(manifest))
    assert read == [Utterance(clip, "hello world"), Utterance(clip, "")]
    extra = tmp_path / "extra.tsv"
    extra.write_text(f"path\ttext\tduration\n{clip}\tsome words\t2.5\n")
    assert read_manifest(str(extra)) == [Utterance(clip, "some words")]  # further columns are ignored
    bad = tmp_path / "bad.tsv"
    bad.write_text("path\ttext\nmissing.wav\tsomething\n")
    with pytest.raises(ValueError, match="bad.tsv:2: audio file .*missing.wav.* does not exist"):
        read_manifest(str(bad))
    empty = tmp_path / "empty.tsv"
    empty.write_text("path\ttext\n")
    with pytest.raises(ValueError, match="lists no audio"):
        read_manifest(str(empty))
    (tmp_path / "a.wav").write_bytes(b"")
    (tmp_path / "a.txt").write_text("the\nreference ")
    (tmp_path / "notes.md").write_text("x")
    assert from_directory(str(tmp_path)) == [Utterance(str(tmp_path / "a.wav"), "the reference")]


def _tar(files: dict) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


def test_speech_sets_unpack_only_english_clips_with_transcripts(tmp_path):
    conftest = b'def reference_transcripts():\n    return {"mfa_um": "montreal um aligner", "gone": "x"}\n'
    mfa = _tar(
        {
            "mfa-3/tests/conftest.py": conftest,
            "mfa-3/tests/data/wav/mfa_um.flac": b"flac",
            "mfa-3/tests/data/wav/61-70968-0000.flac": b"flac",
            "mfa-3/tests/data/wav/french_clitics.wav": b"wav",
            "mfa-3/tests/data/lab/61-70968-0000.lab": b"HE BEGAN\n",
            "mfa-3/tests/data/lab/french_clitics.lab": b"aujourd'hui",
            "mfa-3/tests/data/wav/../../../escape.flac": b"never written outside",
        }
    )
    got = _unpack_mfa(mfa, str(tmp_path))
    assert sorted((os.path.basename(u.path), u.reference) for u in got) == [
        ("61-70968-0000.flac", "HE BEGAN"),
        ("mfa_um.flac", "montreal um aligner"),
    ]
    assert sorted(os.listdir(tmp_path)) == ["61-70968-0000.flac", "mfa_um.flac"]
    sphinx = _tar(
        {
            "ps-5/test/data/librivox/a-0870.wav": b"wav",
            "ps-5/test/data/librivox/a-0870.txt": b"and mister john\n",
            "ps-5/test/data/cards/001.wav": b"wav",
            "ps-5/test/data/cards/cards.transcription": b"<s> ten of clubs  </s> (001)\n<s> x </s> (009)\n",
        }
    )
    got = _unpack_pocketsphinx(sphinx, str(tmp_path))
    assert [(os.path.basename(u.path), u.reference) for u in got] == [
        ("a-0870.wav", "and mister john"),
        ("cards_001.wav", "ten of clubs"),
    ]


def test_the_asterisk_set_keeps_spoken_prompts_with_transcripts(tmp_path, monkeypatch):
    import gzip

    from ct2_flash.benchmark import speech_sets

    sounds = "./usr/share/asterisk/sounds/en_US_f_Allison/"
    text = (
        b"; Core Asterisk Sounds in English\n\nactivated: Activated.\nbeep: [this is a simple beep tone]\n"
        b"digits/7: seven\nsilence/1: [1 second of silence]\nmissing: No file.\n"
    )
    docs = _tar({"./usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz": gzip.compress(text)})
    audio = _tar(
        {
            sounds + "activated.wav": b"wav",
            sounds + "beep.wav": b"wav",
            sounds + "digits/7.wav": b"wav",
            sounds + "silence/1.wav": b"wav",
            sounds + "unlisted.wav": b"wav",
        }
    )
    monkeypatch.setattr(speech_sets, "_deb_files", {"docs.deb": docs, "audio.deb": audio}.get)
    got = speech_sets._unpack_asterisk(["docs.deb", "audio.deb"], str(tmp_path))
    assert [(os.path.basename(u.path), u.reference) for u in got] == [
        ("activated.wav", "Activated."),
        ("digits_7.wav", "seven"),
    ]


def test_bench_runs_end_to_end_with_the_oracle(tmp_path):
    from ct2_flash.cli import main

    manifest = tmp_path / "two.tsv"
    write_manifest(
        str(manifest),
        [
            Utterance(os.path.join(DATA, "clip00_kal16.ogg"), "a reference"),
            Utterance(os.path.join(DATA, "clip01_slt.ogg"), ""),
        ],
    )
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--manifest",
            str(manifest),
            "--drafter",
            "oracle",
            "--repeats",
            "1",
            "--compute-types",
            "float32",
            "--batch-sizes",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads((out / "bench.json").read_text())
    (setting,) = document["settings"]
    summary = setting["summary"]
    assert summary["utterances"] == 2 and summary["token_identity"] == {"identical": 2, "of": 2}
    assert (
        summary["speedup"]["decode"]["low"]
        <= summary["speedup"]["decode"]["speedup"]
        <= summary["speedup"]["decode"]["high"]
    )
    assert summary["tokens_per_target_call"] > 1.0 and summary["first_position_acceptance"] > 0.5
    assert set(summary["systems"]) == {"baseline", "flash"}
    assert setting["engines"]["stock_active"] and setting["engines"]["stock_failures"] == 0  # the default: worker on
    assert document["machine"]["cpu"]  # figures name their CPU
    assert summary["systems"]["baseline"]["wer"] is not None
    assert sum(b["utterances"] for b in summary["buckets"].values()) == 2
    (batched,) = setting["batched"]
    assert batched["batch_size"] == 2 and batched["token_identity"] == {"identical": 2, "of": 2}
    # The oracle drafts every call: no row of the timed runs went to generate().
    assert batched["speculative_rows"] >= 2 and batched["generate_rows"] == 0
    for name in ("speedup_by_duration.png", "acceptance_by_position.png", "time_split.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert_time_splits_add_up(document)


def assert_time_splits_add_up(document: dict) -> None:
    """Every second of a system's whole path is in exactly one part of its time split: no part
    is negative (a second booked twice would make the remainder so) and the parts sum to the
    whole."""
    for setting in document["settings"]:
        for name, system in setting["summary"]["systems"].items():
            split = system["time_split_seconds"]
            assert min(split.values()) >= 0, (name, split)
            assert sum(split.values()) == pytest.approx(system["whole_seconds"], rel=1e-9), (name, split)


@pytest.mark.slow
def test_bench_times_stock_faster_whisper_sequential_and_batched(tmp_path):
    """``--stock`` adds faster-whisper on stock ctranslate2 (its own process) as a third system,
    one by one and through ``BatchedInferencePipeline``; the default model gives its tokens and
    word timings."""
    from ct2_flash.cli import main

    manifest = tmp_path / "two.tsv"
    write_manifest(
        str(manifest),
        [Utterance(os.path.join(DATA, "clip00_kal16.ogg"), ""), Utterance(os.path.join(DATA, "clip05_kal16.ogg"), "")],
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "bench",
                "--manifest",
                str(manifest),
                "--repeats",
                "1",
                "--compute-types",
                "int8",
                "--stock",
                "--batch-sizes",
                "2",
                "--word-timestamps",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    document = json.loads((out / "bench.json").read_text())
    assert_time_splits_add_up(document)
    (setting,) = document["settings"]
    assert setting["stock_ctranslate2"] == STOCK_CTRANSLATE2
    # Identity covers the word timings too (align() runs in ct2-flash's worker).
    assert [row["words"] > 0 for row in setting["utterances"]] == [True, True]
    # Stock twice, each in its own process: as installed, and with the tuned allocator, which
    # its process's memory maps show loaded (tcmalloc where installed, else glibc's variables).
    tuned = setting["stock_allocators"]["tuned_stock"]
    assert setting["stock_allocators"]["stock"] == {"asked": "glibc", "loaded": "glibc"}
    assert tuned["loaded"] == ("tcmalloc" if find_tcmalloc() else "glibc") and tuned["asked"].startswith(
        tuned["loaded"]
    )
    for name in ("stock", "tuned_stock"):
        assert setting["summary"][f"{name}_token_identity"] == {"identical": 2, "of": 2}
        assert set(setting["summary"][f"speedup_vs_{name}"]) == {"decode", "whole"}
    (batched,) = setting["batched"]
    assert batched["stock_token_identity"] == batched["tuned_stock_token_identity"] == {"identical": 2, "of": 2}
    assert set(batched["audio_seconds_per_second"]) == {"baseline", "flash", "stock", "tuned_stock"}
    assert all(row["stock"]["whole"] > 0 and row["tuned_stock"]["whole"] > 0 for row in batched["utterances"])


def test_bench_runs_sampling_settings_through_the_loop(tmp_path):
    """``--temperatures``: one setting per temperature; the sampled one decodes in the loop
    and is judged by WER with an interval, not by token identity."""
    from ct2_flash.cli import main

    manifest = tmp_path / "one.tsv"
    write_manifest(str(manifest), [Utterance(os.path.join(DATA, "clip04_slt.ogg"), "a reference text")])
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--no-stock-engine",
            "--manifest",
            str(manifest),
            "--drafter",
            "oracle",
            "--repeats",
            "1",
            "--compute-types",
            "float32",
            "--temperatures",
            "0",
            "0.8",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads((out / "bench.json").read_text())
    assert_time_splits_add_up(document)
    greedy, sampled = document["settings"]
    assert (greedy["temperature"], sampled["temperature"]) == (0.0, 0.8)
    assert greedy["summary"]["token_identity"] == {"identical": 1, "of": 1}
    summary = sampled["summary"]
    assert summary["speculative_rows"] >= 1 and summary["generate_rows"] == 0 and summary["draft_rounds"] > 0
    for system in ("baseline", "flash"):
        interval = summary["systems"][system]["wer_interval"]
        assert interval["low"] <= interval["wer"] <= interval["high"]


def test_bench_refuses_unreadable_audio(tmp_path, capsys):
    from ct2_flash.cli import main

    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"not audio at all")
    manifest = tmp_path / "m.tsv"
    write_manifest(str(manifest), [Utterance(str(broken), "")])
    assert main(["bench", "--manifest", str(manifest), "--out", str(tmp_path / "o")]) == 2
    assert "cannot read audio" in capsys.readouterr().err


def test_drafter_options_parse_from_the_command_line():
    from ct2_flash.benchmark.drafters import parse_option

    assert parse_option("error_rate=0.1") == ("error_rate", 0.1)
    assert parse_option("min_confidence=0") == ("min_confidence", 0)
    assert parse_option("audio_window=none") == ("audio_window", None)
    assert parse_option("audio_window=50,150") == ("audio_window", (50, 150))
    assert parse_option(" use_shortlist = false ") == ("use_shortlist", False)
    assert parse_option("precision=float32") == ("precision", "float32")
    for bad in ("precision", "=1"):
        with pytest.raises(ValueError, match="KEY=VALUE"):
            parse_option(bad)


def test_drafter_options_build_the_variant_they_name(model_path):
    """Each variant of a drafter is one system of the runner: options reach its constructor,
    and an option it does not take is refused by name, before anything runs."""
    from ct2_flash.benchmark.drafters import build_drafter
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS
    from ct2_flash.drafting.flash_drafter import FlashDrafter
    from ct2_flash.drafting.onnx_drafter import OnnxDrafter

    assert build_drafter(None, {}, "tiny.en", model_path) is None  # the model resolves it itself
    exported = build_drafter(None, {"precision": "float32", "min_confidence": 0}, "tiny.en", model_path)
    assert isinstance(exported, OnnxDrafter) and exported.precision == "float32" and exported.min_confidence == 0
    eager = build_drafter(
        os.path.join(SHIPPED_DRAFTERS, "tiny.en"), {"runtime": "pytorch", "precision": "float32"}, "tiny.en", model_path
    )
    assert isinstance(eager, FlashDrafter) and eager.precision == "float32"
    with pytest.raises(ValueError, match="OnnxDrafter takes no option error_rate"):
        build_drafter(None, {"error_rate": 0.1}, "tiny.en", model_path)
    with pytest.raises(ValueError, match="runtime must be one of"):
        build_drafter(None, {"runtime": "tensorflow"}, "tiny.en", model_path)
    with pytest.raises(ValueError, match="is not one"):
        build_drafter(DATA, {"precision": "int8"}, "tiny.en", model_path)


def test_bench_runs_an_oracle_with_injected_errors(tmp_path, capsys):
    """``--drafter oracle --drafter-option error_rate=...``: the oracle ceiling at a lower
    acceptance (what bench/run_all.sh records), still token-identical; a bad option fails
    with its name."""
    from ct2_flash.cli import main

    manifest = tmp_path / "one.tsv"
    write_manifest(str(manifest), [Utterance(os.path.join(DATA, "clip04_slt.ogg"), "")])
    out = tmp_path / "out"
    code = main(
        [
            "bench",
            "--no-stock-engine",
            "--manifest",
            str(manifest),
            "--drafter",
            "oracle",
            "--drafter-option",
            "error_rate=0.5",
            "--repeats",
            "1",
            "--compute-types",
            "float32",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    document = json.loads((out / "bench.json").read_text())
    assert document["config"]["drafter_options"] == [["error_rate", 0.5]]
    (setting,) = document["settings"]
    summary = setting["summary"]
    assert setting["drafter"] == "OracleDrafter" and summary["token_identity"] == {"identical": 1, "of": 1}
    assert 0.0 < summary["acceptance_rate"] < 0.9
    assert (
        main(
            [
                "bench",
                "--manifest",
                str(manifest),
                "--drafter",
                "oracle",
                "--drafter-option",
                "precision=int8",
                "--repeats",
                "1",
                "--out",
                str(tmp_path / "bad"),
            ]
        )
        == 2
    )
    assert "OracleDrafter takes no option precision" in capsys.readouterr().err


def test_stock_worker_protocol(model_path, clips):
    """The worker that times stock faster-whisper in its own venv, driven here by this venv's
    interpreter (the protocol and timing are the same; only the runtime differs)."""
    import sys

    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from ct2_flash.benchmark.stock import StockWorker

    audio = clips["clip00_kal16.ogg"]
    model = WhisperModel(model_path, compute_type="int8", cpu_threads=2)
    expected, _ = model.transcribe(audio, beam_size=1)
    batched, _ = BatchedInferencePipeline(model).transcribe(audio, beam_size=1, batch_size=2)
    with StockWorker(sys.executable, model_path, "int8", 2, num_workers=2) as worker:
        got = worker.measure("clip00", audio, seed=0, beam_size=1)
        again = worker.measure("clip00", audio, seed=0, beam_size=1)
        in_batches = worker.measure("clip00", audio, seed=0, batched=True, beam_size=1, batch_size=2)
        seconds, two_threads = worker.shared({"clip00": audio, "clip01": clips["clip01_slt.ogg"]}, 2, beam_size=1)
    assert 0 < seconds < 60
    alone, _ = model.transcribe(clips["clip01_slt.ogg"], beam_size=1)
    assert two_threads == [got.tokens, [list(s.tokens) for s in alone]]  # in the order given
    assert got.tokens == again.tokens == [list(s.tokens) for s in expected]
    assert 0 < got.decode_seconds < got.whole_seconds
    # The pipeline's own segmentation (VAD chunks, no timestamps): another token list, the same as in-process.
    assert in_batches.tokens == [list(s.tokens) for s in batched] != got.tokens


def test_demo_compares_with_faster_whisper_on_both_engines(capsys):
    """The README's first command: the text, then identity and speed against faster-whisper on
    stock ctranslate2 and on the patched runtime; exit 0 when the tokens are stock's."""
    from ct2_flash.cli import main

    assert main(["demo", os.path.join(DATA, "clip04_slt.ogg"), "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "stock engine on" in out
    assert "vs faster-whisper on stock ctranslate2 4.8.5: tokens identical yes" in out
    assert "vs the same with " in out  # tuned stock: its allocator, and the one its process runs
    assert "vs faster-whisper on the patched runtime: tokens identical" in out


def test_summary_counts_utterances_without_draft_rounds():
    from ct2_flash.benchmark.runner import summarise

    def row(name, proposed, accepted, emitted, calls):
        times = {"decode": 1.0, "whole": 2.0, "encode": 0.5}
        return {
            "name": name,
            "seconds": 3.0,
            "bucket": "[0,5)",
            "reference": "",
            "baseline_text": "a",
            "flash_text": "a",
            "tokens": emitted,
            "identical": True,
            "baseline": dict(times),
            "flash": {**times, "drafter": 0.1, "verify": 0.3, "loop": 0.2, "generate": 0.0},
            "target_calls": calls,
            "emitted": emitted,
            "proposed_by_position": proposed,
            "accepted_by_position": accepted,
            "draft_rounds": proposed[0] if proposed else 0,
            "drafting_stopped": int(bool(proposed)),
            "drafting_resumed": 0,
            "rows_rechecked": 1,
        }

    summary = summarise([row("none", [], [], 3, 3), row("some", [4, 2], [2, 1], 6, 3)])
    assert (summary["draft_rounds"], summary["drafting_stopped"], summary["drafting_resumed"]) == (4, 1, 0)
    assert summary["rows_rechecked"] == 2
    assert summary["acceptance_by_position"] == [0.5, 0.5]
    assert summary["first_position_acceptance"] == 0.5 and summary["acceptance_rate"] == 0.5
    assert summary["tokens_per_target_call"] == 1.5
    assert summarise([row("none", [], [], 3, 3)])["first_position_acceptance"] is None
    # The break-even: 2 x 0.6 s of loop work over 6 target calls, 200 ms a call; the baseline
    # decoded 9 tokens in 2 s, 222 ms a token: a call pays from 0.9 tokens.
    even = summary["break_even"]
    assert even["loop_call_ms"] == pytest.approx(200.0)
    assert even["tokens_per_call"]["baseline"] == pytest.approx(200.0 / (2000.0 / 9))
    assert summarise([row("none", [], [], 3, 0)])["break_even"] is None  # no call in the loop


def test_every_committed_result_names_its_cpu():
    """A figure without its CPU cannot be compared with another session's: every JSON under
    bench/results names the CPU model it ran on (``machine.cpu``), except the archive."""
    import glob

    results = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results")
    unnamed = []
    for path in glob.glob(os.path.join(results, "**", "*.json"), recursive=True):
        if os.path.relpath(path, results).startswith("earlier" + os.sep):
            continue
        with open(path, encoding="utf-8") as stream:
            document = json.load(stream)
        machine = document.get("machine") if isinstance(document, dict) else None
        if not (isinstance(machine, dict) and machine.get("cpu")):
            unnamed.append(os.path.relpath(path, results))
    assert not unnamed, unnamed
