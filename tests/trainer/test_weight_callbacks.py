"""The callbacks that change the weights themselves: ``ModelPruning``, ``StochasticWeightAveraging``,
``WeightAveraging`` / ``EMAWeightAveraging``. Short fits on tiny models; each scenario's weights are compared with
Lightning 2.6.6's where it is installed."""

from __future__ import annotations

import copy
import importlib
import logging

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, gpulayer_ns, loader


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the fits' default checkpoints land there


def callbacks(L):
    return importlib.import_module({"gpulayer": "gpulayer.trainer", "lightning": "lightning.pytorch"}[L.name]
                                   + ".callbacks")


def net(L, batch_norm: bool = False, scheduler: bool = False):
    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            layers = [nn.Linear(4, 8)] + ([nn.BatchNorm1d(8)] if batch_norm else []) + [nn.ReLU(), nn.Linear(8, 1)]
            self.layer = nn.Sequential(*layers)

        def training_step(self, batch, batch_idx):
            loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            if scheduler:
                return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1)}
            return opt

    return Net()


def weights(model) -> list[list[float]]:
    return [[round(v, 5) for v in t.detach().flatten().tolist()] for t in model.state_dict().values()
            if t.is_floating_point()]


# -- ModelPruning ---------------------------------------------------------------------------------
def test_global_l1_pruning_zeroes_the_smallest_weights_and_is_made_permanent_at_the_end():
    def run(L):
        model = net(L)
        pruning = callbacks(L).ModelPruning("l1_unstructured", amount=0.25, parameter_names=["weight"],
                                            use_lottery_ticket_hypothesis=False)
        L.Trainer(max_epochs=2, callbacks=[pruning], **QUIET).fit(model, loader())
        zeros = [int((m.weight == 0).sum()) for m in model.layer if isinstance(m, nn.Linear)]
        leftover = [name for name, _ in model.named_buffers() if name.endswith("_mask")]
        return zeros, leftover, weights(model)

    zeros, leftover, _ = both(run)
    assert sum(zeros) == 18  # 25% of the 40 weights (8*4 + 1*8), then 25% of the 30 left: 10 + 8
    assert leftover == []  # make_pruning_permanent: no masks left, plain parameters


def test_pruning_keeps_its_masks_during_the_fit_and_checkpoints_hold_plain_pruned_weights(tmp_path):
    L = gpulayer_ns()
    seen = []

    class Peek(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            seen.append(hasattr(pl_module.layer[0], "weight_mask"))

    model = net(L)
    pruning = callbacks(L).ModelPruning("random_unstructured", parameters_to_prune=[(model.layer[0], "weight")],
                                        amount=0.5)
    trainer = L.Trainer(max_epochs=2, callbacks=[pruning, Peek()], **QUIET)
    trainer.fit(model, loader())
    path = tmp_path / "pruned.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["state_dict"]
    assert seen == [True, True]
    assert "layer.0.weight" in state and not any(k.endswith(("_orig", "_mask")) for k in state)
    assert int((state["layer.0.weight"] == 0).sum()) == 24  # 16 of 32, then 8 of the 16 left


def test_local_structured_pruning_and_the_sparsity_log(caplog):
    L = gpulayer_ns()
    model = net(L)
    pruning = callbacks(L).ModelPruning("ln_structured", parameters_to_prune=[(model.layer[0], "weight")],
                                        use_global_unstructured=False, pruning_dim=0, pruning_norm=1, amount=0.5,
                                        verbose=2, make_pruning_permanent=False)
    with caplog.at_level(logging.INFO):
        L.Trainer(max_epochs=1, callbacks=[pruning], **QUIET).fit(model, loader())
    rows_pruned = int((model.layer[0].weight.abs().sum(dim=1) == 0).sum())
    assert rows_pruned == 4  # half of the 8 output rows
    assert hasattr(model.layer[0], "weight_mask")  # not made permanent
    applied = [m for m in caplog.messages if m.startswith("Applied")]
    assert applied[0] == "Applied `ln_structured`. Pruned: 0/32 (0.00%) -> 16/32 (50.00%)"
    assert applied[1].startswith("Applied `ln_structured` to `Linear(in_features=4, out_features=8, bias=True).weight`")


def test_lottery_ticket_resets_unpruned_weights_to_their_start():
    L = gpulayer_ns()
    model = net(L)
    start = model.layer[0].weight.detach().clone()
    pruning = callbacks(L).ModelPruning("l1_unstructured", parameters_to_prune=[(model.layer[0], "weight")],
                                        amount=0.5, make_pruning_permanent=False)
    L.Trainer(max_epochs=1, callbacks=[pruning], **QUIET).fit(model, loader())
    assert torch.equal(model.layer[0].weight_orig.detach(), start)
    assert int((model.layer[0].weight_mask == 0).sum()) == 16


def test_pruning_arguments_are_checked():
    ModelPruning = callbacks(gpulayer_ns()).ModelPruning
    from gpulayer.trainer.errors import MisconfigurationException
    with pytest.raises(MisconfigurationException, match="isn't in"):
        ModelPruning("l1_unstructured", parameter_names=["gamma"])
    with pytest.raises(MisconfigurationException, match="`pruning_dim` should be provided"):
        ModelPruning("random_structured", use_global_unstructured=False)
    with pytest.raises(MisconfigurationException, match="is supported with `use_global_unstructured=True`"):
        ModelPruning("random_structured", pruning_dim=0)
    with pytest.raises(MisconfigurationException, match="currently only supported with"):
        ModelPruning(torch.nn.utils.prune.L1Unstructured, use_global_unstructured=False)


# -- StochasticWeightAveraging ----------------------------------------------------------------------
def swa_fit(L, batch_norm: bool):
    model = net(L, batch_norm=batch_norm, scheduler=True)
    swa = callbacks(L).StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2)
    lrs = []

    class Lr(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            lrs.append(round(trainer.optimizers[0].param_groups[0]["lr"], 6))

    L.Trainer(max_epochs=4, callbacks=[swa, Lr()], **QUIET).fit(model, loader())
    return model, swa, lrs[:4]  # Lightning's batch-norm pass is a fifth epoch: the fit's own four are compared


def test_swa_leaves_the_module_the_average_of_the_epochs_from_swa_epoch_start():
    def run(L):
        model, swa, lrs = swa_fit(L, batch_norm=False)
        return weights(model), int(swa.n_averaged), lrs

    _, n_averaged, lrs = both(run)
    assert n_averaged == 3  # the weights at the start of epochs 1, 2, 3 (0-based)
    assert lrs == [0.01, 0.03, 0.05, 0.05]  # SWALR anneals from StepLR's 0.01 to swa_lrs in 2 epochs


def test_swa_recomputes_batch_norm_statistics_for_the_averaged_weights():
    def run(L):
        model, swa, _ = swa_fit(L, batch_norm=True)
        bn = model.layer[1]
        # Lightning's extra epoch ends with an optimizer step on the last training batch's gradients (it skips
        # their zeroing): its parameters move off the average, its statistics are those of the average
        return [round(v, 5) for v in torch.cat([bn.running_mean, bn.running_var]).tolist()], bn.momentum

    both(run)
    model, swa, _ = swa_fit(gpulayer_ns(), batch_norm=True)
    manual = copy.deepcopy(nn.Sequential(*list(model.layer)[:2])).train()  # the averaged weights, fresh statistics
    manual[1].reset_running_stats()
    manual[1].momentum = None
    with torch.no_grad():
        for x, _ in loader():
            manual(x)
    assert torch.allclose(manual[1].running_mean, model.layer[1].running_mean)
    assert torch.allclose(manual[1].running_var, model.layer[1].running_var)
    for avg, current in zip(swa._average_model.parameters(), model.parameters()):
        assert torch.equal(avg.detach(), current.detach())


def test_swa_swaps_in_swalr_and_says_so(caplog):
    L = gpulayer_ns()
    swa = callbacks(L).StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)
    with caplog.at_level(logging.INFO):
        trainer = L.Trainer(max_epochs=2, callbacks=[swa], **QUIET)
        trainer.fit(net(L, scheduler=True), loader())
    assert type(trainer.lr_scheduler_configs[0].scheduler).__name__ == "SWALR"
    assert "Swapping scheduler `StepLR` for `SWALR`" in caplog.text


# -- WeightAveraging / EMA ------------------------------------------------------------------------
@pytest.mark.parametrize("batch_norm", [False, True])
def test_ema_gives_the_module_the_moving_average(batch_norm):
    def run(L):
        model = net(L, batch_norm=batch_norm)
        ema = callbacks(L).EMAWeightAveraging(decay=0.5)
        trainer = L.Trainer(max_epochs=2, callbacks=[ema], accumulate_grad_batches=2, **QUIET)
        trainer.fit(model, loader())
        return weights(model), int(ema._average_model.n_averaged), trainer.global_step

    _, n_averaged, steps = both(run)
    assert n_averaged == steps == 4  # one update per optimizer step, not per batch


def test_validation_sees_the_average_and_the_fit_goes_on_from_the_trained_weights():
    L = gpulayer_ns()
    model = net(L)
    seen = {}

    class Watch(L.Callback):
        def on_validation_epoch_start(self, trainer, pl_module):
            seen["val"] = pl_module.layer[0].weight.detach().clone()

        def on_train_epoch_end(self, trainer, pl_module):
            seen["train"] = pl_module.layer[0].weight.detach().clone()

    ema = callbacks(L).EMAWeightAveraging(decay=0.9)
    L.Trainer(max_epochs=1, callbacks=[ema, Watch()], num_sanity_val_steps=0, **QUIET).fit(
        model, loader(), loader(rows=4))
    average = ema._average_model.module.layer[0].weight.detach()
    assert torch.equal(seen["val"], average)
    assert not torch.equal(seen["train"], average)


def test_weight_averaging_checkpoint_holds_the_average_and_resumes_the_trained_weights(tmp_path):
    L = gpulayer_ns()
    cbs = callbacks(L)
    model = net(L)
    trainer = L.Trainer(max_epochs=1, callbacks=[cbs.WeightAveraging()], **QUIET)
    trainer.fit(model, loader())
    path = tmp_path / "avg.ckpt"
    # saved after the fit: the module holds the average now, the callback keeps it
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    assert set(ckpt) >= {"current_model_state", "averaging_state"}
    assert int(ckpt["averaging_state"]["n_averaged"]) == 4

    resumed = cbs.WeightAveraging()
    again = net(L)
    L.Trainer(max_epochs=2, callbacks=[resumed], **QUIET).fit(again, loader(), ckpt_path=path)
    assert int(resumed._average_model.n_averaged) == 8


def test_swa_resumed_inside_its_phase_ends_as_the_uninterrupted_fit(tmp_path):
    def run(L):
        class Crash(L.Callback):
            def on_train_epoch_start(self, trainer, pl_module):
                if trainer.current_epoch == 3:
                    raise RuntimeError("crash")

        def fit(model, extra, run, **kwargs):
            swa = callbacks(L).StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=2)
            ckpt = L.ModelCheckpoint(dirpath=tmp_path / L.name / run, save_last=True)
            trainer = L.Trainer(max_epochs=4, callbacks=[swa, ckpt, *extra], **{**QUIET, "enable_checkpointing": True})
            trainer.fit(model, loader(), **kwargs)
            return swa

        whole = net(L, scheduler=True)
        fit(whole, [], "whole")
        with pytest.raises(RuntimeError, match="crash"):
            fit(net(L, scheduler=True), [Crash()], "crashed")  # last.ckpt: the end of epoch 2, inside SWA
        resumed = net(L, scheduler=True)
        swa = fit(resumed, [], "resumed", ckpt_path=str(tmp_path / L.name / "crashed" / "last.ckpt"))
        assert weights(resumed) == weights(whole)
        return weights(resumed), int(swa.n_averaged)

    assert both(run)[1] == 3
