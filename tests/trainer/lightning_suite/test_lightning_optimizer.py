"""Lightning's own tests, copied verbatim with only the imports changed.

From github.com/Lightning-AI/pytorch-lightning, tests/tests_pytorch/core/test_lightning_optimizer.py at 7f0c3436cd3f
(the 2.6 line; compared against the installed Lightning 2.6.6). Imports: ``lightning.pytorch`` ->
``gpulayer.trainer``; ``tests_pytorch.helpers.runif`` -> ``tests.trainer.lightning_suite.runif``.
Only the functions that run on gpulayer are kept (5 here); the others are counted in
tests/trainer/lightning_suite/README.md.
"""

from copy import deepcopy
from unittest.mock import DEFAULT, Mock, patch
import torch
from torch.optim import SGD, Adam, Optimizer
from gpulayer.trainer import Trainer, seed_everything
from gpulayer.trainer.core.optimizer import LightningOptimizer
from gpulayer.trainer.demos.boring_classes import BoringModel
from tests.trainer.lightning_suite.runif import RunIf


def test_lightning_optimizer(tmp_path):
    """Test that optimizer are correctly wrapped by our LightningOptimizer."""

    class TestModel(BoringModel):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1)
            lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
            return [optimizer], [lr_scheduler]

    model = TestModel()
    trainer = Trainer(
        default_root_dir=tmp_path, limit_train_batches=1, limit_val_batches=1, max_epochs=1, enable_model_summary=False
    )
    trainer.fit(model)

    lightning_opt = model.optimizers()
    assert str(lightning_opt) == "Lightning" + str(lightning_opt.optimizer)


def test_state():
    model = torch.nn.Linear(3, 4)
    optimizer = torch.optim.Adam(model.parameters())
    lightning_optimizer = LightningOptimizer(optimizer)

    # test state
    assert optimizer.state == lightning_optimizer.state
    lightning_optimizer.state = optimizer.state
    assert optimizer.state == lightning_optimizer.state

    # test param_groups
    assert optimizer.param_groups == lightning_optimizer.param_groups
    lightning_optimizer.param_groups = optimizer.param_groups
    assert optimizer.param_groups == lightning_optimizer.param_groups

    # test defaults
    assert optimizer.defaults == lightning_optimizer.defaults
    lightning_optimizer.defaults = optimizer.defaults
    assert optimizer.defaults == lightning_optimizer.defaults

    assert isinstance(lightning_optimizer, LightningOptimizer)
    assert isinstance(lightning_optimizer, Adam)
    assert isinstance(lightning_optimizer, Optimizer)

    assert optimizer.state_dict() == lightning_optimizer.state_dict()


def test_state_mutation():
    model = torch.nn.Linear(3, 4)
    optimizer0 = torch.optim.Adam(model.parameters(), lr=0.1)
    lightning_optimizer0 = LightningOptimizer(optimizer0)

    optimizer0.param_groups[0]["lr"] = 1.0
    assert lightning_optimizer0.param_groups[0]["lr"] == 1.0

    # Load state into the unwrapped optimizer
    state_dict0 = deepcopy(optimizer0.state_dict())
    optimizer1 = torch.optim.Adam(model.parameters(), lr=100)
    lightning_optimizer1 = LightningOptimizer(optimizer1)
    optimizer1.load_state_dict(state_dict0)
    assert lightning_optimizer1.param_groups[0]["lr"] == 1.0

    # Load state into wrapped optimizer
    optimizer2 = torch.optim.Adam(model.parameters(), lr=100)
    lightning_optimizer2 = LightningOptimizer(optimizer2)
    lightning_optimizer2.load_state_dict(state_dict0)
    assert lightning_optimizer2.param_groups[0]["lr"] == 1.0


class OptimizerWithHooks(Optimizer):
    def __init__(self, model):
        self._fwd_handles = []
        self._bwd_handles = []
        self.params = []
        for _, mod in model.named_modules():
            mod_class = mod.__class__.__name__
            if mod_class != "Linear":
                continue

            handle = mod.register_forward_pre_hook(self._save_input)  # save the inputs
            self._fwd_handles.append(handle)  # collect forward-save-input hooks in list
            handle = mod.register_backward_hook(self._save_grad_output)  # save the gradients
            self._bwd_handles.append(handle)  # collect backward-save-grad hook in list

            # save the parameters
            params = [mod.weight]
            if mod.bias is not None:
                params.append(mod.bias)

            # save a param_group for each module
            d = {"params": params, "mod": mod, "layer_type": mod_class}
            self.params.append(d)

        super().__init__(self.params, {"lr": 0.01})

    def _save_input(self, mod, i):
        """Saves input of layer."""
        if mod.training:
            self.state[mod]["x"] = i[0]

    def _save_grad_output(self, mod, _, grad_output):
        """Saves grad on output of layer to grad is scaled with batch_size since gradient is spread over samples in
        mini batch."""
        batch_size = grad_output[0].shape[0]
        if mod.training:
            self.state[mod]["grad"] = grad_output[0] * batch_size

    def step(self, closure=None):
        closure()
        for group in self.param_groups:
            _ = self.state[group["mod"]]["x"]
            _ = self.state[group["mod"]]["grad"]
        return True


def test_lightning_optimizer_keeps_hooks():
    model = BoringModel()
    optimizer = OptimizerWithHooks(model)
    lightning_optimizer = LightningOptimizer(optimizer)
    assert len(optimizer._fwd_handles) == 1
    del lightning_optimizer
    assert len(optimizer._fwd_handles) == 1


def test_params_groups_and_state_are_accessible(tmp_path):
    class TestModel(BoringModel):
        def on_train_start(self):
            # Update the learning rate manually on the unwrapped optimizer
            assert not isinstance(self.trainer.optimizers[0], LightningOptimizer)
            self.trainer.optimizers[0].param_groups[0]["lr"] = 2.0

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            assert opt.param_groups[0]["lr"] == 2.0

            loss = self.step(batch)
            self.__loss = loss
            return loss

        def configure_optimizers(self):
            return SGD(self.layer.parameters(), lr=0.1)

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure, **__):
            # check attributes are accessible
            assert all("lr" in pg for pg in optimizer.param_groups)
            assert optimizer.state is optimizer._optimizer.state
            assert optimizer.defaults is optimizer._optimizer.defaults

            loss = optimizer.step(closure=optimizer_closure)
            # the optimizer step still returns the loss
            assert loss == self.__loss

    model = TestModel()
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, limit_train_batches=1, limit_val_batches=0)
    trainer.fit(model)
