"""Lightning's ``callbacks.progress`` package: the progress-bar callbacks (tqdm_progress.py)."""

from gpulayer.trainer.callbacks.progress.tqdm_progress import ProgressBar, RichProgressBar, TQDMProgressBar, Tqdm

__all__ = ["ProgressBar", "RichProgressBar", "TQDMProgressBar", "Tqdm"]
