"""``LightningCLI`` (gpulayer.trainer.cli): a script run as a user runs it, plus in-process runs with ``args=``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gpulayer.trainer.demos.boring_classes import BoringModel

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpulayer.trainer import LightningDataModule, LightningModule
    from gpulayer.trainer.cli import LightningCLI


    class Model(LightningModule):
        def __init__(self, hidden: int = 8, lr: float = 0.01):
            super().__init__()
            self.save_hyperparameters()
            self.stages = []
            self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))

        def forward(self, x):
            return self.net(x)

        def setup(self, stage):
            self.stages.append(stage)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

        def test_step(self, batch, batch_idx):
            self.log("test_loss", torch.nn.functional.mse_loss(self(batch[0]), batch[1]))

        def predict_step(self, batch, batch_idx):
            return self(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


    class Data(LightningDataModule):
        def __init__(self, batch_size: int = 16, n: int = 64):
            super().__init__()
            self.batch_size = batch_size
            g = torch.Generator().manual_seed(0)
            self.x = torch.randn(n, 4, generator=g)
            self.y = self.x.sum(1, keepdim=True)

        def _loader(self):
            return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)

        train_dataloader = val_dataloader = test_dataloader = predict_dataloader = _loader


    if __name__ == "__main__":
        cli = LightningCLI(Model, Data, trainer_defaults={"enable_model_summary": False})
        t = cli.trainer
        print("RESULT " + json.dumps({
            "subcommand": cli.subcommand, "lr": cli.model.hparams.lr, "hidden": cli.model.hparams.hidden,
            "batch_size": cli.datamodule.batch_size, "epoch": t.current_epoch, "global_step": t.global_step,
            "stages": cli.model.stages, "metrics": sorted(t.callback_metrics), "log_dir": t.log_dir,
        }))
''')


def _run(tmp_path: Path, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=240)


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


needs_jsonargparse = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import jsonargparse"], capture_output=True).returncode != 0
    and not os.environ.get("CI"),
    reason="jsonargparse is not installed (pip install gpulayer[cli])",
)


@needs_jsonargparse
def test_fit_from_the_command_line_writes_config_yaml(tmp_path):
    out = _result(_run(tmp_path, "fit", "--trainer.max_epochs", "1", "--model.lr", "0.1", "--data.batch_size", "32"))
    assert out["subcommand"] == "fit" and out["lr"] == 0.1 and out["batch_size"] == 32
    assert out["epoch"] == 1 and out["global_step"] == 2  # 64 samples / 32 per batch, one epoch
    assert out["stages"] == ["fit"] and "val_loss" in out["metrics"]
    import yaml
    saved = yaml.safe_load(Path(out["log_dir"], "config.yaml").read_text())
    assert saved["model"] == {"hidden": 8, "lr": 0.1}
    assert saved["trainer"]["max_epochs"] == 1 and saved["data"]["batch_size"] == 32
    assert isinstance(saved["seed_everything"], int)  # the seed chosen is recorded, so the run can be repeated


@needs_jsonargparse
def test_config_file_and_command_line_override(tmp_path):
    (tmp_path / "config.yaml").write_text(
        "seed_everything: 7\ntrainer:\n  max_epochs: 2\n  logger: false\nmodel:\n  hidden: 4\n  lr: 0.05\n")
    (tmp_path / "run").mkdir()
    out = _result(_run(tmp_path, "fit", "--config", "config.yaml", "--model.lr", "0.2",
                       "--trainer.default_root_dir", "run"))
    assert out["epoch"] == 2 and out["global_step"] == 8
    assert out["hidden"] == 4 and out["lr"] == 0.2  # later arguments win over the file, as in jsonargparse


@needs_jsonargparse
@pytest.mark.parametrize("subcommand, metric", [("validate", "val_loss"), ("test", "test_loss"), ("predict", None)])
def test_validate_test_predict_subcommands(tmp_path, subcommand, metric):
    out = _result(_run(tmp_path, subcommand, "--trainer.logger", "false", "--model.hidden", "4"))
    assert out["subcommand"] == subcommand and out["stages"] == [subcommand] and out["global_step"] == 0
    if metric:
        assert metric in out["metrics"]
    assert (tmp_path / "config.yaml").is_file()  # no logger: the log dir is default_root_dir, as Lightning's


@needs_jsonargparse
def test_help_exits_zero_and_lists_subcommands(tmp_path):
    proc = _run(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    assert all(name in proc.stdout for name in ("fit", "validate", "test", "predict"))
    proc = _run(tmp_path, "fit", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--trainer.max_epochs" in proc.stdout and "--model.lr" in proc.stdout and "--data.batch_size" in proc.stdout


@needs_jsonargparse
def test_a_typo_exits_nonzero_with_jsonargparse_error(tmp_path):
    proc = _run(tmp_path, "fit", "--trainer.max_epocs", "1")
    assert proc.returncode != 0
    assert "unrecognized arguments: --trainer.max_epocs" in proc.stderr
    proc = _run(tmp_path, "fit", "--model.lr", "fast")
    assert proc.returncode != 0 and "model.lr" in proc.stderr


@needs_jsonargparse
def test_print_config_prints_yaml_and_exits(tmp_path):
    proc = _run(tmp_path, "fit", "--model.lr", "0.3", "--print_config")
    assert proc.returncode == 0, proc.stderr
    import yaml
    printed = yaml.safe_load(proc.stdout)
    assert printed["model"]["lr"] == 0.3 and "RESULT" not in proc.stdout  # printed, nothing run


def test_without_jsonargparse_the_error_names_the_extra(tmp_path):
    # blocks the import as a missing package would; gpulayer.trainer itself still imports
    code = textwrap.dedent('''
        import sys
        sys.modules["jsonargparse"] = None
        import gpulayer.trainer
        from gpulayer.trainer import Trainer
        try:
            from gpulayer.trainer.cli import LightningCLI
        except ModuleNotFoundError as err:
            print("ERR", err)
        else:
            print("IMPORTED")
    ''')
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ERR " in proc.stdout and "pip install gpulayer[cli]" in proc.stdout


# -- in this process, with args= (Lightning's way to drive the CLI from Python) ----------------------

@pytest.fixture
def script_module(tmp_path, monkeypatch):
    pytest.importorskip("jsonargparse")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    namespace: dict = {"__name__": "cli_script"}
    exec(compile(SCRIPT, "train.py", "exec"), namespace)
    return namespace


def test_run_false_instantiates_only(script_module, tmp_path):
    from gpulayer.trainer.cli import LightningCLI
    cli = LightningCLI(script_module["Model"], script_module["Data"], run=False, save_config_callback=None,
                       args=["--trainer.max_epochs=1", "--model.lr=0.2", "--trainer.enable_model_summary=false",
                             "--seed_everything=3"])
    assert cli.subcommand is None and cli.trainer.global_step == 0 and cli.model.hparams.lr == 0.2
    assert cli.config["seed_everything"] == 3
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 4
    assert not list(tmp_path.rglob("config.yaml"))  # save_config_callback=None writes nothing


def test_optimizer_from_the_command_line_replaces_configure_optimizers(script_module):
    import torch
    from gpulayer.trainer.cli import LightningCLI
    with pytest.warns(UserWarning, match="configure_optimizers` will be overridden"):
        cli = LightningCLI(script_module["Model"], script_module["Data"], run=False, save_config_callback=None,
                           args=["--optimizer=Adam", "--optimizer.lr=0.5", "--lr_scheduler=StepLR",
                                 "--lr_scheduler.step_size=1", "--trainer.logger=false"])
    optimizers, schedulers = cli.model.configure_optimizers()
    assert isinstance(optimizers[0], torch.optim.Adam) and optimizers[0].defaults["lr"] == 0.5
    assert isinstance(schedulers[0], torch.optim.lr_scheduler.StepLR)


def test_callbacks_from_the_command_line(script_module):
    from gpulayer.trainer.callbacks import EarlyStopping
    from gpulayer.trainer.cli import LightningCLI, SaveConfigCallback
    cli = LightningCLI(script_module["Model"], script_module["Data"], run=False,
                       args=["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss",
                             "--trainer.callbacks.patience=5", "--trainer.logger=false"])
    stops = [c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert len(stops) == 1 and stops[0].monitor == "val_loss" and stops[0].patience == 5
    assert any(isinstance(c, SaveConfigCallback) for c in cli.trainer.callbacks)


def test_a_trainer_subclass_gets_the_trainer_arguments(script_module):
    from gpulayer.trainer import Trainer
    from gpulayer.trainer.cli import LightningCLI

    class MyTrainer(Trainer):
        pass

    cli = LightningCLI(script_module["Model"], script_module["Data"], run=False, save_config_callback=None,
                       trainer_class=MyTrainer, args=["--trainer.max_epochs=2", "--trainer.logger=false"])
    assert type(cli.trainer) is MyTrainer and cli.trainer.max_epochs == 2


def test_the_cli_offers_every_trainer_argument():
    # Trainer takes **kwargs, so the CLI's arguments come from a typed twin: it must not fall behind
    pytest.importorskip("jsonargparse")
    import inspect
    from gpulayer.trainer.cli import _trainer
    from gpulayer.trainer.config import TrainerConfig
    offered = set(inspect.signature(_trainer).parameters)
    # derived from other arguments (device_ids, loggers, sharding, accelerator_object, max_epochs_given), or a Resources
    derived = {"device_ids", "cluster_resources", "max_epochs_given", "loggers", "sharding", "accelerator_object",
               "precision_plugin", "checkpoint_io", "cluster_environment", "layer_sync",
               "process_group_backend"}  # from precision, plugins, strategy
    expected = set(TrainerConfig.__dataclass_fields__) - derived
    assert expected - offered == set()


def test_trainer_init_signature_is_the_typed_one():
    # inspect (and LightningCLI's --help) see the Trainer's arguments, not **kwargs
    import inspect
    from gpulayer.trainer import Trainer
    params = inspect.signature(Trainer.__init__).parameters
    assert "kwargs" not in params
    assert {"self", "max_epochs", "callbacks", "logger", "devices"} <= set(params)




# module level, so jsonargparse resolves them by class path ("tests.trainer.test_cli.Encoder")
class Encoder(torch.nn.Module):
    def __init__(self, width: int = 4):
        super().__init__()
        self.width = width


class WithEncoder(BoringModel):
    def __init__(self, encoder: torch.nn.Module, out: int = 2):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = encoder

def test_cli_saves_the_config_as_hyperparameters_and_load_from_checkpoint_rebuilds_it(tmp_path):
    # the encoder is an object; the checkpoint keeps its class path and init args, and loading builds it again
    from gpulayer.trainer.cli import LightningCLI
    args = ["fit", f"--trainer.default_root_dir={tmp_path}", "--trainer.max_steps=1", "--trainer.logger=false",
            "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
            "--model.encoder=tests.trainer.test_cli.Encoder", "--model.encoder.width=7"]
    cli = LightningCLI(WithEncoder, args=args, save_config_callback=None)
    hparams = cli.model.hparams
    assert hparams["encoder"] == {"class_path": "tests.trainer.test_cli.Encoder", "init_args": {"width": 7}}
    assert hparams["_instantiator"] == "gpulayer.trainer.cli.instantiate_module"
    path = tmp_path / "m.ckpt"
    cli.trainer.save_checkpoint(path)
    loaded = WithEncoder.load_from_checkpoint(path)
    assert isinstance(loaded.encoder, Encoder) and loaded.encoder.width == 7


def test_load_from_checkpoint_refuses_an_untrusted_instantiator(tmp_path):
    import torch
    from gpulayer.trainer import Trainer
    from gpulayer.trainer.demos.boring_classes import BoringModel
    trainer = Trainer(default_root_dir=tmp_path, max_steps=1, logger=False, enable_progress_bar=False,
                      limit_val_batches=0)
    trainer.fit(BoringModel())
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    ckpt["hyper_parameters"] = {"_instantiator": "os.system"}
    torch.save(ckpt, path)
    with pytest.raises(ValueError, match="instantiator 'os.system' is not one of"):
        BoringModel.load_from_checkpoint(path)


def test_cli_trainer_defaults_callbacks_as_class_path_and_a_trainer_without_callbacks(tmp_path):
    from gpulayer.trainer import Trainer
    from gpulayer.trainer.callbacks import LearningRateMonitor
    from gpulayer.trainer.cli import LightningCLI
    from gpulayer.trainer.demos.boring_classes import BoringModel
    defaults = {"callbacks": {"class_path": "gpulayer.trainer.callbacks.LearningRateMonitor",
                              "init_args": {"logging_interval": "epoch"}}, "default_root_dir": str(tmp_path)}
    cli = LightningCLI(BoringModel, run=False, args=[], trainer_defaults=defaults)
    monitors = [c for c in cli.trainer.callbacks if isinstance(c, LearningRateMonitor)]
    assert len(monitors) == 1 and monitors[0].logging_interval == "epoch"

    class NoCallbacksTrainer(Trainer):
        def __init__(self, max_steps: int = 1):
            super().__init__(max_steps=max_steps, default_root_dir=str(tmp_path))

    with pytest.warns(UserWarning, match="does not expose the `callbacks` argument"):
        LightningCLI(BoringModel, run=False, args=[], trainer_class=NoCallbacksTrainer)


def test_fast_dev_run_keeps_a_given_model_checkpoint_which_saves_nothing(tmp_path):
    from gpulayer.trainer import Trainer
    from gpulayer.trainer.callbacks import ModelCheckpoint
    from gpulayer.trainer.demos.boring_classes import BoringModel
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts")
    trainer = Trainer(fast_dev_run=True, callbacks=[checkpoint], enable_progress_bar=False)
    trainer.fit(BoringModel())
    assert checkpoint in trainer.callbacks
    assert not (tmp_path / "ckpts").exists() or not list((tmp_path / "ckpts").iterdir())
