"""ct2_flash/stock/allocator.py: the allocator a user sets without code, as the tuned stock
system and the stock engine's worker run it, checked in the processes' memory maps."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ct2_flash.stock.allocator import (
    GLIBC_DEFAULT,
    GLIBC_SETTINGS,
    Allocator,
    find_tcmalloc,
    loaded_allocator,
    preload_for_command,
    tuned_allocator,
)

# .ci/run installs Debian's libgoogle-perftools4; elsewhere these tests skip (and fail in CI).
needs_tcmalloc = pytest.mark.skipif(
    find_tcmalloc() is None, reason="tcmalloc is not installed (apt-get install libgoogle-perftools4)"
)

# A child that says it is up (its libraries loaded), then lives until its stdin closes.
_WAIT = "import sys; print('up', flush=True); sys.stdin.read()"


def _maps_of_child(environment: dict) -> str:
    child = subprocess.Popen(
        [sys.executable, "-c", _WAIT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=environment,
    )
    try:
        assert child.stdout.readline() == b"up\n"
        return loaded_allocator(child.pid)
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_a_preload_goes_before_the_ones_already_set():
    setting = Allocator("tcmalloc", "/lib/a.so", {"LD_PRELOAD": "/lib/a.so"})
    assert setting.environment({"LD_PRELOAD": "/lib/b.so", "X": "1"}) == {"LD_PRELOAD": "/lib/a.so:/lib/b.so", "X": "1"}
    assert setting.environment({}) == {"LD_PRELOAD": "/lib/a.so"}
    assert GLIBC_DEFAULT.environment({"X": "1"}) == {"X": "1"}


def test_without_tcmalloc_the_tuned_setting_is_glibcs_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("CT2_FLASH_TCMALLOC", str(tmp_path / "missing.so"))
    setting = tuned_allocator()
    assert (setting.name, setting.library) == ("glibc settings", None)
    assert dict(setting.variables) == GLIBC_SETTINGS and "LD_PRELOAD" not in setting.variables


def test_a_process_without_a_preload_runs_glibc():
    assert _maps_of_child(dict(os.environ, LD_PRELOAD="")) == "glibc"
    assert loaded_allocator(2**22 + 12345) == "unknown"  # no such process


@needs_tcmalloc
def test_the_tuned_setting_loads_tcmalloc_in_the_child():
    setting = tuned_allocator()
    assert setting.name == "tcmalloc" and os.path.isfile(setting.library)
    assert _maps_of_child(setting.environment(os.environ)) == "tcmalloc"


def test_a_preload_the_loader_refuses_leaves_glibc_and_the_child_runs(tmp_path):
    """A file that is no library: the loader says so on stderr and runs the program anyway,
    and the maps tell what it runs."""
    broken = tmp_path / "libtcmalloc_minimal.so.4"
    broken.write_bytes(b"not an ELF file")
    setting = Allocator("tcmalloc", str(broken), {"LD_PRELOAD": str(broken)})
    assert _maps_of_child(setting.environment(os.environ)) == "glibc"


def test_the_client_harness_runs_tuned_stock_on_stock_with_the_tuned_allocator():
    """``benchmark.clients.command``: the ``tuned`` system is ``plain`` (stock ctranslate2
    first on the path) with the tuned allocator's variables; the others have none of them."""
    from ct2_flash.benchmark.clients import command

    _, plain = command("plain", ["client"])
    _, tuned = command("tuned", ["client"])
    assert tuned == tuned_allocator().environment(plain)
    for system in ("plain", "same", "flash"):
        _, environment = command(system, ["client"])
        assert all(environment.get(key) == os.environ.get(key) for key in tuned_allocator().variables)


# A command that runs preload_for_command first, then says what it runs and what its children get.
_COMMAND = (
    "import os; from ct2_flash.stock.allocator import loaded_allocator, preload_for_command; "
    "preload_for_command(); print(loaded_allocator(os.getpid()), repr(os.environ.get('LD_PRELOAD')), "
    "'CT2_FLASH_PRELOADED_FROM' in os.environ)"
)


def _command(**variables) -> str:
    environment = {key: value for key, value in os.environ.items() if key not in ("LD_PRELOAD", "CT2_FLASH_ALLOCATOR")}
    run = subprocess.run(
        [sys.executable, "-c", _COMMAND], env={**environment, **variables}, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@needs_tcmalloc
def test_a_transcribing_command_runs_again_under_tcmalloc_and_its_children_do_not_inherit_it():
    assert _command() == "tcmalloc None False"
    assert _command(LD_PRELOAD="") == "tcmalloc None False"  # an empty preload is none


def test_a_command_told_glibc_or_without_tcmalloc_runs_as_it_is(tmp_path):
    assert _command(CT2_FLASH_ALLOCATOR="glibc") == "glibc None False"
    assert _command(CT2_FLASH_TCMALLOC=str(tmp_path / "missing.so")) == "glibc None False"


def test_a_command_run_again_puts_its_former_preload_back(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/lib/tcmalloc.so:/lib/b.so")
    monkeypatch.setenv("CT2_FLASH_PRELOADED_FROM", "/lib/b.so")
    preload_for_command()
    assert os.environ["LD_PRELOAD"] == "/lib/b.so" and "CT2_FLASH_PRELOADED_FROM" not in os.environ


def test_an_unknown_allocator_choice_is_refused(monkeypatch):
    monkeypatch.delenv("CT2_FLASH_PRELOADED_FROM", raising=False)
    monkeypatch.setenv("CT2_FLASH_ALLOCATOR", "jemalloc")
    with pytest.raises(ValueError, match="CT2_FLASH_ALLOCATOR"):
        preload_for_command()
