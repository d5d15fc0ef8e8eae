"""Where the suite's time goes: the CPU seconds it used (every process it started included) against its wall time
on the cores it had, the tests that used the most CPU, and those that spent the longest waiting rather than computing.

Most of the suite's work runs outside the pytest process: in the runs, ranks and launchers it starts, which the
preloaded Python forks (tests/preloaded_python.py) and waits for, so their CPU time is that server's children's.
Each test's CPU time is therefore what its worker used (itself and the processes it waited for) plus what its
server's children used, from the test's setup to its teardown; its wait is its wall time less that. A test that
waits long without computing sleeps, polls or waits out a timeout. Both lists are printed at the end of every `make
test`, so a change that adds work or a wait shows: on CI's two cores the suite's wall time is about its CPU time
halved. Nothing here is a verdict: it measures and prints.
"""

import os
import time
from pathlib import Path

import pytest

from tests import preloaded_python

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
SHOWN = 20
FILES_SHOWN = 15


def cpu_seconds() -> float:
    """CPU seconds used so far by this process, the children it has waited for, and its preloaded Python's."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    server = preloaded_python.PreloadedPython._instance
    if server is not None and server.server.poll() is None:
        try:
            fields = Path(f"/proc/{server.server.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return total
        total += sum(int(value) for value in fields[11:15]) / CLOCK_TICKS  # utime, stime, cutime, cstime
    return total


class SuiteClock:
    """Per test (measured where it runs, reported with its teardown) and per session (summed over the workers)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.tests: list[tuple[str, float, float]] = []  # (test id, wall seconds, CPU seconds)
        self.worker_cpu: list[float] = []
        self.open: dict[str, tuple[float, float]] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.open[item.nodeid] = (time.monotonic(), cpu_seconds())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if call.when == "teardown" and item.nodeid in self.open:
            wall_start, cpu_start = self.open.pop(item.nodeid)
            report.user_properties.append(("clock", (time.monotonic() - wall_start, cpu_seconds() - cpu_start)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == "clock":
                self.tests.append((report.nodeid, *value))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:  # an xdist worker: its total goes to the controller
            workeroutput["cpu_seconds"] = cpu_seconds()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        self.worker_cpu.append(node.workeroutput.get("cpu_seconds", 0.0) if hasattr(node, "workeroutput") else 0.0)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.tests:
            return
        wall = time.monotonic() - self.started
        cores = len(os.sched_getaffinity(0))
        own = os.times()
        # With xdist, the workers' totals (their servers' children included) and this process's own: its children
        # are the workers, whose time their totals hold already.
        cpu = sum(self.worker_cpu) + own.user + own.system if self.worker_cpu else cpu_seconds()
        write = terminalreporter.write_line
        terminalreporter.section("where the suite's time went")
        write(
            f"wall {wall:.0f} s on {cores} core(s) = {wall * cores:.0f} core-seconds; CPU used {cpu:.0f} s "
            f"({100 * cpu / (wall * cores):.0f} %), the processes the tests started included"
        )
        write(f"the {SHOWN} tests that used the most CPU (the processes they started included):")
        write(f"{'CPU':>8}{'wall':>8}  test")
        for nodeid, test_wall, test_cpu in sorted(self.tests, key=lambda test: test[2], reverse=True)[:SHOWN]:
            write(f"{test_cpu:>7.1f}s{test_wall:>7.1f}s  {nodeid}")
        write(f"the {FILES_SHOWN} test files that used the most CPU (a file's many small tests add up too):")
        write(f"{'CPU':>8}{'tests':>7}  file")
        for path, (file_cpu, count) in cpu_by_file(self.tests)[:FILES_SHOWN]:
            write(f"{file_cpu:>7.1f}s{count:>7}  {path}")
        write(f"the {SHOWN} tests that waited longest (wall less CPU, setup and teardown included):")
        write(f"{'waited':>8}{'wall':>8}{'CPU':>8}  test")
        waits = sorted(self.tests, key=lambda test: test[1] - test[2], reverse=True)
        for nodeid, test_wall, test_cpu in waits[:SHOWN]:
            write(f"{max(0.0, test_wall - test_cpu):>7.1f}s{test_wall:>7.1f}s{test_cpu:>7.1f}s  {nodeid}")


def cpu_by_file(tests: list[tuple[str, float, float]]) -> list[tuple[str, tuple[float, int]]]:
    """Each test file's CPU seconds and test count, the most CPU first."""
    files: dict[str, tuple[float, int]] = {}
    for nodeid, _, test_cpu in tests:
        path = nodeid.split("::", 1)[0]
        file_cpu, count = files.get(path, (0.0, 0))
        files[path] = (file_cpu + test_cpu, count + 1)
    return sorted(files.items(), key=lambda item: item[1][0], reverse=True)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SuiteClock(), "suite_clock")
