"""ct2-flash in place of faster_whisper.WhisperModel: install()/uninstall(), ``ct2-flash run``
and the CT2_FLASH=1 hook, on small programs written here (the real clients: test_clients.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import types

import faster_whisper
import faster_whisper.transcribe
import pytest

import ct2_flash
from ct2_flash.dropin import swap as dropin
from ct2_flash.dropin.run import ProgramError, find_program
from ct2_flash.dropin.swap import DropInWhisperModel, resolve_like_faster_whisper
from ct2_flash.engine.models import UnknownModelError

from .conftest import CLIP_PATHS, THREADS, segments_of

# faster-whisper's class is looked up where it is used: install() redirects module globals
# that hold it, this module's included.
ORIGINALS = dropin.ORIGINALS
CT2_FLASH = os.path.join(os.path.dirname(sys.executable), "ct2-flash")


@pytest.fixture
def installed():
    """install() for one test, always undone."""
    yield dropin.install
    dropin.uninstall()


def test_install_redirects_every_lookup_and_uninstall_restores_them(installed):
    early = types.ModuleType("client_imported_early")
    early.WhisperModel = faster_whisper.WhisperModel  # 'from faster_whisper import WhisperModel' before install()
    early.other = 3
    original = ORIGINALS["WhisperModel"]
    sys.modules[early.__name__] = early
    try:
        installed(stock_engine=False)
        installed(stock_engine=False)  # idempotent
        assert dropin.installed()
        assert faster_whisper.WhisperModel is DropInWhisperModel
        assert faster_whisper.transcribe.WhisperModel is DropInWhisperModel
        assert early.WhisperModel is DropInWhisperModel and early.other == 3
        assert faster_whisper.BatchedInferencePipeline is ct2_flash.BatchedInferencePipeline
        # ct2-flash's own modules keep faster-whisper's class: they build on it.
        assert ct2_flash.adapter.whisper_model.WhisperModel is original
        dropin.uninstall()
        assert not dropin.installed()
        assert faster_whisper.WhisperModel is original and faster_whisper.transcribe.WhisperModel is original
        assert early.WhisperModel is original
        assert faster_whisper.BatchedInferencePipeline is dropin.ORIGINALS["BatchedInferencePipeline"]
        dropin.uninstall()  # a second uninstall does nothing
    finally:
        del sys.modules[early.__name__]


def test_a_class_derived_before_install_is_named_in_a_warning(installed, caplog):
    class ClientModel(ORIGINALS["WhisperModel"]):
        pass

    with caplog.at_level(logging.WARNING, logger="ct2_flash"):
        installed()
    assert "ClientModel" in caplog.text and "before ct2-flash was installed" in caplog.text
    del ClientModel


def test_bad_install_options_are_refused_before_anything_changes():
    with pytest.raises(ValueError, match="num_draft_tokens"):
        dropin.install(num_draft_tokens=0)
    with pytest.raises(FileNotFoundError, match="drafter directory"):
        dropin.install(drafter="/nonexistent/drafter")
    with pytest.raises(TypeError, match="no option"):
        dropin.install(beam_size=1)
    assert not dropin.installed() and faster_whisper.WhisperModel is ORIGINALS["WhisperModel"]


def test_drop_in_decodes_as_faster_whisper_and_counts(installed, float32_pair, clips, caplog):
    installed(stock_engine=False, program="whisper-ctranslate2")
    model = faster_whisper.WhisperModel("tiny.en", "cpu", compute_type="float32", cpu_threads=THREADS)
    assert isinstance(model, ct2_flash.FlashWhisperModel) and isinstance(model, ORIGINALS["WhisperModel"])
    name = os.path.basename(CLIP_PATHS[0])
    assert segments_of(model, clips[name], beam_size=1) == float32_pair.reference(name, clips[name], beam_size=1)
    with caplog.at_level(logging.WARNING, logger="ct2_flash"):
        assert segments_of(model, clips[name], beam_size=5) == float32_pair.reference(name, clips[name], beam_size=5)
    assert "whisper-ctranslate2's option for greedy decoding: --beam_size 1" in caplog.text
    report = dropin.stats()
    (row,) = report["models"]
    assert row["model"] == "tiny.en" and row["compute_type"] == "float32"
    assert report["speculative_rows"] + report["generate_rows"] >= 1
    assert report["unchanged_calls"] >= 1
    json.dumps(report)


def test_signatures_are_faster_whispers(installed):
    """Clients that build their options from a signature see faster-whisper's: ``transcribe``,
    ``detect_language`` and the pipeline's ``transcribe`` as they are there, the constructors
    with faster-whisper's parameters first and ct2-flash's options keyword-only; and the
    constructor's signature binds what faster-whisper's does."""
    import inspect

    installed()
    original, pipeline = ORIGINALS["WhisperModel"], ORIGINALS["BatchedInferencePipeline"]
    for ours, theirs in [
        (faster_whisper.WhisperModel.transcribe, original.transcribe),
        (faster_whisper.WhisperModel.detect_language, original.detect_language),
        (faster_whisper.BatchedInferencePipeline.transcribe, pipeline.transcribe),
        (ct2_flash.FlashWhisperModel.transcribe, original.transcribe),
    ]:
        assert inspect.signature(ours) == inspect.signature(theirs), ours.__qualname__
    theirs = inspect.signature(original.__init__).parameters
    for cls in (faster_whisper.WhisperModel, ct2_flash.FlashWhisperModel):
        ours = inspect.signature(cls.__init__).parameters
        assert list(ours)[: len(theirs) - 1] == list(theirs)[:-1] and list(ours)[-1] == list(theirs)[-1]
        options = [p for p in ours.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
        assert {"drafter", "num_draft_tokens", "stock_engine"} <= {p.name for p in options}
    assert (
        inspect.signature(faster_whisper.WhisperModel.__init__).parameters["model_size_or_path"].default
        is inspect.Parameter.empty
    )
    inspect.signature(faster_whisper.WhisperModel).bind("tiny.en", "cpu", 0, "int8", cpu_threads=2, drafter=None)


def test_models_resolve_as_faster_whisper_resolves_them(model_path):
    assert resolve_like_faster_whisper(model_path) == model_path
    assert resolve_like_faster_whisper("tiny.en") == "tiny.en"  # the embedded copy, no network
    with pytest.raises(UnknownModelError, match="'no-such-model'.*available offline"):
        resolve_like_faster_whisper("no-such-model", local_files_only=True)


def test_a_model_that_cannot_load_raises_faster_whispers_error_and_logs_what_to_do(installed, tmp_path, caplog):
    installed(program="some-client")
    with caplog.at_level(logging.ERROR, logger="ct2_flash"), pytest.raises(RuntimeError, match="model.bin"):
        faster_whisper.WhisperModel(str(tmp_path), compute_type="float32")
    assert "some-client could not build WhisperModel" in caplog.text and "without ct2-flash" in caplog.text


def test_a_model_in_memory_is_refused_with_what_to_do(installed):
    installed()
    with pytest.raises(ValueError, match="files=.*directory"):
        DropInWhisperModel("tiny.en", files={"model.bin": b""})


@pytest.mark.parametrize(
    "command, message",
    [
        ([], "no program given"),
        (["-m"], "-m needs a module"),
        (["surely-not-a-command-here"], "not found"),
        (["/bin/sh"], "not a Python program"),
    ],
)
def test_programs_that_cannot_run_are_refused(command, message):
    with pytest.raises(ProgramError, match=message):
        find_program(command)


def test_a_console_script_of_another_environment_is_refused(tmp_path):
    script = tmp_path / "client"
    script.write_text("#!/opt/other-env/bin/python3\nprint('hi')\n")
    with pytest.raises(ProgramError, match="another|not to ct2-flash's"):
        find_program([str(script)])
    here = tmp_path / "client_here"
    here.write_text(f"#!{sys.executable}\nprint('hi')\n")
    assert find_program(["--", str(here), "a"]).argv == [str(here), "a"]


PROGRAM = """\
import sys
import faster_whisper
from faster_whisper import WhisperModel
print(WhisperModel.__module__, faster_whisper.WhisperModel is WhisperModel, "torch" in sys.modules, sys.argv[1:])
print(sys.stdin.read().upper(), end="")
if sys.argv[1] == "fail":
    raise RuntimeError("the program's own error")
if sys.argv[1] == "decode":
    model = WhisperModel("tiny.en", compute_type="float32", cpu_threads=2, stock_engine=False)
    print(" ".join(s.text.strip() for s in model.transcribe(sys.argv[2], beam_size=1)[0]))
sys.exit(int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0)
"""


def _run(args, **kwargs):
    return subprocess.run([CT2_FLASH, "run", *args], capture_output=True, text=True, timeout=300, **kwargs)


def test_run_passes_arguments_streams_and_exit_code(tmp_path):
    program = tmp_path / "client.py"
    program.write_text(PROGRAM)
    done = _run(["--", str(program), "plain", "7"], input="from stdin\n")
    assert done.returncode == 7, done.stderr
    assert done.stdout == "ct2_flash.dropin.swap True False ['plain', '7']\nFROM STDIN\n"  # False: no PyTorch import
    failed = _run(["--", str(program), "fail"], input="")
    assert failed.returncode == 1
    assert "RuntimeError: the program's own error" in failed.stderr and "runpy" not in failed.stderr
    missing = _run(["--", "surely-not-a-command-here"])
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_run_as_module_writes_stats(tmp_path):
    (tmp_path / "client_module.py").write_text(PROGRAM)
    stats = tmp_path / "stats.json"
    done = _run(["--stats", str(stats), "--", "-m", "client_module", "decode", CLIP_PATHS[0]], input="", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ct2_flash.dropin.swap True False ['decode'")
    report = json.loads(stats.read_text())
    assert report["program"] == "client_module" and len(report["models"]) == 1
    assert report["speculative_rows"] + report["generate_rows"] == 1


def test_the_environment_hook_redirects_only_with_the_variable(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    subprocess.run([CT2_FLASH, "hook", "install", "--site-packages", str(site)], check=True, capture_output=True)
    code = (
        f"import site; site.addsitedir({str(site)!r}); import sys\n"
        "import faster_whisper; print(faster_whisper.WhisperModel.__module__, 'torch' in sys.modules)\n"
    )
    for value, expected in (
        ("1", "ct2_flash.dropin.swap"),
        ("0", "faster_whisper.transcribe"),
        (None, "faster_whisper.transcribe"),
    ):
        env = {k: v for k, v in os.environ.items() if k != "CT2_FLASH"}
        if value is not None:
            env["CT2_FLASH"] = value
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        module, torch_imported = done.stdout.split()
        assert module == expected, (value, done.stderr)
        if value == "1":  # the runtime was imported as ct2_flash imports it: without PyTorch
            assert torch_imported == "False"
    # ct2_flash imported first (it imports faster_whisper while it loads): installed once it is done.
    env = dict(os.environ, CT2_FLASH="1")
    first = code.replace("import faster_whisper;", "import ct2_flash, faster_whisper;")
    done = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["ct2_flash.dropin.swap", "False"], done.stderr
    subprocess.run([CT2_FLASH, "hook", "remove", "--site-packages", str(site)], check=True, capture_output=True)
    assert not list(site.iterdir())
