"""Lightning's own tests, copied verbatim with only the imports changed.

From github.com/Lightning-AI/pytorch-lightning, tests/tests_pytorch/checkpointing/test_trainer_checkpoint.py at 7f0c3436cd3f
(the 2.6 line; compared against the installed Lightning 2.6.6). Imports: ``lightning.pytorch`` ->
``gpulayer.trainer``; ``tests_pytorch.helpers.runif`` -> ``tests.trainer.lightning_suite.runif``.
Only the functions that run on gpulayer are kept (1 here); the others are counted in
tests/trainer/lightning_suite/README.md.
"""

import os
from unittest import mock
from unittest.mock import ANY, Mock
import pytest
import torch
import gpulayer.trainer as pl
from lightning.fabric.plugins import TorchCheckpointIO, XLACheckpointIO
from gpulayer.trainer import Trainer
from gpulayer.trainer.callbacks import ModelCheckpoint
from gpulayer.trainer.demos.boring_classes import BoringModel


def test_finetuning_with_ckpt_path(tmp_path):
    """This test validates that generated ModelCheckpoint is pointing to the right best_model_path during test."""
    checkpoint_callback = ModelCheckpoint(monitor="val_loss", dirpath=tmp_path, filename="{epoch:02d}", save_top_k=-1)

    class ExtendedBoringModel(BoringModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.001)
            lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return [optimizer], [lr_scheduler]

        def validation_step(self, batch, batch_idx):
            loss = self.step(batch)
            self.log("val_loss", loss, on_epoch=True, prog_bar=True)

    model = ExtendedBoringModel()
    trainer = Trainer(
        default_root_dir=tmp_path,
        max_epochs=1,
        limit_train_batches=12,
        limit_val_batches=6,
        limit_test_batches=12,
        callbacks=[checkpoint_callback],
        logger=False,
    )
    trainer.fit(model)
    assert os.listdir(tmp_path) == ["epoch=00.ckpt"]

    best_model_paths = [checkpoint_callback.best_model_path]
    for idx in range(3, 6):
        # load from checkpoint
        trainer = pl.Trainer(
            default_root_dir=tmp_path,
            max_epochs=idx,
            limit_train_batches=12,
            limit_val_batches=12,
            limit_test_batches=12,
            enable_progress_bar=False,
        )
        trainer.fit(model, ckpt_path=best_model_paths[-1])
        trainer.test()
        best_model_paths.append(trainer.checkpoint_callback.best_model_path)

    for idx, best_model_path in enumerate(best_model_paths):
        if idx == 0:
            assert best_model_path.endswith(f"epoch=0{idx}.ckpt")
        else:
            assert f"epoch={idx + 1}" in best_model_path
