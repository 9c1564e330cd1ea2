"""The hosted loggers (W&B, Comet, MLflow, LitLogger): what each sends to its library.

Each library is replaced by a small fake module of our own in ``sys.modules`` that records the calls
(the real ones are not installed here and would reach a network). The tests check what a user's run
produces there: metrics with their step, hyperparameters, the names and ids of the run, checkpoints
uploaded as ``log_model`` says, and what happens at the end of the run.
"""

from __future__ import annotations

import os
import pickle
import sys
import types
from pathlib import Path

import pytest
import torch

from gpulayer.trainer import Trainer
from gpulayer.trainer.callbacks import ModelCheckpoint
from gpulayer.trainer.demos.boring_classes import BoringModel
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.loggers import CometLogger, LitLogger, Logger, MLFlowLogger, WandbLogger
from gpulayer.trainer.loggers import comet as comet_mod
from gpulayer.trainer.loggers import litlogger as lit_mod
from gpulayer.trainer.loggers import mlflow as mlflow_mod
from gpulayer.trainer.loggers import wandb as wandb_mod
from gpulayer.trainer.loggers.neptune import NeptuneLogger
from gpulayer.trainer.loggers.requirement import Requirement

QUIET = dict(enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)


def _module(monkeypatch, name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    monkeypatch.setitem(sys.modules, name, mod)
    if "." in name:
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, mod)
    return mod


def _fit(tmp_path, logger, max_epochs=2, **kwargs):
    trainer = Trainer(default_root_dir=tmp_path, logger=logger, max_epochs=max_epochs, limit_train_batches=2,
                      limit_val_batches=1, log_every_n_steps=1, **QUIET, **kwargs)
    trainer.fit(BoringModel())
    return trainer


# -- the availability flags ---------------------------------------------------------------------------------------

def test_requirement_is_true_only_for_an_importable_module_at_the_version_asked():
    assert Requirement("torch>=1.0")
    assert not Requirement("torch>=999.0")
    missing = Requirement("gpulayer-no-such-library>=1.0")
    assert not missing
    assert "pip install -U 'gpulayer-no-such-library>=1.0'" in str(missing)


@pytest.mark.parametrize(("module", "flag", "make"), [
    (wandb_mod, "_WANDB_AVAILABLE", lambda: WandbLogger()),
    (comet_mod, "_COMET_AVAILABLE", lambda: CometLogger()),
    (mlflow_mod, "_MLFLOW_AVAILABLE", lambda: MLFlowLogger()),
    (lit_mod, "_LITLOGGER_AVAILABLE", lambda: LitLogger(name="x")),
])
def test_a_hosted_logger_without_its_library_says_what_to_install(monkeypatch, module, flag, make):
    monkeypatch.setattr(module, flag, Requirement("gpulayer-no-such-library>=1.0"))
    with pytest.raises(ModuleNotFoundError, match="pip install"):
        make()


def test_neptune_logger_refuses_and_names_the_replacement():
    with pytest.raises(RuntimeError, match="(?s)NeptuneLogger is no longer supported.*LitLogger"):
        NeptuneLogger(project="p")


# -- Weights & Biases ---------------------------------------------------------------------------------------------

class FakeRun:
    def __init__(self, **init):
        self.init, self.id, self.name = init, init.get("id") or "run42", "fake-run"
        self.rows, self.config_updates, self.axes, self.artifacts = [], [], [], []
        self.config = types.SimpleNamespace(update=lambda params, allow_val_change: self.config_updates.append(params))

    def log(self, row):
        self.rows.append(row)

    def define_metric(self, name, **kwargs):
        self.axes.append((name, kwargs))

    def log_artifact(self, artifact, aliases):
        self.artifacts.append((artifact, aliases))


class FakeArtifact:
    def __init__(self, name, type, metadata):
        self.name, self.type, self.metadata, self.files = name, type, metadata, []

    def add_file(self, path, name, policy):
        self.files.append((path, name, policy))


@pytest.fixture
def fake_wandb(monkeypatch):
    runs = []

    def init(**kwargs):
        runs.append(FakeRun(**kwargs))
        return runs[-1]

    wandb = _module(monkeypatch, "wandb", init=init, run=None, Artifact=FakeArtifact, runs=runs,
                    require=lambda _: None)
    _module(monkeypatch, "wandb.wandb_run", Run=FakeRun)
    monkeypatch.setattr(wandb_mod, "_WANDB_AVAILABLE", True)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return wandb


def test_wandb_starts_a_run_with_the_logger_arguments_and_logs_against_the_trainer_step(fake_wandb, tmp_path):
    logger = WandbLogger(name="try1", save_dir=tmp_path, project="proj", prefix="train", entity="team")
    assert logger.version is None and fake_wandb.runs == []  # asking the version does not start a run
    logger.log_metrics({"loss": 0.5}, step=3)
    (run,) = fake_wandb.runs
    assert run.init == {"name": "try1", "project": "proj", "dir": str(tmp_path), "id": None, "resume": "allow",
                        "anonymous": None, "entity": "team"}
    assert run.rows == [{"train-loss": 0.5, "trainer/global_step": 3}]
    assert ("*", {"step_metric": "trainer/global_step", "step_sync": True}) in run.axes
    assert (logger.name, logger.version, logger.save_dir) == ("proj", "run42", str(tmp_path))


def test_wandb_hyperparameters_are_made_json_friendly(fake_wandb):
    logger = WandbLogger()
    logger.log_hyperparams({"path": Path("data/x"), "act": torch.nn.ReLU, "n": 3, "nested": {"a": 1}})
    assert fake_wandb.runs[0].config_updates == [{"path": str(Path("data/x")), "act": "ReLU", "n": 3, "nested": {"a": 1}}]


def test_wandb_offline_writes_locally_and_refuses_to_upload_checkpoints(fake_wandb, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(MisconfigurationException, match="cannot be uploaded in offline mode"):
        WandbLogger(offline=True, log_model=True)
    _ = WandbLogger(offline=True).experiment
    assert os.environ["WANDB_MODE"] == "dryrun"


def test_wandb_reuses_a_run_in_progress_with_a_warning(fake_wandb):
    fake_wandb.run = FakeRun(id="already")
    with pytest.warns(UserWarning, match="wandb run already in progress"):
        assert WandbLogger().experiment is fake_wandb.run
    assert fake_wandb.runs == []


def test_wandb_checkpoint_dir_and_log_dir_follow_the_run(fake_wandb, tmp_path):
    logger = WandbLogger(save_dir=tmp_path, project="proj", version="abc")
    trainer = _fit(tmp_path, logger, max_epochs=1)
    assert trainer.log_dir == str(tmp_path)
    assert trainer.checkpoint_callback.dirpath == str(tmp_path / "proj" / "abc" / "checkpoints")


@pytest.mark.parametrize(("log_model", "uploads"), [(True, 1), ("all", 2), (False, 0)])
def test_wandb_log_model_uploads_checkpoints_when_it_says(fake_wandb, tmp_path, log_model, uploads):
    logger = WandbLogger(save_dir=tmp_path, log_model=log_model)
    _fit(tmp_path, logger, max_epochs=2)
    run = fake_wandb.runs[0]
    assert len(run.artifacts) == uploads
    if uploads:
        artifact, aliases = run.artifacts[-1]
        assert (artifact.name, artifact.type, aliases) == ("model-run42", "model", ["latest", "best"])
        assert artifact.metadata["original_filename"] == "epoch=1-step=4.ckpt"
        assert artifact.metadata["ModelCheckpoint"]["save_top_k"] == 1
        assert artifact.files[0][1:] == ("model.ckpt", "mutable")


def test_wandb_checkpoints_kept_for_the_end_go_up_only_after_success(fake_wandb, tmp_path):
    logger = WandbLogger(save_dir=tmp_path, log_model=True)
    ckpt = tmp_path / "a.ckpt"
    ckpt.write_bytes(b"x")
    callback = ModelCheckpoint(dirpath=tmp_path)
    callback.best_model_path, callback.best_model_score = str(ckpt), torch.tensor(0.25)
    _ = logger.experiment
    logger.after_save_checkpoint(callback)
    logger.finalize("failed")
    assert fake_wandb.runs[0].artifacts == []
    logger.finalize("success")
    ((artifact, aliases),) = fake_wandb.runs[0].artifacts
    assert artifact.metadata["score"] == 0.25 and aliases == ["latest", "best"]
    logger.finalize("success")  # unchanged since: not again
    assert len(fake_wandb.runs[0].artifacts) == 1


def test_wandb_is_created_before_the_other_loggers(fake_wandb, tmp_path):
    order = []
    fake_init = fake_wandb.init
    fake_wandb.init = lambda **kw: order.append("wandb") or fake_init(**kw)

    class First(Logger):
        @property
        def experiment(self):
            order.append("first")
            return None

        def log_metrics(self, metrics, step=None):
            pass

    _fit(tmp_path, [First(), WandbLogger(save_dir=tmp_path)], max_epochs=1)
    assert order[:2] == ["wandb", "first"]


def test_wandb_copy_in_another_process_rejoins_the_run(fake_wandb):
    logger = WandbLogger(project="p")
    copy = pickle.loads(pickle.dumps(logger))  # started here, so the copy knows the id
    assert copy._experiment is None and copy.version == "run42" and copy.name == "p"


# -- Comet --------------------------------------------------------------------------------------------------------

class FakeCometExperiment:
    project_name = "proj-from-comet"

    def __init__(self, **start):
        self.start, self.metrics, self.params, self.others, self.graphs, self.flushed, self.ended = start, [], [], [], [], 0, 0

    def get_key(self):
        return self.start["experiment_key"] or "KEY123"

    def log_other(self, key, value):
        self.others.append((key, value))

    def flush(self):
        self.flushed += 1

    def end(self):
        self.ended += 1

    # the calls Comet's integrations make (dunder names: not mangled)
    def __internal_api__log_metrics__(self, *args, **kwargs):
        self.metrics.append((args, kwargs))

    def __internal_api__log_parameters__(self, *args, **kwargs):
        self.params.append((args, kwargs))

    def __internal_api__set_model_graph__(self, *args, **kwargs):
        self.graphs.append((args, kwargs))


@pytest.fixture
def fake_comet(monkeypatch):
    started = []

    def start(**kwargs):
        started.append(FakeCometExperiment(**kwargs))
        return started[-1]

    comet = _module(monkeypatch, "comet_ml", start=start, started=started,
                    ExperimentConfig=lambda **kw: types.SimpleNamespace(offline_directory=kw.get("offline_directory"),
                                                                        kwargs=kw))
    monkeypatch.setattr(comet_mod, "_COMET_AVAILABLE", True)
    monkeypatch.setenv("COMET_DISABLE_AUTO_LOGGING", "0")  # the logger sets it; monkeypatch puts it back
    return comet


def test_comet_starts_its_experiment_and_logs_epoch_apart(fake_comet):
    logger = CometLogger(api_key="k", project="proj", prefix="tr", name="run-1")
    (exp,) = fake_comet.started
    assert exp.start["api_key"] == "k" and exp.start["project"] == "proj"
    assert exp.start["experiment_config"].kwargs == {"name": "run-1"}
    assert exp.others == [("Created from", "pytorch-lightning")]
    weights = torch.ones(2, requires_grad=True)
    logger.log_metrics({"loss": weights, "epoch": 3}, step=7)
    ((values,), kwargs), = exp.metrics
    assert set(values) == {"loss"} and not values["loss"].requires_grad and weights.requires_grad
    assert kwargs == {"step": 7, "epoch": 3, "prefix": "tr", "framework": "pytorch-lightning"}
    logger.log_hyperparams({"lr": 0.1})
    assert exp.params == [((), {"parameters": {"lr": 0.1}, "framework": "pytorch-lightning", "flatten_nested": True,
                                "source": "manual"})]
    assert (logger.name, logger.version) == ("proj-from-comet", "KEY123")


def test_comet_older_argument_names_still_work(fake_comet, tmp_path):
    logger = CometLogger(project_name="old", experiment_name="n", save_dir=str(tmp_path), offline=True)
    exp = fake_comet.started[0]
    assert exp.start["project"] == "old" and exp.start["online"] is False
    assert logger._kwargs == {"name": "n", "offline_directory": str(tmp_path)}
    assert logger.save_dir == str(tmp_path)


def test_comet_finalize_flushes_and_keeps_the_experiment_open(fake_comet):
    logger = CometLogger()
    logger.finalize("success")
    exp = fake_comet.started[0]
    assert (exp.flushed, exp.ended) == (1, 0)
    copy = pickle.loads(pickle.dumps(logger))
    assert copy._experiment is None and copy._experiment_key == "KEY123"
    assert copy.experiment.start["experiment_key"] == "KEY123"  # the copy rejoins the same experiment


# -- MLflow -------------------------------------------------------------------------------------------------------

class FakeMlflowClient:
    def __init__(self, tracking_uri):
        self.tracking_uri, self.experiments, self.runs, self.batches = tracking_uri, {}, {}, []
        self.terminated, self.artifacts, self.artifact_dirs = [], [], []

    def get_experiment_by_name(self, name):
        found = self.experiments.get(name)
        return types.SimpleNamespace(experiment_id=found, lifecycle_stage="active") if found else None

    def create_experiment(self, name, artifact_location=None):
        self.experiments[name] = f"exp{len(self.experiments)}"
        return self.experiments[name]

    def create_run(self, experiment_id, tags):
        run_id = f"run{len(self.runs)}"
        self.runs[run_id] = types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id, experiment_id=experiment_id),
                                                  tags=tags)
        return self.runs[run_id]

    def get_run(self, run_id):
        return self.runs.get(run_id)

    def log_batch(self, run_id, metrics=(), params=(), **kwargs):
        self.batches.append((run_id, list(metrics), list(params), kwargs))

    def set_terminated(self, run_id, status):
        self.terminated.append((run_id, status))

    def log_artifact(self, run_id, path, artifact_path):
        self.artifacts.append((run_id, path, artifact_path))

    def log_artifacts(self, run_id, local_dir, artifact_path):
        files = {name: Path(local_dir, name).read_text() for name in os.listdir(local_dir)}
        self.artifact_dirs.append((run_id, artifact_path, files))


@pytest.fixture
def fake_mlflow(monkeypatch):
    clients = []

    def client(uri):
        clients.append(FakeMlflowClient(uri))
        return clients[-1]

    mlflow = _module(monkeypatch, "mlflow", set_tracking_uri=lambda uri: None, clients=clients)
    _module(monkeypatch, "mlflow.tracking", MlflowClient=client)
    _module(monkeypatch, "mlflow.tracking.context")  # no resolve_tags: tags go as given
    _module(monkeypatch, "mlflow.entities",
            Metric=lambda **kw: ("metric", kw), Param=lambda **kw: ("param", kw))
    _module(monkeypatch, "mlflow.utils")
    _module(monkeypatch, "mlflow.utils.mlflow_tags", MLFLOW_RUN_NAME="mlflow.runName")
    monkeypatch.setattr(mlflow_mod, "_MLFLOW_AVAILABLE", True)
    monkeypatch.setattr(mlflow_mod, "_MLFLOW_SYNCHRONOUS_AVAILABLE", True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return mlflow


def test_mlflow_creates_the_experiment_once_and_a_run_named_by_run_name(fake_mlflow, tmp_path):
    logger = MLFlowLogger("exp", run_name="r1", tags={"team": "a"}, save_dir=str(tmp_path), synchronous=False)
    (client,) = fake_mlflow.clients
    assert client.tracking_uri == f"file:{tmp_path}" and logger.save_dir == str(tmp_path)
    assert client.runs == {}  # nothing created until used
    assert (logger.name, logger.version) == ("exp0", "run0")
    assert client.runs["run0"].tags == {"team": "a", "mlflow.runName": "r1"}
    again = MLFlowLogger("exp", save_dir=str(tmp_path))
    again._mlflow_client = client
    assert again.experiment_id == "exp0" and again.run_id == "run1"  # same experiment, new run
    logger.log_metrics({"val[acc]": 0.5, "note": "text", "loss": 1.0}, step=4)
    run_id, metrics, _, kwargs = client.batches[-1]
    assert run_id == "run0" and kwargs == {"synchronous": False}
    assert [m[1]["key"] for m in metrics] == ["valacc", "loss"] and {m[1]["step"] for m in metrics} == {4}


def test_mlflow_parameters_are_flattened_truncated_and_batched(fake_mlflow):
    logger = MLFlowLogger("exp")
    logger.log_hyperparams({"opt": {"lr": 0.1}, "long": "x" * 300, **{f"p{i}": i for i in range(120)}})
    batches = [params for _, _, params, _ in fake_mlflow.clients[0].batches]
    assert [len(b) for b in batches] == [100, 22]
    values = {p[1]["key"]: p[1]["value"] for b in batches for p in b}
    assert values["opt/lr"] == "0.1" and len(values["long"]) == 250


@pytest.mark.parametrize(("status", "expected"), [("success", "FINISHED"), ("failed", "FAILED")])
def test_mlflow_finalize_ends_the_run_only_once_it_exists(fake_mlflow, status, expected):
    logger = MLFlowLogger("exp")
    logger.finalize(status)
    assert fake_mlflow.clients[0].terminated == []
    _ = logger.experiment
    logger.finalize(status)
    assert fake_mlflow.clients[0].terminated == [("run0", expected)]


def test_mlflow_log_model_uploads_the_best_checkpoint_with_its_metadata(fake_mlflow, tmp_path):
    logger = MLFlowLogger("exp", save_dir=str(tmp_path), log_model=True)
    trainer = _fit(tmp_path, logger, max_epochs=2)
    client = fake_mlflow.clients[0]
    assert trainer.checkpoint_callback.dirpath == str(tmp_path / "exp0" / "run0" / "checkpoints")
    assert trainer.log_dir == str(tmp_path)
    ((run_id, path, artifact_path),) = client.artifacts
    assert run_id == "run0" and os.path.basename(path) == "epoch=1-step=4.ckpt" and artifact_path == "epoch=1-step=4"
    ((_, _, files),) = client.artifact_dirs
    assert files["aliases.txt"] == "['latest', 'best']"
    assert "original_filename: epoch=1-step=4.ckpt" in files["metadata.yaml"]
    assert client.terminated == [("run0", "FINISHED")]


# -- LitLogger ----------------------------------------------------------------------------------------------------

class FakeSeries:
    def __init__(self):
        self.values = []

    def append(self, value, step):
        self.values.append((value, step))


class FakeLitExperiment:
    def __init__(self, **kwargs):
        self.kwargs, self.name, self.url, self.items, self.series, self.ended = kwargs, kwargs["name"], "https://x", {}, {}, []
        self.printed = False

    def print_url(self):
        self.printed = True

    def __getitem__(self, key):
        return self.series.setdefault(key, FakeSeries())

    def __setitem__(self, key, value):
        self.items.setdefault(key, []).append(value)

    def finalize(self, status):
        self.ended.append(status)


@pytest.fixture
def fake_litlogger(monkeypatch):
    made = []

    def experiment(**kwargs):
        made.append(FakeLitExperiment(**kwargs))
        return made[-1]

    lit = _module(monkeypatch, "litlogger", Experiment=experiment, made=made,
                  File=lambda path: ("file", path),
                  Model=lambda obj, **kw: ("model", obj, kw))
    _module(monkeypatch, "litlogger.generator", _create_name=lambda: "brave-otter")
    monkeypatch.setattr(lit_mod, "_LITLOGGER_AVAILABLE", True)
    return lit


def test_litlogger_names_the_experiment_by_name_and_creation_time(fake_litlogger, tmp_path):
    logger = LitLogger(root_dir=tmp_path, teamspace="team", metadata={"seed": 1})
    assert logger.name == "brave-otter" and logger.version is None
    assert logger.log_dir == logger.save_dir == str(tmp_path / "brave-otter")
    exp = logger.experiment
    assert ":" not in logger.version and logger.version.endswith("Z")
    assert exp.kwargs["name"] == f"brave-otter-{logger.version}" and exp.printed
    assert exp.kwargs["metadata"] == {"seed": "1"} and exp.kwargs["teamspace"] == "team"
    assert exp.kwargs["log_dir"] == str(tmp_path / "brave-otter")


def test_litlogger_metrics_are_series_and_hyperparameters_strings(fake_litlogger, tmp_path):
    logger = LitLogger(root_dir=tmp_path, name="n")
    logger.log_metrics({"loss": torch.tensor(0.5)})
    logger.log_metrics({"loss": 0.25})
    logger.log_metrics({"loss": 0.125}, step=10)
    exp = fake_litlogger.made[0]
    assert exp.series["loss"].values == [(0.5, 0), (0.25, 1), (0.125, 10)]
    logger.log_hyperparams({"lr": 0.1, "layers": [1, 2]})
    assert exp.items == {"lr": ["0.1"], "layers": ["[1, 2]"]}
    logger.log_model_artifact("m.pt")
    assert exp.items[exp.name] == [("model", "m.pt", {"version": "10"})]  # the last step logged


def test_litlogger_log_model_uploads_checkpoints_when_training_ends(fake_litlogger, tmp_path):
    logger = LitLogger(root_dir=tmp_path, name="n", log_model=True, checkpoint_name="best")
    _fit(tmp_path, logger, max_epochs=2)
    exp = fake_litlogger.made[0]
    ((kind, path, kwargs),) = exp.items["best"]
    assert kind == "model" and os.path.basename(path) == "epoch=1-step=4.ckpt" and kwargs == {"version": "4"}
    assert exp.ended == ["success"]
