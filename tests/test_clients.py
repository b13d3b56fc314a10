"""Real faster-whisper clients, as their users run them, under ``ct2-flash run`` (slow tier).

Each client (pinned in packaging/clients.txt; ``bash scripts/install.sh --clients``) runs twice
on committed clips with the embedded tiny.en directory, greedy where the client lets one say so:
plainly, on stock ctranslate2 (the engine faster-whisper users have: the stock worker's
private install put first on the path), and under ``ct2-flash run`` (its defaults: the stock
worker, the loop where it pays). Their outputs must be equal, at float32 and int8; ``--stats``
must show that the models were ct2-flash's.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from ct2_flash.benchmark.clients import (
    BIN,
    command,
    free_port,
    post_transcription,
    server,
    server_config,
    wyoming_program,
    wyoming_transcript,
)

from .conftest import CLIP_PATHS

pytestmark = pytest.mark.slow

CLIPS = [CLIP_PATHS[1], CLIP_PATHS[2], CLIP_PATHS[5]]
COMPUTE_TYPES = ["float32", "int8"]

# Scores of rows the loop decoded come from the patched runtime's float32 kernels, the plain
# run's from stock ctranslate2's: they agree to ~1e-6, not bit for bit (the tokens do).
SCORE_KEYS = ("avg_logprob", "no_speech_prob")


def assert_same_output(flash, plain, where: str = "") -> None:
    """``flash == plain``, JSON values compared whole, except the scores in SCORE_KEYS (to 1e-5)."""
    if isinstance(plain, dict):
        assert isinstance(flash, dict) and flash.keys() == plain.keys(), where
        for key in plain:
            if key in SCORE_KEYS:
                assert flash[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-6), f"{where}.{key}"
            else:
                assert_same_output(flash[key], plain[key], f"{where}.{key}")
    elif isinstance(plain, list):
        assert isinstance(flash, list) and len(flash) == len(plain), where
        for index, (mine, theirs) in enumerate(zip(flash, plain)):
            assert_same_output(mine, theirs, f"{where}[{index}]")
    else:
        assert flash == plain, where


def check_stats(path: str, models: int = 1) -> dict:
    report = json.loads(open(path, encoding="utf-8").read())
    assert len(report["models"]) == models
    assert report["speculative_rows"] + report["generate_rows"] + report["unchanged_calls"] >= 1
    return report


@pytest.mark.parametrize("compute_type", COMPUTE_TYPES)
def test_whisper_ctranslate2_writes_the_same_files(tmp_path, model_path, compute_type):
    pytest.importorskip("whisper_ctranslate2")
    outputs = {}
    for system in ("plain", "flash"):
        out = tmp_path / system
        program = [
            os.path.join(BIN, "whisper-ctranslate2"),
            *CLIPS,
            "--model_directory",
            model_path,
            "--compute_type",
            compute_type,
            "--beam_size",
            "1",
            "--threads",
            "2",
            "--language",
            "en",
            "--output_dir",
            str(out),
            "--output_format",
            "all",
            "--word_timestamps",
            "True",
        ]
        argv, environment = command(system, program, str(tmp_path / "stats.json"))
        done = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        outputs[system] = {name: (out / name).read_text() for name in sorted(os.listdir(out))}
    assert len(outputs["plain"]) == 5 * len(CLIPS)
    assert sorted(outputs["flash"]) == sorted(outputs["plain"])
    for name, text in outputs["plain"].items():
        if name.endswith(".json"):
            assert_same_output(json.loads(outputs["flash"][name]), json.loads(text), name)
        else:
            assert outputs["flash"][name] == text, name
    check_stats(str(tmp_path / "stats.json"))


@pytest.mark.parametrize("compute_type", COMPUTE_TYPES)
def test_wyoming_faster_whisper_sends_the_same_transcripts(tmp_path, model_path, compute_type):
    pytest.importorskip("wyoming_faster_whisper")
    transcripts = {}
    for system in ("plain", "flash"):
        port = free_port()
        program = wyoming_program(port, model_path, str(tmp_path / "data"), compute_type, 2)
        argv, environment = command(system, program, str(tmp_path / "stats.json"))
        with server(argv, environment, port, str(tmp_path / f"{system}.log")):
            transcripts[system] = [wyoming_transcript(port, path) for path in CLIPS]
    assert all(text.strip() for text in transcripts["plain"])
    assert transcripts["flash"] == transcripts["plain"]
    check_stats(str(tmp_path / "stats.json"))  # written at SIGTERM


@pytest.mark.parametrize("compute_type", COMPUTE_TYPES)
def test_faster_whisper_server_answers_the_same_json_under_concurrent_requests(tmp_path, model_path, compute_type):
    pytest.importorskip("faster_whisper_server")
    config = server_config(str(tmp_path / "config.yaml"), model_path, compute_type, threads=2)
    answers = {}
    for system in ("plain", "flash"):
        port = free_port()
        program = [
            os.path.join(BIN, "faster-whisper-server"),
            "--config",
            config,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        argv, environment = command(system, program, str(tmp_path / "stats.json"))
        with server(argv, environment, port, str(tmp_path / f"{system}.log")):
            requests = CLIPS * 2  # each clip twice, all at once
            results: dict = {}

            def ask(index: int, results=results, port=port, requests=requests) -> None:
                results[index] = post_transcription(port, requests[index])

            threads = [threading.Thread(target=ask, args=(index,)) for index in range(len(requests))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=600)
            assert sorted(results) == list(range(len(requests))), open(tmp_path / f"{system}.log").read()
            answers[system] = [results[index] for index in range(len(requests))]
    assert all(answer["text"].strip() for answer in answers["plain"])
    assert_same_output(answers["flash"], answers["plain"])
    check_stats(str(tmp_path / "stats.json"))


def test_a_client_with_beam_search_gets_one_warning_naming_its_option(tmp_path, model_path):
    pytest.importorskip("whisper_ctranslate2")
    program = [
        os.path.join(BIN, "whisper-ctranslate2"),
        *CLIPS[:2],
        "--model_directory",
        model_path,
        "--compute_type",
        "float32",
        "--threads",
        "2",
        "--language",
        "en",
        "--output_dir",
        str(tmp_path),
    ]
    argv, environment = command("flash", program, str(tmp_path / "stats.json"))
    done = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("beam search is not speculative") == 1
    assert "whisper-ctranslate2's option for greedy decoding: --beam_size 1" in done.stderr
    report = check_stats(str(tmp_path / "stats.json"))
    assert report["unchanged_calls"] >= 2 and report["speculative_rows"] == 0
