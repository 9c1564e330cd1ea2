"""Lightning's ``utilities.enums`` names that user code passes as arguments."""

from __future__ import annotations

from gpulayer.trainer.states import _CaseInsensitiveStr


class GradClipAlgorithmType(_CaseInsensitiveStr):
    """How ``gradient_clip_val`` clips: ``"norm"`` scales all gradients by their global 2-norm, ``"value"`` clamps
    each gradient element to ``[-val, val]``. Members equal their string, so ``"norm"`` and ``NORM`` are one."""

    VALUE = "value"
    NORM = "norm"

    @staticmethod
    def supported_type(val: str) -> bool:
        return any(m.value == val.lower() for m in GradClipAlgorithmType)

    @staticmethod
    def supported_types() -> list[str]:
        return [m.value for m in GradClipAlgorithmType]
