"""``self.log`` as Lightning documents it: key names, where values go, when, and what is refused.

Most tests run the same small module under ``gpulayer.trainer`` and under
``lightning.pytorch`` (2.6) and compare what each trainer shows: ``logged_metrics``,
``callback_metrics``, ``progress_bar_metrics`` and the calls a logger received.
"""

from __future__ import annotations

import importlib
import re
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import gpulayer.trainer as gl
from gpulayer.trainer.errors import MisconfigurationException

pl = pytest.importorskip("lightning.pytorch")


def _pkg(name: str):
    """(package, boring_classes) of gpulayer.trainer or lightning.pytorch."""
    return importlib.import_module(name), importlib.import_module(f"{name}.demos.boring_classes")


def _memory_logger(pkg):
    """A logger that keeps every ``log_metrics`` call as (step, {name: float})."""
    base = pkg.loggers.Logger

    class MemoryLogger(base):
        def __init__(self):
            self.rows: list[tuple[int, dict]] = []

        name = property(lambda self: "memory")
        version = property(lambda self: 7)
        save_dir = property(lambda self: None)
        log_dir = property(lambda self: None)
        root_dir = property(lambda self: None)

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, {k: float(v) for k, v in metrics.items()}))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

        def save(self):
            pass

        def finalize(self, status):
            pass

    return MemoryLogger()


def _trainer(pkg, logger=None, **kw):
    args = dict(max_epochs=1, limit_train_batches=4, limit_val_batches=3, num_sanity_val_steps=0,
                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                logger=logger if logger is not None else False, log_every_n_steps=1)
    args.update(kw)
    return pkg.Trainer(**args)


def _as_floats(d: dict) -> dict:
    return {k: round(float(v), 5) for k, v in d.items()}


def _run_both(build, stage="fit", with_logger=True, **trainer_kw):
    """Build a model with ``build(pkg, boring)`` under both packages, run ``stage``; return per package
    (trainer, logger rows, stage output)."""
    out = {}
    for name in ("gpulayer.trainer", "lightning.pytorch"):
        pkg, boring = _pkg(name)
        pkg.seed_everything(3)
        model = build(pkg, boring)
        logger = _memory_logger(pkg) if with_logger else None
        trainer = _trainer(pkg, logger, **trainer_kw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = getattr(trainer, stage)(model)
        out[name] = (trainer, logger.rows if logger is not None else None, result)
    return out["gpulayer.trainer"], out["lightning.pytorch"]


def _step_epoch_model(pkg, boring):
    class Model(boring.BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("a", float(batch_idx), on_step=True, on_epoch=True, prog_bar=True)
            self.log("b", float(batch_idx) * 2, reduce_fx="max")
            self.log("c", float(batch_idx) / 3, on_step=False, on_epoch=True, logger=False)
            return out

        def validation_step(self, batch, batch_idx):
            self.log("v", float(batch_idx) + 1, on_step=True, prog_bar=True)

    return Model()


def test_logged_and_callback_metrics_are_tensors_with_lightnings_keys_and_values():
    (g, g_rows, _), (lt, l_rows, _) = _run_both(_step_epoch_model)
    assert all(isinstance(v, torch.Tensor) for v in g.logged_metrics.values())
    assert all(isinstance(v, torch.Tensor) for v in g.callback_metrics.values())
    assert all(isinstance(v, float) for v in g.progress_bar_metrics.values())
    assert _as_floats(g.logged_metrics) == _as_floats(lt.logged_metrics)
    assert _as_floats(g.callback_metrics) == _as_floats(lt.callback_metrics)
    assert _as_floats(g.progress_bar_metrics) == _as_floats(lt.progress_bar_metrics)


def test_eval_on_step_values_go_to_the_logger_per_batch_and_never_into_training_rows():
    (g, g_rows, _), (lt, l_rows, _) = _run_both(_step_epoch_model, max_epochs=2)
    assert [(s, _as_floats(m)) for s, m in g_rows] == [(s, _as_floats(m)) for s, m in l_rows]
    val_rows = [m for _, m in g_rows if "v_step" in m]
    assert len(val_rows) == 6 and all("epoch" not in m for m in val_rows)  # eval step rows: no epoch column
    # their step is the eval batch count, continuing across the fit's validation runs
    assert [s for s, m in g_rows if "v_step" in m] == [0, 1, 2, 3, 4, 5]
    assert not any("v_step" in m and "a_step" in m for _, m in g_rows)


def _two_loader_model(pkg, boring):
    class Model(boring.BoringModel):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("x", float(dataloader_idx + 1) * (batch_idx + 1), on_step=True)
            self.log(f"only_{dataloader_idx}", 10.0 + dataloader_idx, add_dataloader_idx=False)

        def on_validation_epoch_end(self):
            self.log("shared", 5.0)

        def val_dataloader(self):
            return [DataLoader(boring.RandomDataset(32, 8), batch_size=4) for _ in range(2)]

    return Model()


def test_several_loaders_suffix_comes_after_step_or_epoch_and_unsuffixed_names_stay_with_their_loader():
    (g, g_rows, g_res), (lt, l_rows, l_res) = _run_both(_two_loader_model, stage="validate")
    assert "x_step/dataloader_idx_0" in g.logged_metrics and "x_epoch/dataloader_idx_1" in g.logged_metrics
    assert _as_floats(g.logged_metrics) == _as_floats(lt.logged_metrics)
    assert _as_floats(g.callback_metrics) == _as_floats(lt.callback_metrics)
    assert g_res == l_res
    assert "only_1" not in g_res[0] and "only_0" not in g_res[1] and g_res[0]["shared"] == 5.0
    assert [(s, _as_floats(m)) for s, m in g_rows] == [(s, _as_floats(m)) for s, m in l_rows]


def test_the_same_unsuffixed_name_from_two_loaders_is_refused_as_lightning_does():
    def build(pkg, boring):
        class Model(boring.BoringModel):
            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                self.log("same", 1.0, add_dataloader_idx=False)

            def val_dataloader(self):
                return [DataLoader(boring.RandomDataset(32, 8), batch_size=4) for _ in range(2)]
        return Model()

    for pkg in (gl, pl):
        trainer = _trainer(pkg)
        with pytest.raises(Exception, match=re.escape("self.log(same, ...)` twice in `validation_step`")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                trainer.validate(build(pkg, _pkg(pkg.__name__)[1]))


@pytest.mark.parametrize("reduce_fx", ["mean", "avg", "sum", "max", "min", "MAX", torch.mean, torch.sum, torch.max,
                                       torch.min, sum, max, min])
def test_reduce_fx_accepts_what_lightning_accepts_and_reduces_the_same(reduce_fx):
    def build(pkg, boring):
        class Model(boring.BoringModel):
            def training_step(self, batch, batch_idx):
                self.log("r", float((batch_idx * 7) % 5), on_step=False, on_epoch=True, reduce_fx=reduce_fx)
                return super().training_step(batch, batch_idx)
        return Model()

    (g, _, _), (lt, _, _) = _run_both(build, with_logger=False)
    assert float(g.callback_metrics["r"]) == pytest.approx(float(lt.callback_metrics["r"]))


@pytest.mark.parametrize("reduce_fx", [torch.argmax, "median", lambda x: x])
def test_reduce_fx_refuses_custom_reductions_with_lightnings_message(reduce_fx):
    class Model(_pkg("gpulayer.trainer")[1].BoringModel):
        def training_step(self, batch, batch_idx):
            self.log("r", 1.0, reduce_fx=reduce_fx)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match=r"reduce_fx={min,max,mean,sum}\)` are supported"):
        _trainer(gl).fit(Model())


def _fit_logging(hook: str, value=1.0, **log_kw):
    """Fit a BoringModel whose ``hook`` calls self.log("k", value, **log_kw)."""
    boring = _pkg("gpulayer.trainer")[1]

    def logging_hook(self, *args, **kwargs):
        self.log("k", value, **log_kw)
        return getattr(boring.BoringModel, hook)(self, *args, **kwargs)

    logging_hook.__name__ = logging_hook.__qualname__ = hook
    logging_hook.__code__ = logging_hook.__code__.replace(co_name=hook)
    model = type("Model", (boring.BoringModel,), {hook: logging_hook})()
    trainer = _trainer(gl, limit_train_batches=1, limit_val_batches=1)
    trainer.fit(model)
    return trainer


@pytest.mark.parametrize("hook", ["on_fit_start", "on_train_end", "configure_optimizers", "on_validation_end",
                                  "setup"])
def test_logging_in_a_hook_lightning_forbids_names_the_hook(hook):
    with pytest.raises(MisconfigurationException, match=re.escape(f"You can't `self.log()` inside `{hook}`")):
        _fit_logging(hook)


def test_step_level_values_are_refused_in_epoch_hooks():
    with pytest.raises(MisconfigurationException,
                       match=re.escape("You can't `self.log(on_step=True)` inside `on_train_epoch_end`")):
        _fit_logging("on_train_epoch_end", on_step=True)


def test_neither_on_step_nor_on_epoch_is_refused():
    with pytest.raises(MisconfigurationException, match=re.escape("`self.log(on_step=False, on_epoch=False)` is not")):
        _fit_logging("training_step", on_step=False, on_epoch=False)


@pytest.mark.parametrize("value", [None, "foo", [1, 2], {"a": 1}, torch.tensor([1.0, 2.0])])
def test_values_that_are_not_scalars_are_refused_naming_the_call(value):
    with pytest.raises(ValueError, match=re.escape("`self.log(k, ")):
        _fit_logging("training_step", value=value)


def test_the_same_name_logged_twice_in_a_hook_with_other_options_is_refused():
    boring = _pkg("gpulayer.trainer")[1]

    class Model(boring.BoringModel):
        def training_step(self, batch, batch_idx):
            self.log("foo", 1.0)
            self.log("foo", 1.0, prog_bar=True)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match=re.escape("self.log(foo, ...)` twice in `training_step`")):
        _trainer(gl).fit(Model())


def test_a_dataloader_suffix_in_the_name_is_refused_when_the_trainer_adds_it():
    with pytest.raises(MisconfigurationException, match="`self.log` with the key `k/dataloader_idx_0`"):
        boring = _pkg("gpulayer.trainer")[1]

        class Model(boring.BoringModel):
            def training_step(self, batch, batch_idx):
                self.log("k/dataloader_idx_0", 1.0)
                return super().training_step(batch, batch_idx)

        _trainer(gl).fit(Model())


def test_integer_values_are_logged_as_floats_with_lightnings_warning():
    with pytest.warns(UserWarning, match="the value needs to be floating to be reduced"):
        trainer = _fit_logging("training_step", value=torch.tensor(3))
    assert trainer.callback_metrics["k"].dtype == torch.float32


def test_sync_dist_group_without_sync_dist_is_refused():
    with pytest.raises(MisconfigurationException, match="sync_dist=True"):
        _fit_logging("training_step", sync_dist_group=object())


def test_metric_attribute_for_a_plain_value_is_refused():
    with pytest.raises(MisconfigurationException, match="drop metric_attribute"):
        _fit_logging("training_step", metric_attribute="layer")


def test_sync_dist_reduces_across_ranks_and_rank_zero_only_skips_it():
    from gpulayer.trainer.metrics import MetricStore

    calls = []

    def reduce(t, op):
        calls.append(op)
        return t * 2

    store = MetricStore(reduce)
    def training_step():  # the hook name decides the defaults
        store.log("training_step", "synced", torch.tensor(1.0), False, None, None, True, "mean", False, True, None,
                  True, 1, None, False)
        store.log("training_step", "local", torch.tensor(1.0), False, None, None, True, "mean", False, True, None,
                  True, 1, None, True)
    training_step()
    logged = store.step_metrics("train")
    assert logged == {"synced_step": 2.0, "local_step": 1.0}
    epoch = store.reduce_epoch("train")
    assert epoch == {"synced_epoch": 1.0, "local_epoch": 1.0}  # mean: sum and count reduced alike
    assert calls.count("sum") == 2


def test_enable_graph_keeps_the_step_values_graph_as_documented():
    # Lightning 2.6 documents enable_graph ("will not auto-detach the graph") but detaches anyway;
    # gpulayer does what the documentation says.
    seen = {}
    boring = _pkg("gpulayer.trainer")[1]

    class Model(boring.BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("g", out["loss"], enable_graph=True)
            self.log("d", out["loss"])
            seen["g"] = self.trainer.callback_metrics["g"].requires_grad
            seen["d"] = self.trainer.callback_metrics["d"].requires_grad
            return out

    _trainer(gl, limit_train_batches=1).fit(Model())
    assert seen == {"g": True, "d": False}


def test_callbacks_log_with_self_log_as_in_lightning():
    def build(pkg, boring):
        return boring.BoringModel()

    results = []
    for pkg in (gl, pl):
        class LoggingCallback(pkg.Callback):
            def on_train_epoch_start(self, trainer, pl_module):
                self.log("cb_epoch_start", 2.0)

            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                self.log("cb_batch", float(batch_idx))

            def on_validation_epoch_end(self, trainer, pl_module):
                pl_module.log("cb_val", 4.0)

        trainer = _trainer(pkg, callbacks=[LoggingCallback()])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(build(pkg, _pkg(pkg.__name__)[1]))
        results.append(_as_floats(trainer.callback_metrics))
    assert results[0] == results[1]
    assert results[0]["cb_batch"] == 3.0


def test_progress_bar_get_metrics_has_v_num_and_the_prog_bar_values():
    from gpulayer.trainer.callbacks import TQDMProgressBar

    (g, _, _), (lt, _, _) = _run_both(_step_epoch_model)
    bar = TQDMProgressBar()
    got = bar.get_metrics(g, g.lightning_module)
    want = pl.callbacks.TQDMProgressBar().get_metrics(lt, lt.lightning_module)
    assert got["v_num"] == 7
    assert _as_floats(got) == _as_floats(want)


def test_sanity_check_values_are_discarded():
    def build(pkg, boring):
        class Model(boring.BoringModel):
            def validation_step(self, batch, batch_idx):
                if self.trainer.sanity_checking:
                    self.log("sanity_only", 1.0, prog_bar=True)
        return Model()

    (g, g_rows, _), (lt, l_rows, _) = _run_both(build, num_sanity_val_steps=2, limit_val_batches=2)
    assert "sanity_only" not in g.callback_metrics and "sanity_only" not in g.progress_bar_metrics
    assert g_rows == l_rows


def _lr_model(pkg, boring):
    """Manual optimization over three optimizers: names by class, by count, by parameter group and by scheduler."""
    class Model(boring.BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.extra = torch.nn.Linear(32, 2)

        def training_step(self, batch, batch_idx):
            opts = self.optimizers()
            loss = self.step(batch) + self.extra(batch).sum() * 0
            for opt in opts:
                opt.zero_grad()
            self.manual_backward(loss)
            for opt in opts:
                opt.step()
            for sched in self.lr_schedulers():
                sched.step()

        def configure_optimizers(self):
            sgd = torch.optim.SGD(self.layer.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
            adam = torch.optim.Adam([{"params": [self.extra.weight], "name": "w"}, {"params": [self.extra.bias]}],
                                    lr=0.01)
            sgd2 = torch.optim.SGD(self.extra.parameters(), lr=0.5)
            step = {"scheduler": torch.optim.lr_scheduler.StepLR(sgd, 1, gamma=0.5), "interval": "step"}
            named = {"scheduler": torch.optim.lr_scheduler.StepLR(adam, 1, gamma=0.9), "name": "my_lr"}
            return [sgd, adam, sgd2], [step, named]

    return Model()


@pytest.mark.parametrize("interval", [None, "step", "epoch"])
def test_lr_monitor_names_values_and_intervals_match_lightning(interval):
    got = []
    for name in ("gpulayer.trainer", "lightning.pytorch"):
        pkg, boring = _pkg(name)
        pkg.seed_everything(3)
        monitor = pkg.callbacks.LearningRateMonitor(logging_interval=interval, log_momentum=True,
                                                    log_weight_decay=True)
        logger = _memory_logger(pkg)
        trainer = _trainer(pkg, logger, callbacks=[monitor], max_epochs=2, limit_val_batches=0, log_every_n_steps=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(_lr_model(pkg, boring))
        lr_rows = [(s, _as_floats(m)) for s, m in logger.rows if any(k.startswith(("lr-", "my_lr")) for k in m)]
        lr_callback = {k: round(float(v), 6) for k, v in trainer.callback_metrics.items() if "lr" in k}
        got.append((monitor.lrs, monitor.last_momentum_values, monitor.last_weight_decay_values, lr_rows, lr_callback))
    assert set(got[0][0]) == {"lr-SGD", "my_lr/w", "my_lr/pg2", "lr-SGD-1"}
    assert got[0] == got[1]


def test_lr_monitor_values_reach_callback_metrics_so_early_stopping_can_monitor_them():
    boring = _pkg("gpulayer.trainer")[1]

    class Model(boring.BoringModel):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.1)]

    stop = gl.EarlyStopping(monitor="lr-SGD", mode="max", patience=0)
    trainer = _trainer(gl, _memory_logger(gl), callbacks=[gl.LearningRateMonitor(), stop], max_epochs=5,
                       limit_val_batches=0)
    trainer.fit(Model())
    assert trainer.current_epoch < 5 and stop.stopped_epoch > 0  # the lr fell: no improvement, stopped
    assert float(trainer.callback_metrics["lr-SGD"]) == pytest.approx(0.1 ** trainer.current_epoch, rel=1e-5)


def test_lr_monitor_without_a_logger_is_refused():
    boring = _pkg("gpulayer.trainer")[1]
    with pytest.raises(MisconfigurationException, match="Cannot use `LearningRateMonitor` callback with `Trainer` that"):
        _trainer(gl, callbacks=[gl.LearningRateMonitor()]).fit(boring.BoringModel())


def test_lr_monitor_duplicate_parameter_group_names_are_refused():
    boring = _pkg("gpulayer.trainer")[1]

    class Model(boring.BoringModel):
        def configure_optimizers(self):
            return torch.optim.SGD([{"params": [self.layer.weight], "name": "g"},
                                    {"params": [self.layer.bias], "name": "g"}], lr=0.1)

    with pytest.raises(MisconfigurationException, match="duplicated parameter group names"):
        _trainer(gl, _memory_logger(gl), callbacks=[gl.LearningRateMonitor()]).fit(Model())


def test_fit_then_test_logger_rows_match_lightning():
    def build(pkg, boring):
        class Model(boring.BoringModel):
            def training_step(self, batch, batch_idx):
                self.log("t", float(batch_idx), on_epoch=True)
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx):
                self.log("v", float(batch_idx), on_step=True)

            def test_step(self, batch, batch_idx):
                self.log("te", float(batch_idx) * 3, on_step=True, prog_bar=True)

        return Model()

    rows = []
    for name in ("gpulayer.trainer", "lightning.pytorch"):
        pkg, boring = _pkg(name)
        pkg.seed_everything(3)
        logger = _memory_logger(pkg)
        trainer = _trainer(pkg, logger, max_epochs=2, limit_test_batches=2)
        model = build(pkg, boring)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(model)
            result = trainer.test(model)
        rows.append(([(s, _as_floats(m)) for s, m in logger.rows], result, _as_floats(trainer.callback_metrics),
                     _as_floats(trainer.logged_metrics)))
    assert rows[0] == rows[1]


def test_a_logged_torchmetrics_metric_gives_lightnings_step_and_epoch_values():
    torchmetrics = pytest.importorskip("torchmetrics")

    def build(pkg, boring):
        class Model(boring.BoringModel):
            def __init__(self):
                super().__init__()
                self.acc = torchmetrics.classification.BinaryAccuracy()

            def validation_step(self, batch, batch_idx):
                preds = (torch.arange(4) + batch_idx) % 2
                target = torch.tensor([0, 1, 1, 1])
                self.acc(preds, target)
                self.log("acc", self.acc, on_step=True, on_epoch=True)

        return Model()

    (g, g_rows, _), (lt, l_rows, _) = _run_both(build, max_epochs=2)
    assert _as_floats(g.callback_metrics) == _as_floats(lt.callback_metrics)
    assert [(s, _as_floats(m)) for s, m in g_rows] == [(s, _as_floats(m)) for s, m in l_rows]


def test_logging_in_predict_is_refused_as_lightning_does():
    boring = _pkg("gpulayer.trainer")[1]

    class Model(boring.BoringModel):
        def predict_step(self, batch, batch_idx):
            self.log("p", 1.0)
            return batch

    with pytest.raises(MisconfigurationException, match="trying to log in a `predict` hook"):
        _trainer(gl, limit_predict_batches=1).predict(Model(), DataLoader(boring.RandomDataset(32, 4)))


def test_a_callback_pickled_after_a_run_leaves_the_modules_log_behind():
    import pickle

    from gpulayer.trainer.callbacks import TQDMProgressBar

    boring = _pkg("gpulayer.trainer")[1]
    cb, bar = gl.Callback(), TQDMProgressBar()
    _trainer(gl, callbacks=[cb, bar], limit_train_batches=1, enable_progress_bar=True).fit(boring.BoringModel())
    assert cb.log.__self__ is not None and bar.trainer is not None
    copy, bar_copy = pickle.loads(pickle.dumps(cb)), pickle.loads(pickle.dumps(bar))
    assert not hasattr(copy, "log") and bar_copy._trainer is None


class _RecordingStore:
    """Stands in for the Trainer's metric store: keeps the arguments ``self.log`` hands it."""

    PREDICT = object()
    context = None

    def __init__(self):
        self.calls = []

    def log(self, fx, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
            sync_dist_group, add_dataloader_idx, batch_size, metric, rank_zero_only):
        self.calls.append({"name": name, "value": value, "enable_graph": enable_graph, "sync_dist": sync_dist,
                           "sync_dist_group": sync_dist_group, "rank_zero_only": rank_zero_only})


@pytest.mark.parametrize("through", ["log", "log_dict"])
def test_log_and_log_dict_hand_every_flag_to_the_store(through):
    boring = _pkg("gpulayer.trainer")[1]
    model, store, group = boring.BoringModel(), _RecordingStore(), object()
    model._metric_store = store
    value = torch.ones((), requires_grad=True) * 2
    flags = dict(enable_graph=True, sync_dist=True, sync_dist_group=group, rank_zero_only=True)
    if through == "log":
        model.log("k", value, **flags)
    else:
        model.log_dict({"k": value}, **flags)
    (call,) = store.calls
    assert call["enable_graph"] is True and call["sync_dist"] is True and call["rank_zero_only"] is True
    assert call["sync_dist_group"] is group
    assert call["value"].requires_grad  # enable_graph: the module hands the value on with its graph


def test_sync_dist_group_is_the_process_group_the_value_is_reduced_over(monkeypatch):
    import torch.distributed as dist

    from gpulayer.trainer.metrics import MetricStore

    group, seen, default_reduce = object(), [], []

    def all_reduce(tensor, op=None, group=None):
        seen.append(group)
        tensor.mul_(3)  # three ranks in the group, each holding the same value

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    store = MetricStore(lambda t, op: default_reduce.append(op) or t * 2)  # the whole world: two ranks

    def training_step():
        store.log("training_step", "k", torch.tensor(1.0), False, None, True, True, "sum", False, True, group,
                  True, 1, None, False)

    training_step()
    assert store.step_metrics("train") == {"k_step": 3.0}
    assert store.reduce_epoch("train") == {"k_epoch": 3.0}
    assert seen == [group, group] and default_reduce == []  # the named group, never the whole world


def test_rank_zero_only_values_are_not_reduced_in_a_module_either():
    boring = _pkg("gpulayer.trainer")[1]
    from gpulayer.trainer.metrics import MetricStore

    calls = []
    store = MetricStore(lambda t, op: calls.append(op) or t * 2)
    model = boring.BoringModel()
    model._metric_store = store

    def training_step():  # the hook name decides the defaults
        model.log("local", 1.0, sync_dist=True, rank_zero_only=True, on_epoch=True)
        model.log("synced", 1.0, sync_dist=True, on_epoch=True)

    training_step()
    assert store.step_metrics("train") == {"local_step": 1.0, "synced_step": 2.0}
    assert calls == ["mean"]


def _metric_model(boring, torchmetrics, attribute):
    class Model(boring.BoringModel):
        def __init__(self):
            super().__init__()
            self.acc = torchmetrics.classification.BinaryAccuracy()
            self.unregistered = [torchmetrics.classification.BinaryAccuracy()]  # a list: not a submodule

        def training_step(self, batch, batch_idx):
            metric = self.acc if attribute != "unregistered" else self.unregistered[0]
            metric(torch.tensor([1, 0]), torch.tensor([1, 1]))
            if attribute in (None, "unregistered"):
                self.log("acc", metric)
            else:
                self.log("acc", metric, metric_attribute=attribute)
            return super().training_step(batch, batch_idx)

    return Model()


def test_metric_attribute_names_the_attribute_holding_the_logged_metric():
    torchmetrics = pytest.importorskip("torchmetrics")
    boring = _pkg("gpulayer.trainer")[1]
    trainer = _trainer(gl, limit_train_batches=1, limit_val_batches=0)
    trainer.fit(_metric_model(boring, torchmetrics, "acc"))
    assert float(trainer.callback_metrics["acc"]) == 0.5
    with pytest.raises(MisconfigurationException, match=r"metric_attribute='layer'.*no attribute 'layer' holding"):
        _trainer(gl, limit_train_batches=1, limit_val_batches=0).fit(_metric_model(boring, torchmetrics, "layer"))
    with pytest.raises(MisconfigurationException, match=r"metric_attribute=name\)` where `name` is one of \['acc'\]"):
        _trainer(gl, limit_train_batches=1, limit_val_batches=0).fit(
            _metric_model(boring, torchmetrics, "unregistered"))
