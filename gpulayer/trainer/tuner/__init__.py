"""Lightning's ``Tuner``: find a learning rate (``lr_find``) and the largest batch size that fits (``scale_batch_size``).

>>> tuner = Tuner(Trainer(max_epochs=5))                      # doctest: +SKIP
>>> tuner.lr_find(model).suggestion()                         # doctest: +SKIP
>>> tuner.scale_batch_size(model, mode="binsearch")           # doctest: +SKIP

Each search runs short trial fits of the model on the Trainer's settings (no logger, no
checkpoints, no progress bar), then puts the model's weights back as they were; the result
is written to the model's ``lr`` / ``learning_rate`` / ``batch_size`` attribute (or its
``hparams``, or the datamodule's).
"""

from gpulayer.trainer.tuner.lr_finder import LRFinder
from gpulayer.trainer.tuner.tuning import Tuner

__all__ = ["LRFinder", "Tuner"]
