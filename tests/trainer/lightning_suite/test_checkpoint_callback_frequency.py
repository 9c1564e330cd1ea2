"""Lightning's own tests, copied verbatim with only the imports changed.

From github.com/Lightning-AI/pytorch-lightning, tests/tests_pytorch/checkpointing/test_checkpoint_callback_frequency.py at 7f0c3436cd3f
(the 2.6 line; compared against the installed Lightning 2.6.6). Imports: ``lightning.pytorch`` ->
``gpulayer.trainer``; ``tests_pytorch.helpers.runif`` -> ``tests.trainer.lightning_suite.runif``.
Only the functions that run on gpulayer are kept (1 here); the others are counted in
tests/trainer/lightning_suite/README.md.
"""

import os
from unittest import mock
import pytest
import torch
from gpulayer.trainer import Trainer, callbacks
from gpulayer.trainer.demos.boring_classes import BoringModel
from tests.trainer.lightning_suite.runif import RunIf


def test_disabled_checkpointing():
    # no callback
    trainer = Trainer(logger=False, max_epochs=3, enable_checkpointing=False)
    assert not trainer.checkpoint_callbacks
    trainer.fit(BoringModel())
    assert not trainer.checkpoint_callbacks
