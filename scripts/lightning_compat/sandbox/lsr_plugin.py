"""A pytest plugin (``-p lsr_plugin``) that writes every test case's outcome as JSON lines to $LSR_OUT.

Records: {"event": "collected", "nodeid"} per collected case; {"event": "collect_error", "nodeid", "cause"};
{"event": "report", "nodeid", "when", "outcome", "cause"} per setup/call/teardown report that decides the outcome.
A line is flushed as soon as it is known, so a process killed mid-file still leaves the cases it finished.
"""

import json
import os

_OUT = None


def _write(record):
    global _OUT
    if _OUT is None:
        _OUT = open(os.environ["LSR_OUT"], "a", encoding="utf-8")
    _OUT.write(json.dumps(record) + "\n")
    _OUT.flush()


def _unmask_placeholders(cause):
    """A cause naming an import placeholder's class becomes the ImportError it stands for."""
    if "lsr_runtime.missing_" not in cause:
        return cause
    import lsr_runtime

    for class_path, message in lsr_runtime.REGISTRY.items():
        if class_path in cause:
            return f"ImportError: {message}"
    return cause


def one_line(report):
    """Exception type and the first line of its message, or the skip reason."""
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (path, lineno, reason)
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    text = str(longrepr)
    error_lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    if crash is not None and crash.message:
        return crash.message.strip().splitlines()[0][:300]
    if error_lines:
        # a collection error's text: the exception's own line is the last run of "E" lines' first line
        for line in error_lines:
            if ":" in line.split(" ")[0] or line.split(":")[0].endswith(("Error", "Exception")):
                return line[:300]
        return error_lines[-1][:300]
    return text.strip().splitlines()[-1][:300] if text.strip() else "error"


def pytest_collectreport(report):
    if report.failed:
        _write({"event": "collect_error", "nodeid": report.nodeid, "cause": one_line(report)})


def pytest_collection_finish(session):
    for item in session.items:  # after -k deselection
        _write({"event": "collected", "nodeid": item.nodeid})


def pytest_runtest_logreport(report):
    if report.when == "call" or report.failed or report.skipped:
        outcome = report.outcome
        cause = _unmask_placeholders(one_line(report))
        if hasattr(report, "wasxfail"):
            outcome, cause = "skipped", f"xfail: {report.wasxfail or cause}"
        _write({"event": "report", "nodeid": report.nodeid, "when": report.when, "outcome": outcome, "cause": cause})
