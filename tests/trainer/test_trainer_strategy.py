"""What a Trainer holds before and after a run: its strategy from ``__init__`` (a module connected to it can be
checkpointed before any fit), a fitted Trainer that pickles, and ``ModelCheckpoint``'s annotations as a CLI
reads them. Compared with Lightning where it runs."""

from __future__ import annotations

import importlib
from inspect import signature

import pytest
import torch

from tests.trainer.twin import QUIET, both, regressor


def net(L):
    class Net(regressor(L)):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["saved_by_module"] = True

    return Net()


def test_a_module_connected_to_the_strategy_can_be_checkpointed_before_any_run(tmp_path):
    def run(L):
        ckpt_cb = L.ModelCheckpoint(dirpath=tmp_path / L.name, save_last=True)
        trainer = L.Trainer(callbacks=[ckpt_cb], **QUIET)
        model = net(L)
        trainer.strategy.connect(model)
        path = tmp_path / f"{L.name}.ckpt"
        trainer.save_checkpoint(path)
        ckpt = torch.load(path, weights_only=False)
        return (trainer.lightning_module is model, ckpt["epoch"], ckpt["global_step"], sorted(ckpt["state_dict"]),
                ckpt.get("saved_by_module"), ckpt["callbacks"][ckpt_cb.state_key]["last_model_path"])

    assert both(run) == (True, 0, 0, ["layer.bias", "layer.weight"], True, "")


def test_save_checkpoint_without_a_module_says_so(tmp_path):
    def run(L):
        trainer = L.Trainer(**QUIET)
        try:
            trainer.save_checkpoint(tmp_path / "x.ckpt")
        except AttributeError as err:
            return trainer.lightning_module, str(err).split(".")[0]
        return "saved"

    assert both(run) == (None, "Saving a checkpoint is only possible if a model is attached to the Trainer")


def test_the_strategy_exists_before_the_run_and_knows_its_device():
    def run(L):
        strategy = L.Trainer(**QUIET).strategy
        return str(strategy.root_device), strategy.global_rank, strategy.world_size, strategy.is_global_zero

    assert both(run) == ("cpu", 0, 1, True)


def test_a_fitted_trainer_and_its_model_pickle(tmp_path):
    def run(L):
        root = {"gpulayer": "gpulayer.trainer", "lightning": "lightning.pytorch"}[L.name]
        model = importlib.import_module(f"{root}.demos.boring_classes").BoringModel()  # a class pickle can find
        trainer = L.Trainer(max_epochs=1, limit_train_batches=2, default_root_dir=tmp_path / L.name,
                            enable_checkpointing=False, **QUIET)
        trainer.fit(model)
        path = tmp_path / f"{L.name}.pt"
        torch.save(trainer.lightning_module, path)
        torch.save(trainer, path)
        loaded = torch.load(path, weights_only=False)
        return loaded.global_step, torch.equal(loaded.lightning_module.layer.weight, model.layer.weight)

    assert both(run) == (2, True)


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("no", False), ("link", "link")])
def test_model_checkpoint_save_last_parses_from_a_command_line(value, expected):
    jsonargparse = pytest.importorskip("jsonargparse")
    from gpulayer.trainer.callbacks import ModelCheckpoint

    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--save_last", type=signature(ModelCheckpoint).parameters["save_last"].annotation)
    assert parser.parse_args(["--save_last", value]).save_last == expected
