"""``python -m ct2_flash.train STEP``: the resumable steps of drafter training."""

from __future__ import annotations

import argparse
import logging
import os

from ct2_flash.drafting.audio_window import AUDIO_WINDOW


def default_data_dir() -> str:
    return os.environ.get(
        "CT2_FLASH_DATA", os.path.join(os.path.expanduser("~"), ".cache", "ct2_flash", "drafter_data")
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ct2_flash.train", description=__doc__)
    parser.add_argument("--data", default=default_data_dir(), help="data directory (default: %(default)s)")
    steps = parser.add_subparsers(dest="step", required=True)
    synth = steps.add_parser("synth", help="synthesize speech (resumable)")
    synth.add_argument("--hours", type=float, default=10.0)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--workers", type=int, default=2)
    synth.set_defaults(handler=_synth)
    extract = steps.add_parser("extract", help="teacher tokens, states and encoder outputs (resumable)")
    extract.add_argument("--model", default="tiny.en")
    extract.add_argument("--threads", type=int, default=2)
    extract.add_argument("--batch-size", type=int, default=8, help="utterances per encoder and greedy call")
    extract.set_defaults(handler=_extract)
    _add_fit_parser(steps)
    export = steps.add_parser("export-validation", help="held-out validation audio as a bench manifest")
    export.add_argument("--out", required=True)
    export.add_argument("--skip", type=int, default=48, help="validation utterances used for checkpoint selection")
    export.add_argument("--count", type=int, default=40)
    export.set_defaults(handler=_export_validation)
    ship = steps.add_parser(
        "ship", help="convert a run's best checkpoint (float16 + ONNX graphs) into the package, with its report"
    )
    ship.add_argument("--run", default=None, help="run directory (default: DATA/runs/main)")
    ship.add_argument("--model", default="tiny.en")
    ship.set_defaults(handler=_ship)
    snap = steps.add_parser(
        "snapshot", help="a run's latest saved weights as a converted drafter (for measurements between validations)"
    )
    snap.add_argument("--run", default=None, help="run directory (default: DATA/runs/main)")
    snap.add_argument("--out", required=True, help="where to write the drafter")
    snap.add_argument("--model", default="tiny.en")
    snap.set_defaults(handler=_snapshot)
    report = steps.add_parser("report", help="training report and curves for a run")
    report.add_argument("--run", default=None, help="run directory (default: DATA/runs/main)")
    report.add_argument("--out", required=True, help="where to write the report")
    report.set_defaults(handler=_report)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    args.handler(args)


def _add_fit_parser(steps) -> None:
    fit = steps.add_parser("fit", help="train the drafter (resumable)")
    fit.add_argument("--out", default=None, help="run directory (default: DATA/runs/main)")
    fit.add_argument("--steps", type=int, default=3000)
    fit.add_argument("--batch-size", type=int, default=8)
    fit.add_argument("--validate-every", type=int, default=250)
    fit.add_argument("--shortlist", type=int, default=8192)
    fit.add_argument("--validation-windows", type=int, default=48)
    fit.add_argument("--threads", type=int, default=2)
    fit.add_argument("--lr", type=float, default=3e-4, help="peak learning rate")
    fit.add_argument(
        "--kl-weight",
        type=float,
        default=0.5,
        help="weight of distilling the target's top-16 distribution (0: greedy tokens only)",
    )
    fit.add_argument(
        "--anchor-weight",
        type=float,
        default=0.1,
        help="weight of the AnchorDraft loss on where the drafter reads the audio (0: none)",
    )
    fit.add_argument(
        "--audio-window",
        type=int,
        nargs=2,
        default=list(AUDIO_WINDOW),
        metavar=("BEFORE", "AFTER"),
        help="encoder frames each block reads around the target's position, as the runtime "
        "drafter does (default: %(default)s)",
    )
    fit.add_argument("--all-audio", action="store_true", help="every block reads all of the audio (no window)")
    fit.add_argument("--init", default=None, help="start from this drafter checkpoint (keeps its shortlist)")
    fit.add_argument(
        "--grow", action="store_true", help="on resume, also train on utterances extracted since the run started"
    )
    fit.add_argument(
        "--real-speech",
        nargs="+",
        default=[],
        metavar="SET",
        help="also validate on real recordings and choose the best checkpoint by them: speech set "
        "names of `ct2-flash bench` (mfa, pocketsphinx; fetched once) or audio<TAB>text manifests",
    )
    fit.add_argument("--no-audio", action="store_true", help="ablation: no cross-attention to the audio")
    fit.add_argument("--no-history", action="store_true", help="ablation: no target decoder states")
    fit.set_defaults(handler=_fit)


def _run_dir(args: argparse.Namespace) -> str:
    return args.run or os.path.join(args.data, "runs", "main")


def _synth(args: argparse.Namespace) -> None:
    from ct2_flash.train.step_lock import step_lock
    from ct2_flash.train.synth import synthesize

    with step_lock(args.data, "synth"):
        entries = synthesize(args.data, args.hours, seed=args.seed, workers=args.workers)
    hours = sum(e["seconds"] for e in entries) / 3600
    logging.info("%d utterances, %.2f h in %s", len(entries), hours, args.data)


def _extract(args: argparse.Namespace) -> None:
    from ct2_flash.train.extract import extract
    from ct2_flash.train.step_lock import step_lock

    with step_lock(args.data, "extract"):
        count = extract(args.data, model_name=args.model, threads=args.threads, batch_size=args.batch_size)
    logging.info("extracted %d utterances into %s", count, args.data)


def _fit(args: argparse.Namespace) -> None:
    from ct2_flash.benchmark.speech_sets import SETS, fetch
    from ct2_flash.train.fit import FitConfig, fit
    from ct2_flash.train.step_lock import step_lock

    config = FitConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        validate_every=args.validate_every,
        learning_rate=args.lr,
        warmup_steps=min(150, args.steps // 10),
        validation_windows=args.validation_windows,
        kl_weight=args.kl_weight,
        anchor_weight=args.anchor_weight,
        audio_window=None if args.all_audio else tuple(args.audio_window),
    )
    out = args.out or os.path.join(args.data, "runs", "main")
    real_speech = [fetch(name) if name in SETS else name for name in args.real_speech]
    with step_lock(out, "fit"):
        meta = fit(
            args.data,
            out,
            config,
            shortlist_size=args.shortlist,
            threads=args.threads,
            use_audio=not args.no_audio,
            use_history=not args.no_history,
            init_from=args.init,
            grow=args.grow,
            real_speech=real_speech,
        )
    logging.info("step %d, best mean accepted length %.3f, run in %s", meta["step"], meta["best"], out)


def _export_validation(args: argparse.Namespace) -> None:
    from ct2_flash.train.export import export_validation

    logging.info("wrote %s", export_validation(args.data, args.out, args.skip, args.count))


def _ship(args: argparse.Namespace) -> None:
    from ct2_flash.converters import convert_drafter
    from ct2_flash.drafting.files import SHIPPED_DRAFTERS
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.train.report import write_report

    run = _run_dir(args)
    destination = os.path.join(SHIPPED_DRAFTERS, args.model)
    # float16 weights, the exported graphs and their check against PyTorch (ct2_flash/converters/).
    convert_drafter(os.path.join(run, "best"), destination, resolve_model(args.model), force=True)
    write_report(args.data, run, destination)
    logging.info("shipped %s as the default drafter of %s (%s)", run, args.model, destination)


def _snapshot(args: argparse.Namespace) -> None:
    from ct2_flash.converters import convert_drafter
    from ct2_flash.engine.models import resolve_model
    from ct2_flash.train.fit import snapshot

    run = _run_dir(args)
    snapshot(run, args.out, args.model)
    convert_drafter(args.out, args.out, resolve_model(args.model), force=True)
    logging.info("wrote %s from %s", args.out, run)


def _report(args: argparse.Namespace) -> None:
    from ct2_flash.train.report import write_report

    logging.info("wrote %s", write_report(args.data, _run_dir(args), args.out))


if __name__ == "__main__":
    main()
