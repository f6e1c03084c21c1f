"""The fuzz targets of fuzz/harness.py, kept alive in CI: their seed corpora replayed,
and a short hypothesis run of each (coverage-guided fuzzing is fuzz/fuzz.py with
atheris; its figures are in docs/adversarial.md). A target fails by raising
AssertionError: a non-Hexcore exception, a disagreement with its model, a broken
invariant."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fuzz.harness import TARGETS, replay

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
EXAMPLES = {"block_manager": 150, "ring_attach": 150, "config": 300, "cli": 150, "launchers": 40, "persistent": 3}
SIZES = {"block_manager": 400, "ring_attach": 120, "config": 64, "cli": 64, "launchers": 96, "persistent": 48}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seed_corpus_replays_clean(target):
    assert replay(target, os.path.join(CORPUS, target)) >= 10


def _hypothesis_run(target):
    @settings(max_examples=EXAMPLES[target], deadline=None, derandomize=False, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.binary(min_size=SIZES[target] // 4, max_size=SIZES[target]))
    def run(data):
        TARGETS[target](data)

    return run


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_short_fuzz_run(target):
    _hypothesis_run(target)()


def test_atheris_runs_a_target_when_installed(tmp_path):
    """The coverage-guided entry point itself (skipped where atheris is not installed, as in CI)."""
    pytest.importorskip("atheris")
    done = subprocess.run([sys.executable, os.path.join(ROOT, "fuzz", "fuzz.py"), "config", "-runs=500",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Done 500 runs" in done.stderr


def test_the_plain_loop_runs_a_target_and_reports_a_failure(monkeypatch):
    """``fuzz/loop.py``: random inputs through a target; 0 when none fails, 1 with the
    failing input when one does (here a target that fails on its second input)."""
    from fuzz import harness, loop

    monkeypatch.setattr(sys, "argv", ["loop.py", "config", "0", "20"])
    assert loop.main() == 0
    calls = []

    def fails_second(data):
        calls.append(data)
        assert len(calls) < 2, "second input"

    monkeypatch.setitem(harness.TARGETS, "config", fails_second)
    monkeypatch.setattr(sys, "argv", ["loop.py", "config", "0", "20"])
    assert loop.main() == 1 and len(calls) == 2

