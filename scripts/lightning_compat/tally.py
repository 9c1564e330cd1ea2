"""Count outcomes per test function and render the report (text for the terminal, Markdown for docs).

Per function and side: "passed" when every case that ran (was not skipped) passed, "skipped" when every case
skipped, "failed" otherwise (cause: the first failing case's). The measure: of the public functions that pass
under Lightning, how many pass under gpulayer, where gpulayer passes a function when every case that passed
under Lightning passes under gpulayer too. The per-case figures count, over all public functions, the cases
that pass under Lightning and how many of them pass under gpulayer.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from lightning_compat.runner import FileRun


def function_key(case: str) -> str:
    return case.split("[", 1)[0]  # parameter ids may hold "::"; class and function names hold no "["


@dataclass
class FunctionResult:
    key: str
    private: str | None
    lightning: str          # passed / failed / skipped / unknown (no Lightning run)
    lightning_cause: str
    gpulayer: str           # passed / failed / skipped / not run
    gpulayer_cause: str
    cases_counted: int = 0  # cases that pass under Lightning (summed over public functions only)
    cases_passed: int = 0   # ... and under gpulayer

    @property
    def counted(self) -> bool:
        """In the denominator: public and passing under Lightning (or no Lightning run: public, not skipped)."""
        if self.private:
            return False
        if self.lightning == "unknown":
            return self.gpulayer != "skipped"
        return self.lightning == "passed"


@dataclass
class FileResult:
    file: str
    functions: list[FunctionResult] = field(default_factory=list)
    note: str = ""

    def count(self, predicate) -> int:
        return sum(1 for f in self.functions if predicate(f))


def _case_outcomes(run: FileRun | None, keys: list[str]) -> dict[str, dict[str, dict]]:
    """function key -> case id -> {"outcome", "cause"}, with collection errors and lost cases as failures."""
    by_function: dict[str, dict[str, dict]] = defaultdict(dict)
    if run is None:
        return by_function
    for case in run.collected:
        by_function[function_key(case)][case] = run.cases.get(case) or {
            "outcome": "failed", "cause": f"not run: {run.note or 'the pytest process ended before it'}"}
    for case, result in run.cases.items():
        by_function[function_key(case)].setdefault(case, result)
    if run.collect_errors:
        cause = run.collect_errors[0]
        for key in keys:
            by_function.setdefault(key, {key: {"outcome": "failed", "cause": f"collection: {cause}"}})
    elif not run.collected and run.note:
        for key in keys:
            by_function.setdefault(key, {key: {"outcome": "failed", "cause": f"not run: {run.note}"}})
    return by_function


def _summary(cases: dict[str, dict]) -> tuple[str, str]:
    if not cases:
        return "not run", ""
    outcomes = [c["outcome"] for c in cases.values()]
    if all(o == "skipped" for o in outcomes):
        return "skipped", next(iter(cases.values()))["cause"]
    failed = [c for c in cases.values() if c["outcome"] == "failed"]
    if failed:
        return "failed", failed[0]["cause"]
    return "passed", ""


def tally_file(rel: str, private: dict[str, str | None], lightning: FileRun | None, gpulayer: FileRun | None) -> FileResult:
    keys = list(private)
    light_cases = _case_outcomes(lightning, keys)
    gpu_cases = _case_outcomes(gpulayer, keys)
    all_keys = list(dict.fromkeys(keys + list(light_cases) + list(gpu_cases)))
    result = FileResult(rel, note="; ".join(n for n in ((lightning.note if lightning else ""),
                                                         (gpulayer.note if gpulayer else "")) if n))
    for key in all_keys:
        l_out, l_cause = _summary(light_cases.get(key, {})) if lightning else ("unknown", "")
        g_cases = gpu_cases.get(key, {})
        g_out, g_cause = _summary(g_cases) if gpulayer else ("not run", "")
        fn = FunctionResult(key, private.get(key), l_out, l_cause, g_out, g_cause)
        if lightning and gpulayer:
            # gpulayer passes the function when the cases that pass under Lightning pass under it too
            good = [c for c, r in light_cases.get(key, {}).items() if r["outcome"] == "passed"]
            fn.cases_counted = len(good)
            fn.cases_passed = sum(1 for c in good if g_cases.get(c, {}).get("outcome") == "passed")
            if fn.counted:
                if fn.cases_passed == fn.cases_counted:
                    fn.gpulayer, fn.gpulayer_cause = "passed", ""
                else:
                    first = next(c for c in good if g_cases.get(c, {}).get("outcome") != "passed")
                    if first in g_cases:
                        fn.gpulayer, fn.gpulayer_cause = g_cases[first]["outcome"], g_cases[first]["cause"]
                    else:  # the case is absent: the file did not collect, or the case's id differs
                        fn.gpulayer = "failed"
                        fn.gpulayer_cause = g_cause if g_out == "failed" else "case not collected under gpulayer"
        elif gpulayer and fn.counted:
            fn.cases_counted = sum(1 for r in g_cases.values() if r["outcome"] != "skipped")
            fn.cases_passed = sum(1 for r in g_cases.values() if r["outcome"] == "passed")
        result.functions.append(fn)
    return result


# Failure kinds, by the first line of the cause; the first match wins.
CAUSE_KINDS: list[tuple[str, str]] = [
    ("no error or warning where Lightning gives one", r"DID NOT RAISE|DID NOT WARN|No warnings of type"),
    ("different message", r"Regex pattern did not match|does not match"),
    ("hangs", r"Timeout|not run:"),
    ("missing API", r"ImportError|ModuleNotFoundError|cannot import|has no attribute|unexpected keyword|"
                    r"positional argument|missing \d+ required|object is not callable|not subscriptable|"
                    r"object is not iterable|NotImplementedError"),
    ("refuses what Lightning accepts", r"TrainerConfigError|MisconfigurationException|ValueError|RuntimeError|TypeError"),
    ("wrong behaviour (an assertion on results fails)", r"AssertionError|assert |Expected|expected call|called"),
]


def cause_kind(cause: str) -> str:
    for kind, pattern in CAUSE_KINDS:
        if re.search(pattern, cause):
            return kind
    return "other error"


def _skip_reasons(fr: FileResult) -> str:
    reasons = Counter(_short(f.lightning_cause if f.lightning == "skipped" else f.gpulayer_cause)
                      for f in fr.functions if not f.private and "skipped" in (f.lightning, f.gpulayer)
                      and not (f.lightning == "passed"))
    return ", ".join(f"{r} x{n}" for r, n in reasons.most_common())


def _normalized(cause: str) -> str:
    """A cause without its numbers and quoted values' details, so that the same defect groups together."""
    cause = re.sub(r"0x[0-9a-f]+", "0x…", cause)
    cause = re.sub(r"\b\d+(\.\d+)?\b", "N", cause)
    return _short(cause, 110)


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def totals(results: list[FileResult]) -> dict:
    t = Counter({k: 0 for k in ("functions", "private", "skipped", "lightning_failed", "counted", "passed",
                                "cases_counted", "cases_passed")})
    for fr in results:
        for f in fr.functions:
            t["functions"] += 1
            t["private"] += bool(f.private)
            if not f.private:
                t["skipped"] += f.lightning == "skipped" or (f.lightning == "unknown" and f.gpulayer == "skipped")
                t["lightning_failed"] += f.lightning == "failed"
                t["counted"] += f.counted
                t["passed"] += f.counted and f.gpulayer == "passed"
                t["cases_counted"] += f.cases_counted
                t["cases_passed"] += f.cases_passed
    t["percent"] = round(100.0 * t["passed"] / t["counted"], 1) if t["counted"] else 0.0
    return dict(t)


def file_row(fr: FileResult) -> dict:
    return totals([fr]) | {"file": fr.file}


def render_text(results: list[FileResult], *, verbose_private: bool = False) -> str:
    lines = []
    for fr in results:
        row = file_row(fr)
        lines.append(f"{fr.file}: {row['functions']} functions, {row['private']} private, {row['skipped']} skipped, "
                     f"{row['lightning_failed']} fail under Lightning, {row['counted']} counted; gpulayer passed "
                     f"{row['passed']}/{row['counted']} (cases {row['cases_passed']}/{row['cases_counted']})"
                     + (f"  [{fr.note}]" if fr.note else ""))
        skips = _skip_reasons(fr)
        if skips:
            lines.append(f"    skipped: {skips}")
        for f in fr.functions:
            if f.counted and f.gpulayer != "passed":
                lines.append(f"    FAIL {f.key}: {_short(f.gpulayer_cause) or f.gpulayer}")
            elif verbose_private and f.private:
                lines.append(f"    private {f.key}: {f.private}")
    t = totals(results)
    lines.append(f"TOTAL: {t['functions']} functions, {t['private']} private, {t['skipped']} skipped, "
                 f"{t['lightning_failed']} fail under Lightning; gpulayer passed {t['passed']}/{t['counted']} = "
                 f"{t['percent']}% (cases {t['cases_passed']}/{t['cases_counted']})")
    return "\n".join(lines)


def per_file_summary(results: list[FileResult]) -> dict:
    """{file: {"counted", "passed"}} and the totals: what --before reads back from a saved --json."""
    return {fr.file: {"counted": file_row(fr)["counted"], "passed": file_row(fr)["passed"]} for fr in results}


def directory(rel: str) -> str:
    """The top directory under tests_pytorch a file belongs to (``.`` for test_cli.py and the like)."""
    return rel.split("/", 1)[0] if "/" in rel else "."


def render_by_directory(results: list[FileResult]) -> list[str]:
    """One row per top directory: what the per-file table says, summed."""
    groups: dict[str, list[FileResult]] = defaultdict(list)
    for fr in results:
        groups[directory(fr.file)].append(fr)
    out = ["| directory | files | functions | private | skipped | fail under Lightning | counted | gpulayer passed "
           "| % |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, frs in sorted(groups.items()) + [("**total**", results)]:
        t = totals(frs)
        pct = f"{t['percent']:.0f}" if t["counted"] else "-"
        out.append(f"| {name} | {len(frs)} | {t['functions']} | {t['private']} | {t['skipped']} | "
                   f"{t['lightning_failed']} | {t['counted']} | {t['passed']} | {pct} |")
    return out


def render_biggest_gaps(results: list[FileResult], limit: int = 15) -> list[str]:
    """The files with the most counted functions failing under gpulayer, each with its most common cause."""
    gaps = []
    for fr in results:
        failing = [f for f in fr.functions if f.counted and f.gpulayer != "passed"]
        if failing:
            cause, n = Counter(_normalized(f.gpulayer_cause) for f in failing).most_common(1)[0]
            gaps.append((len(failing), fr.file, file_row(fr)["counted"], cause, n))
    gaps.sort(key=lambda g: (-g[0], g[1]))
    return [f"- `{rel}`: {n} of {counted} failing; most common ({k} x): {_short(cause, 160).replace('|', '/')}"
            for n, rel, counted, cause, k in gaps[:limit]]


def render_markdown(results: list[FileResult], before: list[tuple[str, dict]] | None = None) -> str:
    """By directory, the biggest gaps, the per-file table (with a "passed at X" column per (label, saved summary)
    in ``before``), then the most common causes, the failures by kind, the skips, Lightning's own failures and
    the private rules."""
    before = before or []
    extra = "".join(f" passed at {label} |" for label, _ in before)
    out = ["### By directory", "", *render_by_directory(results), "",
           "### Biggest gaps (files by counted functions failing under gpulayer)", "",
           *render_biggest_gaps(results), "", "### By file", "",
           "| file | functions | private | skipped | fail under Lightning | counted |" + extra
           + " gpulayer passed | % | cases |",
           "|---|---:|---:|---:|---:|---:|" + "---:|" * len(before) + "---:|---:|---:|"]
    for fr in results + [None]:
        row = file_row(fr) if fr else totals(results) | {"file": "**total**"}
        pct = f"{100.0 * row['passed'] / row['counted']:.0f}" if row["counted"] else "-"
        cells = ""
        for _, summary in before:
            if fr:
                cells += f" {summary[fr.file]['passed'] if fr.file in summary else '-'} |"
            else:
                cells += f" {sum(v['passed'] for k, v in summary.items() if k in {r.file for r in results})} |"
        out.append(f"| {row['file']} | {row['functions']} | {row['private']} | {row['skipped']} | "
                   f"{row['lightning_failed']} | {row['counted']} |{cells} {row['passed']} | {pct} | "
                   f"{row['cases_passed']}/{row['cases_counted']} |")
    common = Counter(_normalized(f.gpulayer_cause) for fr in results for f in fr.functions
                     if f.counted and f.gpulayer != "passed")
    out.append("")
    out.append("### Most common causes (counted functions failing under gpulayer)")
    out.append("")
    out.extend(f"- {n} x {cause.replace('|', '/')}" for cause, n in common.most_common(20) if n > 1)
    out.append("")
    out.append("### Failures by kind")
    by_kind: dict[str, list[str]] = defaultdict(list)
    for fr in results:
        for f in fr.functions:
            if f.counted and f.gpulayer != "passed":
                by_kind[cause_kind(f.gpulayer_cause)].append(
                    f"- `{fr.file}::{f.key}`: {_short(f.gpulayer_cause, 220).replace('|', '/') or f.gpulayer}")
    for kind, items in sorted(by_kind.items(), key=lambda kv: -len(kv[1])):
        out.append("")
        out.append(f"#### {kind} ({len(items)})")
        out.append("")
        out.extend(items)
    out.append("")
    out.append("### Skipped (public functions), by reason")
    out.append("")
    for fr in results:
        skips = _skip_reasons(fr)
        if skips:
            out.append(f"- `{fr.file}`: {skips.replace('|', '/')}")
    out.append("")
    out.append("### Failing under Lightning on this machine (not counted), by cause")
    out.append("")
    light_causes = Counter(_short(f.lightning_cause, 120) for fr in results for f in fr.functions
                           if not f.private and f.lightning == "failed")
    out.extend(f"- {cause.replace('|', '/')}: {n}" for cause, n in light_causes.most_common())
    out.append("")
    out.append("### Private (counted apart), by rule")
    out.append("")
    rules = Counter(f.private.split(":")[0] for fr in results for f in fr.functions if f.private)
    out.extend(f"- {rule}: {n}" for rule, n in rules.most_common())
    return "\n".join(out) + "\n"
