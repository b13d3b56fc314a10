"""Under CI a missing test dependency fails the run, also where a module skips at collection
(a module-level ``pytest.importorskip``): checked by hiding torch from a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def _pytest_without_torch(tmp_path, ci: bool) -> subprocess.CompletedProcess:
    hidden = tmp_path / "torch"
    hidden.mkdir()
    (hidden / "__init__.py").write_text('raise ModuleNotFoundError("No module named torch (hidden)", name="torch")\n')
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + env.get("PYTHONPATH", "").split(os.pathsep))
    if ci:
        env["CI"] = "true"
    # --collect-only: the module skips (or fails) while it is collected, before any test runs.
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--collect-only",
            "-rs",
            os.path.join(TESTS, "test_training.py"),
        ],
        cwd=os.path.dirname(TESTS),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_module_skipped_for_torch_fails_under_ci(tmp_path):
    run = _pytest_without_torch(tmp_path, ci=True)
    assert run.returncode != 0, run.stdout
    assert "skipped at collection in CI" in run.stdout and "No module named torch" in run.stdout


def test_the_same_module_only_skips_outside_ci(tmp_path):
    run = _pytest_without_torch(tmp_path, ci=False)
    assert run.returncode == 5, run.stdout + run.stderr  # pytest's "no tests collected", nothing failed
    assert "could not import 'torch'" in run.stdout
