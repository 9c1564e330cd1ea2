"""gpulayer's Trainer: Lightning's programming model with a faster loop.

>>> from gpulayer.trainer import Trainer, Module
>>> trainer = Trainer(max_epochs=2, precision="bf16-mixed")      # doctest: +SKIP
>>> trainer.fit(Net(), train_loader)                              # doctest: +SKIP

Lightning code ports by changing ``lightning.pytorch`` to ``gpulayer.trainer`` in
its imports: ``LightningModule``, ``LightningDataModule``, ``callbacks``, ``loggers``,
``utilities``, ``core.optimizer``, ``demos.boring_classes`` and ``cli`` live at
Lightning's paths under this package; ``Fabric`` is Lightning Fabric's one-device subset.
"""

from gpulayer.trainer.callbacks import Callback, EarlyStopping, LearningRateMonitor, ModelCheckpoint
from gpulayer.trainer.checkpoint import LIGHTNING_FORMAT_VERSION
from gpulayer.trainer.config import TrainerConfig
from gpulayer.trainer.datamodule import LightningDataModule
from gpulayer.trainer.errors import MisconfigurationException, RankFailed, TrainerConfigError, TrainerError
from gpulayer.trainer.fabric import Fabric
from gpulayer.trainer.loggers import CSVLogger, Logger, TensorBoardLogger
from gpulayer.trainer.module import LightningModule, Module
from gpulayer.trainer.seed import seed_everything
from gpulayer.trainer.trainer import Trainer, fit_rank
from gpulayer.trainer import cli_trainer  # noqa: E402,F401  (Trainer.__init__'s typed signature)

# The Lightning release whose API and checkpoint format this package follows (what Lightning's own
# ``__version__`` says and its checkpoints record as "pytorch-lightning_version"); gpulayer's is gpulayer.__version__.
__version__ = LIGHTNING_FORMAT_VERSION

__all__ = [
    "Callback", "CSVLogger", "EarlyStopping", "Fabric", "LearningRateMonitor", "LightningDataModule", "LightningModule", "Logger",
    "MisconfigurationException", "ModelCheckpoint", "Module", "RankFailed", "TensorBoardLogger", "Trainer",
    "TrainerConfig", "TrainerConfigError", "TrainerError", "fit_rank", "seed_everything",
]
