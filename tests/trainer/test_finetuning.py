"""``BaseFinetuning`` and ``BackboneFinetuning``: what is frozen, when it joins the optimizer, at which learning
rate, and that a resumed fit gets the added parameter groups back. Each scenario runs under both Trainers."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, loader


def finetuning(L):
    root = {"gpulayer": "gpulayer.trainer", "lightning": "lightning.pytorch"}[L.name]
    return importlib.import_module(f"{root}.callbacks.finetuning")


def backbone_model(L, lr=0.1):
    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())
            self.head = nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.head(self.backbone(batch[0])), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=lr)

    return Net()


def test_freeze_before_training_keeps_modules_out_of_the_optimizer_until_they_are_added():
    def run(L):
        ft = finetuning(L)

        class UnfreezeAtOne(ft.BaseFinetuning):
            def freeze_before_training(self, pl_module):
                self.freeze(pl_module.backbone, train_bn=False)

            def finetune_function(self, pl_module, epoch, optimizer):
                if epoch == 1:
                    self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, initial_denom_lr=4.0)

        class Watch(L.Callback):
            def __init__(self):
                self.seen = []

            def on_train_epoch_start(self, trainer, pl_module):
                opt = trainer.optimizers[0]
                self.seen.append(([len(g["params"]) for g in opt.param_groups], [g["lr"] for g in opt.param_groups],
                                  all(p.requires_grad for p in pl_module.backbone.parameters())))

        watch = Watch()
        model = backbone_model(L)
        L.Trainer(max_epochs=3, enable_checkpointing=False, callbacks=[UnfreezeAtOne(), watch], **QUIET).fit(
            model, loader(rows=8, batch_size=4))
        return watch.seen, model.backbone[1].track_running_stats

    seen, bn_tracks = both(run)
    # epoch 0: the head only; from epoch 1 the backbone's 4 tensors at lr 0.1 / 4
    assert seen == [([2], [0.1], False), ([2, 4], [0.1, 0.025], True), ([2, 4], [0.1, 0.025], True)]
    assert bn_tracks is True


def test_backbone_finetuning_grows_the_backbone_lr_and_aligns_it():
    def run(L):
        ft = finetuning(L)

        class Rates(L.Callback):
            def __init__(self):
                self.rates = []

            def on_train_epoch_start(self, trainer, pl_module):
                self.rates.append([round(g["lr"], 6) for g in trainer.optimizers[0].param_groups])

        rates = Rates()
        cb = ft.BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 3.0,
                                   backbone_initial_ratio_lr=0.1)
        L.Trainer(max_epochs=5, enable_checkpointing=False, callbacks=[cb, rates], **QUIET).fit(
            backbone_model(L), loader(rows=8, batch_size=4))
        return rates.rates, round(cb.previous_backbone_lr, 6)

    rates, previous = both(run)
    # 0.1 * 0.1 at epoch 1, then x3 per epoch until it reaches the head's 0.1
    assert rates == [[0.1], [0.1, 0.01], [0.1, 0.03], [0.1, 0.09], [0.1, 0.1]]
    assert previous == 0.1


def test_backbone_finetuning_needs_a_backbone_module():
    def run(L):
        class NoBackbone(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.layer = nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return self.layer(batch[0]).sum()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        class FreezeNothing(finetuning(L).BackboneFinetuning):
            def freeze_before_training(self, pl_module):
                pass

        try:
            L.Trainer(max_epochs=1, enable_checkpointing=False, callbacks=[FreezeNothing()], **QUIET).fit(
                NoBackbone(), loader(rows=4, batch_size=4))
        except Exception as err:  # MisconfigurationException, each package's own
            return type(err).__name__, str(err)
        return "ran"

    assert both(run) == ("MisconfigurationException", "The LightningModule should have a nn.Module `backbone` attribute")


def test_a_resumed_fit_gets_the_added_param_groups_back(tmp_path):
    def run(L):
        ft = finetuning(L)
        path = tmp_path / f"{L.name}.ckpt"

        def fit(max_epochs, ckpt_path=None):
            L.seed_everything(0)
            cb = ft.BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.5)
            trainer = L.Trainer(max_epochs=max_epochs, enable_checkpointing=False, callbacks=[cb], **QUIET)
            trainer.fit(backbone_model(L), loader(rows=8, batch_size=4), ckpt_path=ckpt_path)
            return trainer, cb

        trainer, _ = fit(2)
        trainer.save_checkpoint(path)
        state = torch.load(path, weights_only=False)["callbacks"]["BackboneFinetuning"]
        resumed, cb = fit(3, ckpt_path=path)
        groups = resumed.optimizers[0].param_groups
        return (sorted(state), [len(g["params"]) for g in groups], [round(g["lr"], 6) for g in groups],
                round(cb.previous_backbone_lr, 6), state["internal_optimizer_metadata"][0][1]["params"])

    keys, sizes, rates, previous, names = both(run)
    assert keys == ["internal_optimizer_metadata", "previous_backbone_lr"]
    # BatchNorm stays trainable (train_bn=True), so it was in the first group; the Linear joined at epoch 1
    assert sizes == [4, 2] and rates == [0.1, 0.015] and previous == 0.015
    assert names == ["backbone.0.weight", "backbone.0.bias"]


@pytest.mark.parametrize("train_bn", [True, False])
def test_freeze_and_filter_params_treat_batchnorm_as_asked(train_bn):
    def run(L):
        base = finetuning(L).BaseFinetuning
        net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.BatchNorm1d(2), nn.Linear(2, 2)))
        base.freeze(net, train_bn=train_bn)
        frozen = [p.requires_grad for p in net.parameters()]
        trainable = len(list(base.filter_params(net, train_bn=True, requires_grad=True)))
        base.make_trainable(net)
        return frozen, trainable, [type(m).__name__ for m in base.flatten_modules(net)]

    frozen, trainable, leaves = both(run)
    assert frozen == [False, False, train_bn, train_bn, False, False]
    assert trainable == (2 if train_bn else 0)
    assert leaves == ["Linear", "BatchNorm1d", "Linear"]
