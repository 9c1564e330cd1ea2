"""Whether a hosted logger's library is installed, asked when first needed (the ``_WANDB_AVAILABLE``-style flags).

A ``Requirement`` is true when the module imports and its distribution meets the version bound. It is
checked lazily, so importing ``gpulayer.trainer.loggers`` never imports wandb, Comet or MLflow; its
``str`` is the message a user sees when the library is missing: what is needed and the ``pip`` line.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util


class Requirement:
    """``Requirement("wandb>=0.12.10")``; ``module`` when the import name differs (``comet-ml`` -> ``comet_ml``)."""

    def __init__(self, spec: str, module: str | None = None) -> None:
        self.spec = spec
        self.distribution, _, self.minimum = spec.partition(">=")
        self.module = module or self.distribution.replace("-", "_")
        self._met: bool | None = None
        self._why = ""

    def __bool__(self) -> bool:
        if self._met is None:
            self._met, self._why = self._check()
        return self._met

    def _check(self) -> tuple[bool, str]:
        try:
            if importlib.util.find_spec(self.module) is None:
                return False, f"`{self.module}` is not installed"
        except (ImportError, ValueError):
            return False, f"`{self.module}` is not importable"
        if not self.minimum:
            return True, ""
        try:
            installed = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return True, ""  # importable without package metadata (a source checkout): trust it
        if _version_tuple(installed) < _version_tuple(self.minimum):
            return False, f"`{self.distribution}` {installed} is installed"
        return True, ""

    def __str__(self) -> str:
        if self:
            return f"Requirement {self.spec!r} met"
        return f"Requirement {self.spec!r} not met: {self._why}. Install it with: pip install -U '{self.spec}'"

    __repr__ = __str__


def _version_tuple(version: str) -> tuple[int, ...]:
    """``"2.8.1rc0"`` -> ``(2, 8, 1)``: the leading numeric release, enough for a lower bound."""
    numbers = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) != len(part):
            break
    return tuple(numbers)
