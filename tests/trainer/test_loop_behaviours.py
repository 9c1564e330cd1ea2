"""Loop behaviours a Lightning user relies on, each checked under gpulayer and (when installed) Lightning 2.6.6.

Steps that take ``dataloader_iter``, a ``training_step`` without ``batch_idx``, ``None`` from the step or
the loader, epochs cut short, warnings at the start of training, stateful loaders across a resume, and
the ``Closure`` of automatic optimization.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from tests.trainer.twin import QUIET, both, gpulayer_ns, loader, needs_lightning


def _model(L, **methods):
    """A small regression module on ``L``'s base class, with ``methods`` added to it."""

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 1)
            self.seen: list = []

        def training_step(self, batch, batch_idx):
            return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    for name, fn in methods.items():
        setattr(Net, name, fn)
    return Net()


def _quiet_warnings():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore")
    return ctx


# -- dataloader_iter -------------------------------------------------------------------------------------
def _fit_with_dataloader_iter(L):
    def training_step(self, dataloader_iter):
        taken = []
        for _ in range(2):  # two micro-batches per step
            try:
                batch, batch_idx, dl_idx = next(dataloader_iter)
            except StopIteration:
                break
            taken.append((batch_idx, dl_idx))
        self.seen.append(("step", taken))
        return self.layer(batch[0]).sum()

    def on_train_batch_start(self, batch, batch_idx):
        self.seen.append(("start", batch is None, batch_idx))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(("end", batch_idx))

    model = _model(L, training_step=training_step, on_train_batch_start=on_train_batch_start,
                   on_train_batch_end=on_train_batch_end)
    ctx = _quiet_warnings()
    try:
        trainer = L.Trainer(max_epochs=1, limit_train_batches=6, enable_checkpointing=False, **QUIET)
        trainer.fit(model, loader(rows=32, batch_size=4))
    finally:
        ctx.__exit__(None, None, None)
    return model.seen, trainer.global_step


@needs_lightning
def test_training_step_with_dataloader_iter_pulls_its_batches_until_the_limit():
    seen, steps = both(_fit_with_dataloader_iter)
    assert [s for s in seen if s[0] == "step"][0] == ("step", [(0, 0), (1, 0)])
    assert steps == 3  # six batches, two per step


def _eval_with_dataloader_iter(L, stage):
    def step(self, dataloader_iter):
        batch, batch_idx, dl_idx = next(dataloader_iter)
        self.seen.append(("step", batch_idx, dl_idx))
        return batch_idx

    def batch_start(self, batch, batch_idx, dataloader_idx):
        self.seen.append(("start", batch_idx, dataloader_idx))

    def batch_end(self, outputs, batch, batch_idx, dataloader_idx):
        self.seen.append(("end", outputs, batch_idx, dataloader_idx))

    prefix = {"validate": "validation", "predict": "predict"}[stage]
    model = _model(L, **{f"{prefix}_step": step, f"on_{prefix}_batch_start": batch_start,
                         f"on_{prefix}_batch_end": batch_end})
    ctx = _quiet_warnings()
    try:
        trainer = L.Trainer(limit_val_batches=2, limit_predict_batches=2, **QUIET)
        out = getattr(trainer, stage)(model, [loader(rows=12), loader(rows=12)])
    finally:
        ctx.__exit__(None, None, None)
    return model.seen, out if stage == "predict" else None


@needs_lightning
@pytest.mark.parametrize("stage", ["validate", "predict"])
def test_eval_steps_with_dataloader_iter_read_the_loaders_one_after_another(stage):
    seen, predictions = both(_eval_with_dataloader_iter, stage)
    assert [s[1:] for s in seen if s[0] == "step"] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    if stage == "predict":
        assert predictions == [[0, 1], [0, 1]]


# -- how the step is called ---------------------------------------------------------------------------------
def _no_batch_idx(L):
    def training_step(self, batch):
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        self.seen.append(batch_idx)
        optimizer.step(closure=optimizer_closure)

    model = _model(L, training_step=training_step, optimizer_step=optimizer_step)
    L.Trainer(max_epochs=1, limit_train_batches=4, accumulate_grad_batches=2, enable_checkpointing=False,
              **QUIET).fit(model, loader())
    return model.seen


@needs_lightning
def test_training_step_without_batch_idx_gets_the_batch_alone_and_still_accumulates():
    assert both(_no_batch_idx) == [1, 3]


def _predict_dataloader_idx(L, default: bool):
    if default:
        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return dataloader_idx
    else:
        def predict_step(self, batch, batch_idx, dataloader_idx):
            return dataloader_idx
    model = _model(L, predict_step=predict_step)
    try:
        return L.Trainer(**QUIET).predict(model, loader(rows=8))
    except RuntimeError as err:
        return str(err)


@needs_lightning
def test_a_required_dataloader_idx_with_one_predict_loader_is_refused():
    message = both(_predict_dataloader_idx, default=False)
    assert "You provided only a single `predict_dataloader`, but have included `dataloader_idx`" in message
    assert both(_predict_dataloader_idx, default=True) == [0, 0]


# -- None from the step or the loader ---------------------------------------------------------------------
class _Batches:
    """A sized iterable of given batches (a list would be read as several loaders)."""

    def __init__(self, batches: list):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def _none_outputs(L, from_loader: bool):
    def training_step(self, batch, batch_idx):
        if not from_loader and batch_idx % 2 == 0:
            return None
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append((batch_idx, outputs is None or outputs == {}, batch is None))

    model = _model(L, training_step=training_step, on_train_batch_end=on_train_batch_end)
    data = loader(rows=16)
    if from_loader:
        data = _Batches([None if i % 2 == 0 else b for i, b in enumerate(data)])
    if L.name == "lightning":
        from lightning.pytorch.loops.optimization.automatic import Closure
    else:
        from gpulayer.trainer.loops import Closure
    Closure.warning_cache.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = L.Trainer(max_epochs=1, enable_checkpointing=False, **QUIET)
        trainer.fit(model, data)
    texts = sorted({str(w.message) for w in caught if "None" in str(w.message)})
    return model.seen, trainer.global_step, texts


@needs_lightning
def test_a_step_returning_none_is_skipped_with_one_warning():
    seen, steps, texts = both(_none_outputs, from_loader=False)
    assert texts == ["`training_step` returned `None`. If this was on purpose, ignore this warning..."]
    assert [s[1] for s in seen] == [True, False, True, False]


@needs_lightning
def test_a_loader_yielding_none_skips_the_step_with_one_warning():
    seen, steps, texts = both(_none_outputs, from_loader=True)
    assert texts == ["train_dataloader yielded None. If this was on purpose, ignore this warning..."]
    assert seen == [(0, True, True), (1, False, False), (2, True, True), (3, False, False)]
    assert steps == 2


# -- epochs cut short ----------------------------------------------------------------------------------------
def _cut_short(L, how: str):
    def training_step(self, batch, batch_idx):
        if how == "should_stop" and batch_idx == 1:
            self.trainer.should_stop = True
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.seen.append((self.trainer.current_epoch, self.trainer.global_step))

    model = _model(L, training_step=training_step, validation_step=validation_step)
    kw = {"max_steps": 2} if how == "max_steps" else {}
    trainer = L.Trainer(max_epochs=3, limit_val_batches=1, num_sanity_val_steps=0, enable_checkpointing=False,
                        **kw, **QUIET)
    trainer.fit(model, loader(), loader())
    return trainer.current_epoch, trainer.global_step, model.seen


@needs_lightning
@pytest.mark.parametrize("how", ["max_steps", "should_stop"])
def test_an_epoch_cut_short_counts_and_should_stop_validates_once_more(how):
    epoch, steps, validations = both(_cut_short, how)
    assert (epoch, steps) == (1, 2)
    assert validations == ([] if how == "max_steps" else [(0, 2)])


# -- warnings at the start of training -----------------------------------------------------------------
def _eval_mode_warning(L, frozen: bool):
    model = _model(L)
    if frozen:
        model.frozen = nn.Linear(2, 2).eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        L.Trainer(max_epochs=1, limit_train_batches=1, enable_checkpointing=False, **QUIET).fit(model, loader())
    return [str(w.message) for w in caught if "eval mode" in str(w.message)]


@needs_lightning
def test_a_module_in_eval_mode_at_fit_start_is_reported():
    assert both(_eval_mode_warning, frozen=False) == []
    assert both(_eval_mode_warning, frozen=True)[0].startswith("Found 1 module(s) in eval mode at the start of training")


class _Counting:
    """An iterable of 6 batches that starts where it was told to; stateful when ``stateful``."""

    def __init__(self, stateful: bool):
        self.index, self.stateful = 0, stateful
        if stateful:
            self.state_dict = lambda: {"index": self.index}
            self.load_state_dict = lambda state: setattr(self, "index", state["index"])

    def __iter__(self):
        while self.index < 6:
            value = self.index
            self.index += 1
            yield torch.full((2, 4), float(value)), torch.zeros(2, 1)

    def __len__(self):
        return 6


def _resume(L, tmp_path, stateful: bool):
    def training_step(self, batch, batch_idx):
        self.seen.append(int(batch[0][0, 0]))
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    first = _model(L, training_step=training_step)
    t1 = L.Trainer(max_steps=2, enable_checkpointing=False, **QUIET)
    t1.fit(first, _Counting(stateful))
    path = str(tmp_path / f"{L.name}.ckpt")
    t1.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    second = _model(L, training_step=training_step)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        L.Trainer(max_steps=4, enable_checkpointing=False, **QUIET).fit(second, _Counting(stateful), ckpt_path=path)
    warned = any("resuming from a checkpoint that ended before the epoch ended" in str(w.message) for w in caught)
    return saved, second.seen, warned


@needs_lightning
def test_a_stateful_loader_is_saved_and_continues_after_a_resume(tmp_path):
    saved, seen, warned = both(_resume, tmp_path, stateful=True)
    assert saved == {"combined_loader": [{"index": 2}]} and seen == [2, 3] and not warned


def test_an_iterable_without_state_warns_on_a_mid_epoch_resume(tmp_path):
    saved, seen, warned = _resume(gpulayer_ns(), tmp_path, stateful=False)
    # gpulayer reads it again and skips forward (Lightning would start it over): the warning says it may differ
    assert saved == {} and seen == [2, 3] and warned


# -- the closure ----------------------------------------------------------------------------------------------
def _closure_calls(closure_cls, result_cls):
    calls = []
    weight = torch.ones(1, requires_grad=True)

    def step():
        calls.append("step")
        return result_cls.from_training_step_output({"loss": (weight * 3).sum(), "extra": 1}, normalize=2)

    closure = closure_cls(step, backward_fn=lambda loss: (calls.append("backward"), loss.backward()),
                          zero_grad_fn=lambda: calls.append("zero_grad"))
    opt = torch.optim.SGD([weight], lr=0.1)
    returned = opt.step(closure)
    result = closure.consume_result()
    try:
        closure.consume_result()
        again = "no error"
    except Exception as err:  # noqa: BLE001 - the type differs by package; the message is compared
        again = str(err)[:34]
    return calls, float(returned), float(result.loss), result.asdict()["extra"], float(weight.grad), again


@needs_lightning
def test_closure_runs_step_zero_grad_backward_and_hands_its_result_once():
    from lightning.pytorch.loops.optimization.automatic import Closure as LClosure, ClosureResult as LResult

    from gpulayer.trainer.loops.optimization.automatic import Closure, ClosureResult
    ours = _closure_calls(Closure, ClosureResult)
    assert ours == _closure_calls(LClosure, LResult)
    assert ours[0] == ["step", "zero_grad", "backward"] and ours[2] == 1.5


def test_combined_loader_takes_a_list_of_plain_values_as_one_iterable():
    from gpulayer.trainer.utilities.combined_loader import CombinedLoader
    assert [b for b, _, _ in CombinedLoader({"a": [0, 1], "b": [2, 3]})] == [{"a": 0, "b": 2}, {"a": 1, "b": 3}]


def _persistent_workers_after_fit(L):
    from torch.utils.data import DataLoader, TensorDataset
    data = DataLoader(TensorDataset(torch.randn(8, 4), torch.randn(8, 1)), batch_size=4, num_workers=1,
                      persistent_workers=True)
    L.Trainer(max_epochs=2, enable_checkpointing=False, **QUIET).fit(_model(L), data)
    return data._iterator is None  # the worker iterator was shut down and dropped


@needs_lightning
def test_persistent_loader_workers_stop_when_the_fit_ends():
    assert both(_persistent_workers_after_fit) is True


def _validate_combined(L, mode):
    import importlib
    combined = importlib.import_module(f"{L.name}{'.pytorch' if L.name == 'lightning' else '.trainer'}"
                                       ".utilities.combined_loader").CombinedLoader

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.seen.append((batch, batch_idx, dataloader_idx))

    model = _model(L, validation_step=validation_step)
    trainer = L.Trainer(**QUIET)
    trainer.validate(model, combined({"a": [0, 1, 2], "b": [3, 4]}, mode))
    return trainer.num_val_batches, model.seen


@needs_lightning
@pytest.mark.parametrize("mode", ["max_size_cycle", "min_size", "max_size", "sequential"])
def test_validation_reads_a_combined_loader_in_its_mode(mode):
    counts, seen = both(_validate_combined, mode)
    assert counts == [3, 2]
    if mode == "max_size":
        assert seen[-1] == ({"a": 2, "b": None}, 2, 0)


def _sanity_counts_after_validate(L):
    trainer = L.Trainer(**QUIET)
    trainer.validate(_model(L, validation_step=lambda self, batch, batch_idx: None), loader())
    return trainer.num_sanity_val_batches, trainer.num_val_batches


@needs_lightning
def test_num_sanity_val_batches_belongs_to_fit_and_stays_empty_after_validate():
    assert both(_sanity_counts_after_validate) == ([], [4])
