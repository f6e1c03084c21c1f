"""tests/conftest.py's outcome log (HEXCORE_TEST_LOG), which scripts/gpu-check reads when a run is cut short."""

from types import SimpleNamespace

from tests import conftest


def report(when: str, outcome: str) -> SimpleNamespace:
    return SimpleNamespace(when=when, outcome=outcome, failed=outcome == "failed", skipped=outcome == "skipped",
                           nodeid=f"t.py::{when}-{outcome}")


def test_each_outcome_is_written_as_it_comes_by_the_controller_only(tmp_path, monkeypatch):
    log = tmp_path / "outcomes.txt"
    monkeypatch.setenv("HEXCORE_TEST_LOG", str(log))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    for when, outcome in (("setup", "passed"), ("call", "passed"), ("call", "failed"), ("setup", "failed"),
                          ("setup", "skipped"), ("teardown", "passed"), ("teardown", "failed")):
        conftest.pytest_runtest_logreport(report(when, outcome))
    assert log.read_text().splitlines() == ["passed t.py::call-passed", "failed t.py::call-failed",
                                            "error t.py::setup-failed", "skipped t.py::setup-skipped",
                                            "error t.py::teardown-failed"]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")  # a worker: its controller writes
    conftest.pytest_runtest_logreport(report("call", "failed"))
    monkeypatch.delenv("HEXCORE_TEST_LOG")
    conftest.pytest_runtest_logreport(report("call", "failed"))
    assert len(log.read_text().splitlines()) == 5
