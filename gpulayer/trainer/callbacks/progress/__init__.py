"""Lightning's ``callbacks.progress`` package: the progress-bar callbacks (tqdm_progress.py, rich_progress.py)."""

from gpulayer.trainer.callbacks.progress.tqdm_progress import ProgressBar, TQDMProgressBar, Tqdm
from gpulayer.trainer.callbacks.progress.rich_progress import RichProgressBar

__all__ = ["ProgressBar", "RichProgressBar", "TQDMProgressBar", "Tqdm"]
