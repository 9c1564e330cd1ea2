"""Lightning's path ``lightning.pytorch.core.module``."""

from gpulayer.trainer.export import _ONNX_AVAILABLE, _ONNXSCRIPT_AVAILABLE  # noqa: F401  (Lightning's tests read them here)
from gpulayer.trainer.module import LightningModule

__all__ = ["LightningModule"]
