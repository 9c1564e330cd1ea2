"""Lightning's ``callbacks.progress.progress_bar`` path: the base class of progress bars."""

from gpulayer.trainer.callbacks.progress.tqdm_progress import ProgressBar

__all__ = ["ProgressBar"]
