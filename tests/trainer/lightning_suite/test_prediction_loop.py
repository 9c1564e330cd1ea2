"""Lightning's own tests, copied verbatim with only the imports changed.

From github.com/Lightning-AI/pytorch-lightning, tests/tests_pytorch/loops/test_prediction_loop.py at 7f0c3436cd3f
(the 2.6 line; compared against the installed Lightning 2.6.6). Imports: ``lightning.pytorch`` ->
``gpulayer.trainer``; ``tests_pytorch.helpers.runif`` -> ``tests.trainer.lightning_suite.runif``.
Only the functions that run on gpulayer are kept (1 here); the others are counted in
tests/trainer/lightning_suite/README.md.
"""

import itertools
import pytest
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler
from gpulayer.trainer import LightningModule, Trainer
from gpulayer.trainer.demos.boring_classes import BoringModel, RandomDataset


def test_prediction_loop_when_batch_idx_argument_is_not_given(tmp_path):
    class TestModel(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.predict_step_called = False

        def predict_step(self, batch):
            self.predict_step_called = True
            return self.step(batch)

    trainer = Trainer(
        default_root_dir=tmp_path,
        fast_dev_run=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    model = TestModel()

    trainer.predict(model)
    assert model.predict_step_called
