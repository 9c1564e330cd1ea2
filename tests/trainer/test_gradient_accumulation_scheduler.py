"""``GradientAccumulationScheduler``: the accumulation factor changes with the epoch, steps and weights as in
Lightning; its checks (factors, epochs, manual optimization, a Trainer factor set too)."""

from __future__ import annotations

import pytest
import torch

from gpulayer.trainer import Trainer
from gpulayer.trainer.callbacks import GradientAccumulationScheduler
from gpulayer.trainer.errors import MisconfigurationException
from tests.trainer.twin import QUIET, both, loader, regressor


def scheduled_run(L, scheduling):
    import importlib
    root = {"gpulayer": "gpulayer.trainer", "lightning": "lightning.pytorch"}[L.name]
    scheduler_cls = importlib.import_module(f"{root}.callbacks").GradientAccumulationScheduler

    class Net(regressor(L)):
        pass

    class Steps(L.Callback):
        def __init__(self):
            self.per_epoch = {}

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.per_epoch[trainer.current_epoch] = self.per_epoch.get(trainer.current_epoch, 0) + 1

    torch.manual_seed(0)
    steps, model = Steps(), Net()
    trainer = L.Trainer(max_epochs=4, enable_checkpointing=False, callbacks=[scheduler_cls(dict(scheduling)), steps],
                        **QUIET)
    trainer.fit(model, loader(rows=24, batch_size=4))  # 6 batches per epoch
    return steps.per_epoch, trainer.global_step, trainer.accumulate_grad_batches, \
        [round(v, 5) for v in model.layer.weight.flatten().tolist()]


def test_the_factor_follows_the_epoch_and_training_matches_lightning():
    per_epoch, global_step, last, _ = both(scheduled_run, {1: 2, 3: 4})
    # epoch 0: every batch; epochs 1-2: pairs; epoch 3: 4 then the last 2 (an epoch's end always steps)
    assert per_epoch == {0: 6, 1: 3, 2: 3, 3: 2} and global_step == 14 and last == 4


@pytest.mark.parametrize(("scheduling", "match"), [
    ({1: 2, -3: 4}, "Epoch should be an int greater than or equal to 0"),
    ({0: 2, "2": 1}, "Epoch should be an int greater than or equal to 0"),
    ({1: 0}, "Accumulation factor should be an int greater than 0"),
])
def test_invalid_schedules_are_refused(scheduling, match):
    with pytest.raises(MisconfigurationException, match=match):
        GradientAccumulationScheduler(scheduling)


def test_the_trainer_factor_and_the_callback_together_are_refused():
    def run(L):
        import importlib
        root = {"gpulayer": "gpulayer.trainer", "lightning": "lightning.pytorch"}[L.name]
        scheduler_cls = importlib.import_module(f"{root}.callbacks").GradientAccumulationScheduler
        boring = importlib.import_module(f"{root}.demos.boring_classes").BoringModel
        trainer = L.Trainer(accumulate_grad_batches=2, max_epochs=1, enable_checkpointing=False,
                            callbacks=[scheduler_cls({0: 2})], **QUIET)
        try:
            trainer.fit(boring())
        except ValueError as err:
            return str(err).split(".")[0]

    assert both(run) == "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` callback"


def test_manual_optimization_is_refused():
    from gpulayer.trainer.demos.boring_classes import BoringModel
    model = BoringModel()
    model.automatic_optimization = False
    with pytest.raises(RuntimeError, match="not supported for manual optimization"):
        GradientAccumulationScheduler({1: 2}).on_train_start(Trainer(**QUIET), model)
