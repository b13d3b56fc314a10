"""Speed under real faster-whisper clients: the client's own wall time for the same work, plainly
on stock ctranslate2 (what its users run), the same with the allocator an informed user sets
without code (tcmalloc preloaded where installed: ``stock/allocator.py``), plainly on this
environment's patched runtime, and under ``ct2-flash run`` (its defaults).

- ``whisper-ctranslate2``: the CLI over all files in one process, greedy (``--beam_size 1``),
  txt output; the process's wall time, start-up and model load included (what its user waits).
- ``wyoming-faster-whisper``: the server started once per system; one Wyoming exchange per
  file, one after another (a voice satellite's pace); the time of the exchanges.
- ``faster-whisper-server``: the server started once per system, ``beam_size: 1`` in its
  config; one ``POST /v1/audio/transcriptions`` per file, one after another; their time.

The four systems run in turns, their order rotating each repeat, on the same files; every
system's outputs are compared with the plain stock run's (texts; the server's JSON without
its scores, which agree to ~1e-6 between engines) on the files that the plain runs decoded
alike. ``--stats`` of the ct2-flash runs gives rows in the loop, rows through ``generate()``
and tokens per target call.

Greedy at ``temperature=0`` by default, as the comparison should be: whisper-ctranslate2 with
``--temperature_increment_on_fallback None``, faster-whisper-server with ``temperature=0`` in
each request. wyoming-faster-whisper has no such option, so it always keeps faster-whisper's
fallback list, as do all three with ``--temperature client``: a window that fails the
fallback's thresholds is decoded again by random draws at temperatures 0.2 to 1.0, whose
lengths, and so times, differ between any two runs.

    python bench/clients.py --speech-set mfa --max-files 40 --compute-types int8 float32 \\
        --out bench/results/clients/clients.json

Needs the clients: ``bash scripts/install.sh --clients``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List

from ct2_flash.adapter.audio import SAMPLE_AUDIO
from ct2_flash.benchmark.clients import (
    BIN,
    SYSTEMS,
    command,
    free_port,
    post_transcription,
    server,
    server_config,
    wyoming_program,
    wyoming_transcript,
)
from ct2_flash.benchmark.manifest import read_manifest
from ct2_flash.benchmark.scripts import machine, save_figure, timed, write_result
from ct2_flash.benchmark.speech_sets import fetch
from ct2_flash.engine.models import resolve_model
from ct2_flash.stock.allocator import loaded_allocator, tuned_allocator

CLIENTS = ("whisper-ctranslate2", "wyoming-faster-whisper", "faster-whisper-server")


def run_cli(
    system: str, files: List[str], model: str, compute_type: str, threads: int, work: str, fallback: bool
) -> dict:
    out = os.path.join(work, "out")
    program = [
        os.path.join(BIN, "whisper-ctranslate2"),
        *files,
        "--model_directory",
        model,
        "--compute_type",
        compute_type,
        "--beam_size",
        "1",
        "--threads",
        str(threads),
        "--language",
        "en",
        "--output_dir",
        out,
        "--output_format",
        "txt",
        "--verbose",
        "False",
        *([] if fallback else ["--temperature_increment_on_fallback", "None"]),
    ]
    stats = os.path.join(work, "stats.json")
    argv, environment = command(system, program, stats)
    seconds, _ = timed(
        lambda: subprocess.run(argv, env=environment, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    )
    texts = [
        open(os.path.join(out, os.path.splitext(os.path.basename(f))[0] + ".txt"), encoding="utf-8").read()
        for f in files
    ]
    return {"seconds": seconds, "outputs": texts, "stats": _stats(stats)}


def run_server(
    client: str, system: str, files: List[str], model: str, compute_type: str, threads: int, work: str, fallback: bool
) -> dict:
    port = free_port()
    if client == "wyoming-faster-whisper":
        program = wyoming_program(port, model, os.path.join(work, "data"), compute_type, threads)
        ask: Callable[[str], object] = functools.partial(wyoming_transcript, port)
    else:
        config = server_config(os.path.join(work, "config.yaml"), model, compute_type, threads)
        program = [os.path.join(BIN, client), "--config", config, "--host", "127.0.0.1", "--port", str(port)]
        ask = functools.partial(_posted_without_scores, port, {} if fallback else {"temperature": "0"})
    stats = os.path.join(work, "stats.json")
    argv, environment = command(system, program, stats)
    with server(argv, environment, port, os.path.join(work, "server.log")) as process:
        # The server's first request loads what it loads lazily: not the work timed. Other audio
        # than the timed files', so that ct2-flash's re-decode memory finds none of them.
        ask(SAMPLE_AUDIO)
        allocator = loaded_allocator(process.pid)
        seconds, outputs = timed(lambda: [ask(path) for path in files])
    return {"seconds": seconds, "outputs": outputs, "stats": _stats(stats), "allocator_loaded": allocator}


def _posted_without_scores(port: int, fields: Dict[str, str], path: str) -> dict:
    return _without_scores(post_transcription(port, path, fields=fields))


def _without_scores(answer: dict) -> dict:
    for segment in answer.get("segments", []):
        segment.pop("avg_logprob", None)
        segment.pop("no_speech_prob", None)
    return answer


def _stats(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as stream:
        report = json.load(stream)
    os.remove(path)
    return {
        key: report[key] for key in ("speculative_rows", "generate_rows", "unchanged_calls", "tokens_per_target_call")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speech-set", default="mfa")
    parser.add_argument("--max-files", type=int, default=40)
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--compute-types", nargs="+", default=["int8", "float32"])
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--temperature",
        default="0",
        choices=["0", "client"],
        help="0: greedy without the fallback where the client allows it (wyoming does not); "
        "client: each client's own fallback list",
    )
    parser.add_argument("--out", default="bench/results/clients/clients.json")
    args = parser.parse_args()
    files = [u.path for u in read_manifest(fetch(args.speech_set))][: args.max_files]
    model = resolve_model(args.model)
    fallback = args.temperature == "client"
    results: Dict[str, dict] = {}
    for compute_type in args.compute_types:
        for client in args.clients:
            runs: Dict[str, List[dict]] = {system: [] for system in SYSTEMS}
            for repeat in range(args.repeats):
                for system in SYSTEMS[repeat % len(SYSTEMS) :] + SYSTEMS[: repeat % len(SYSTEMS)]:
                    with tempfile.TemporaryDirectory(prefix="ct2_flash_client_") as work:
                        if client == "whisper-ctranslate2":
                            run = run_cli(system, files, model, compute_type, args.threads, work, fallback)
                        else:
                            run = run_server(client, system, files, model, compute_type, args.threads, work, fallback)
                    runs[system].append(run)
                    print(f"{compute_type} {client} {system}: {run['seconds']:.1f} s", file=sys.stderr)
            plain = runs["plain"][0]["outputs"]
            # Where a client keeps faster-whisper's temperature fallback, a window that fails its
            # thresholds is sampled, and differs between any two runs. Outputs are compared on
            # the files every plain run decoded alike.
            stable = [i for i in range(len(files)) if all(run["outputs"][i] == plain[i] for run in runs["plain"])]
            seconds = {system: min(run["seconds"] for run in runs[system]) for system in SYSTEMS}
            results.setdefault(compute_type, {})[client] = {
                "seconds_min_over_repeats": seconds,
                "seconds_all": {system: [run["seconds"] for run in runs[system]] for system in SYSTEMS},
                "speedup_vs_stock": seconds["plain"] / seconds["flash"],
                "speedup_vs_tuned_stock": seconds["tuned"] / seconds["flash"],
                "speedup_vs_same_engine": seconds["same"] / seconds["flash"],
                # The servers' processes, read from /proc/PID/maps (the CLI's exits before).
                "allocator_loaded": {system: runs[system][-1].get("allocator_loaded") for system in SYSTEMS},
                "files_decoded_alike_by_plain_runs": len(stable),
                "same_output_as_stock_on_those": {
                    system: sum(all(run["outputs"][i] == plain[i] for run in runs[system]) for i in stable)
                    for system in SYSTEMS
                },
                "flash_stats": runs["flash"][-1]["stats"],
            }
    document = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "speech_set": args.speech_set,
        "tuned_allocator": tuned_allocator().describe(),
        "files": len(files),
        "model": args.model,
        "threads": args.threads,
        "repeats": args.repeats,
        "temperature": args.temperature,
        "results": results,
    }
    write_result(args.out, document)
    plot(document, os.path.splitext(args.out)[0] + ".png")


def plot(document: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = document["results"]
    figure, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.6), squeeze=False)
    for axis, (compute_type, clients) in zip(axes[0], results.items()):
        names = list(clients)
        bars = (
            ("speedup_vs_stock", "vs stock"),
            ("speedup_vs_tuned_stock", "vs tuned stock"),
            ("speedup_vs_same_engine", "vs same engine"),
        )
        for offset, (key, label) in enumerate(bars):
            axis.bar(
                [i + 0.27 * offset for i in range(len(names))],
                [clients[n].get(key, 0.0) for n in names],
                width=0.27,
                label=label,
            )
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks([i + 0.27 for i in range(len(names))], names, rotation=12, fontsize=8)
        axis.set_title(f"{compute_type}: client wall time, plain / ct2-flash run")
        axis.legend(fontsize=8)
    figure.suptitle(
        f"{document['files']} {document['speech_set']} files, {document['model']}, {document['machine']['cpu']}",
        fontsize=9,
    )
    save_figure(figure, path)


if __name__ == "__main__":
    main()
