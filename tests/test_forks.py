"""Forked children that end as a pre-forking server's workers do: through ``sys.exit`` or an
uncaught exception, not ``os._exit`` (engine.forks). Each program runs in a process of its
own, so that a child's exit is a real one and not pytest's."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from .conftest import CLIP_PATHS, THREADS, checkout_environment

# Once ONNX Runtime is imported, a child that exits normally hung in its C++ destructors.
PLAIN_EXIT = textwrap.dedent("""
    import atexit, ctypes, os, sys
    import ct2_flash
    import onnxruntime

    atexit.register(lambda: print("atexit ran", flush=True))
    pid = os.fork()
    if pid == 0:
        print("python line")  # left in Python's buffer: finalisation flushes it
        ctypes.CDLL(None).printf(b"c line\\n")  # C stdio's buffer (stdout is a pipe)
        if sys.argv[1] == "raise":
            raise RuntimeError("uncaught in the child")
        sys.exit(3)
    print("status", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")

# A pre-forking server's pattern: the model built and used in the parent (float32, every call
# in the loop: the drafter's ONNX Runtime sessions are open), children transcribe and exit.
SERVER = textwrap.dedent("""
    import os, sys
    from ct2_flash import FlashWhisperModel

    model = FlashWhisperModel(sys.argv[1], compute_type="float32", cpu_threads={threads}, adaptive=False)
    text = lambda: " ".join(segment.text for segment in model.transcribe(sys.argv[2], beam_size=1)[0])
    expected = text()
    assert model.model.stats.target_calls > 0
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            sys.exit(0 if text() == expected else 2)
        children.append(pid)
    print("statuses", [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children], flush=True)
""")


def _run(program: str, *args: str, within: float) -> subprocess.CompletedProcess:
    """Run ``program``; past ``within`` s its whole process group is killed (hung children
    included) and the test fails."""
    process = subprocess.Popen(
        [sys.executable, "-c", program, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=checkout_environment(),
    )
    try:
        stdout, stderr = process.communicate(timeout=within)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, _ = process.communicate()
        pytest.fail(f"the program did not end within {within} s (a forked child hung at exit): {stdout!r}")
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_a_child_that_exits_normally_ends_with_its_status_and_output_after_onnx_runtime_is_imported():
    result = _run(PLAIN_EXIT, "exit", within=60.0)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The child's: both buffers and the atexit handler it inherited (in an order the buffers
    # decide); then the parent's.
    assert sorted(lines[:3]) == ["atexit ran", "c line", "python line"]
    assert lines[3:] == ["status 3", "atexit ran"]


def test_a_child_that_raises_ends_with_status_1_and_its_traceback():
    result = _run(PLAIN_EXIT, "raise", within=60.0)
    assert result.returncode == 0, result.stderr
    assert "RuntimeError: uncaught in the child" in result.stderr
    assert result.stdout.splitlines()[-2:] == ["status 1", "atexit ran"]
    assert "c line" in result.stdout.splitlines()


def test_children_of_a_server_that_ran_the_loop_transcribe_and_exit(model_path):
    result = _run(SERVER.format(threads=THREADS), model_path, CLIP_PATHS[4], within=180.0)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "statuses [0, 0]"
