"""``LightningCLI``: Lightning's command line for a module and a datamodule, on jsonargparse.

A script ``train.py``::

    from gpulayer.trainer.cli import LightningCLI
    LightningCLI(MyModel, MyDataModule)

runs ``python train.py fit --trainer.max_epochs 3 --model.lr 0.1``, ``--config config.yaml``,
``--print_config``, and the ``fit/validate/test/predict`` subcommands, as Lightning's does
(``lightning/pytorch/cli.py`` in Lightning 2.6.6 is the specification; the names, arguments and
hooks here are Lightning's). jsonargparse is an optional extra: ``pip install gpulayer[cli]``.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Iterable
from functools import partial, update_wrapper
from types import MethodType
from typing import Any, Callable, Optional, Union

import torch
import yaml
from torch.optim import Optimizer

try:
    from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, class_from_function
except ImportError as err:  # the cli extra is not installed
    raise ModuleNotFoundError(
        "gpulayer.trainer.cli (LightningCLI) needs jsonargparse, which is not installed; "
        "install it with `pip install gpulayer[cli]` (or `pip install 'jsonargparse[signatures]>=4.39,<5'`)",
        name="jsonargparse",
    ) from err

from gpulayer.trainer.callbacks import Callback
from gpulayer.trainer.datamodule import LightningDataModule
from gpulayer.trainer.errors import MisconfigurationException
from gpulayer.trainer.hparams import given_hyperparameters
from gpulayer.trainer.module import LightningModule
from gpulayer.trainer.seed import seed_everything
from gpulayer.trainer.cli_trainer import _trainer
from gpulayer.trainer.trainer import Trainer
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

# jsonargparse imported (its `signatures` extra, docstring-parser, only improves help): tests and user code
# guard their imports of `lazy_instance` on this flag, as they do under Lightning
_JSONARGPARSE_SIGNATURES_AVAILABLE = True

ArgsType = Optional[Union[list[str], dict[str, Any], Namespace]]

__all__ = ["ArgsType", "LRSchedulerCallable", "LightningArgumentParser", "LightningCLI", "OptimizerCallable",
           "ReduceLROnPlateau", "SaveConfigCallback", "instantiate_class"]


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """PyTorch's ``ReduceLROnPlateau`` with the ``monitor`` key it reads, so it can be set from the CLI."""

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


# the ReduceLROnPlateau above, not torch's: `--lr_scheduler ReduceLROnPlateau` must name one class, the one with
# the `monitor` that configure_optimizers returns
LRSchedulerTypeTuple = (torch.optim.lr_scheduler.LRScheduler, ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[torch.optim.lr_scheduler.LRScheduler, ReduceLROnPlateau]
LRSchedulerType = Union[type[torch.optim.lr_scheduler.LRScheduler], type[ReduceLROnPlateau]]

# types for a module's arguments that jsonargparse fills with a class path and init args, and the module calls
# with its parameters (or optimizer) in configure_optimizers: `def __init__(self, optimizer: OptimizerCallable)`
OptimizerCallable = Callable[[Iterable], Optimizer]
LRSchedulerCallable = Callable[[Optimizer], LRSchedulerTypeUnion]


@functools.lru_cache(maxsize=None)
def _typed_trainer_class(trainer_class: type) -> type:
    """A class jsonargparse reads the Trainer's arguments from (``Trainer`` takes ``**kwargs``); made once per
    class, as jsonargparse registers each under its name."""
    return class_from_function(_trainer, func_return=trainer_class, name=f"_{trainer_class.__name__}_typed")


def _is_overridden(name: str, instance: Any, parent: type) -> bool:
    return getattr(type(instance), name, None) is not getattr(parent, name, None)


class LightningArgumentParser(ArgumentParser):
    """Extension of jsonargparse's ArgumentParser for gpulayer.trainer (Lightning's)."""

    def __init__(self, *args: Any, description: str = "Lightning Trainer command line tool", env_prefix: str = "PL",
                 default_env: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        self.callback_keys: list[str] = []
        # separate optimizers and lr schedulers to know which were added
        self._optimizers: dict[str, tuple[Union[type, tuple[type, ...]], str]] = {}
        self._lr_schedulers: dict[str, tuple[Union[type, tuple[type, ...]], str]] = {}

    def add_lightning_class_args(self, lightning_class: Union[Callable[..., Any], type], nested_key: str,
                                 subclass_mode: bool = False, required: bool = True) -> list[str]:
        """Adds arguments from a Trainer, LightningModule, LightningDataModule or Callback class (or a
        function returning one) to a nested key of the parser."""
        if isinstance(lightning_class, type) and issubclass(lightning_class, Trainer) \
                and lightning_class.__init__ is Trainer.__init__:
            lightning_class = _typed_trainer_class(lightning_class)
        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        if isinstance(lightning_class, type) and issubclass(
            lightning_class, (Trainer, LightningModule, LightningDataModule, Callback)
        ):
            if issubclass(lightning_class, Callback):
                self.callback_keys.append(nested_key)
            if subclass_mode:
                return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
            return self.add_class_arguments(
                lightning_class, nested_key, fail_untyped=False,
                instantiate=not issubclass(lightning_class, Trainer), sub_configs=True,
            )
        raise MisconfigurationException(
            f"Cannot add arguments from: {lightning_class}. You should provide either a callable or a subclass of: "
            "Trainer, LightningModule, LightningDataModule, or Callback."
        )

    def add_optimizer_args(self, optimizer_class: Union[type[Optimizer], tuple[type[Optimizer], ...]] = (Optimizer,),
                           nested_key: str = "optimizer", link_to: str = "AUTOMATIC") -> None:
        """Adds arguments from an optimizer class (or any subclass, with a tuple) to a nested key."""
        if isinstance(optimizer_class, tuple):
            assert all(issubclass(o, Optimizer) for o in optimizer_class)
        else:
            assert issubclass(optimizer_class, Optimizer)
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"params"}}
        if isinstance(optimizer_class, tuple):
            self.add_subclass_arguments(optimizer_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(optimizer_class, nested_key, sub_configs=True, **kwargs)
        self._optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(self, lr_scheduler_class: Any = LRSchedulerTypeTuple,
                              nested_key: str = "lr_scheduler", link_to: str = "AUTOMATIC") -> None:
        """Adds arguments from a learning rate scheduler class (or any subclass, with a tuple) to a nested key."""
        if isinstance(lr_scheduler_class, tuple):
            assert all(issubclass(o, LRSchedulerTypeTuple) for o in lr_scheduler_class)
        else:
            assert issubclass(lr_scheduler_class, LRSchedulerTypeTuple)
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"optimizer"}}
        if isinstance(lr_scheduler_class, tuple):
            self.add_subclass_arguments(lr_scheduler_class, nested_key, **kwargs)
        else:
            self.add_class_arguments(lr_scheduler_class, nested_key, sub_configs=True, **kwargs)
        self._lr_schedulers[nested_key] = (lr_scheduler_class, link_to)


class SaveConfigCallback(Callback):
    """Saves a LightningCLI config to the log_dir when training starts.

    Raises ``RuntimeError`` if the file already exists (unless ``overwrite=True``), so a previous
    run's config is never overwritten by mistake.
    """

    def __init__(self, parser: LightningArgumentParser, config: Namespace, config_filename: str = "config.yaml",
                 overwrite: bool = False, multifile: bool = False, save_to_log_dir: bool = True) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and not _is_overridden("save_config", self, SaveConfigCallback):
            raise ValueError(
                "`save_to_log_dir=False` only makes sense when subclassing SaveConfigCallback to implement "
                "`save_config` and it is desired to disable the standard behavior of saving to log_dir."
            )

    def __getstate__(self) -> dict[str, Any]:
        # ranks of devices>1 get a pickled copy: the parser does not pickle, its YAML text does
        state = dict(self.__dict__)
        state["_text"] = self._dump()
        state["parser"] = None
        return state

    def _dump(self) -> str:
        if self.__dict__.get("_text") is not None:
            return self._text
        return self.parser.dump(self.config, skip_none=False)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.already_saved:
            return
        if self.save_to_log_dir and trainer.is_global_zero:
            log_dir = trainer.log_dir
            config_path = os.path.join(log_dir, self.config_filename)
            if not self.overwrite and os.path.isfile(config_path):
                raise RuntimeError(
                    f"{self.__class__.__name__} expected {config_path} to NOT exist. Aborting to avoid overwriting"
                    " results of a previous run. You can delete the previous config file,"
                    " set `LightningCLI(save_config_callback=None)` to disable config saving,"
                    ' or set `LightningCLI(save_config_kwargs={"overwrite": True})` to overwrite the config file.'
                )
            os.makedirs(log_dir, exist_ok=True)
            if self.parser is not None:
                self.parser.save(self.config, config_path, skip_none=False, overwrite=self.overwrite,
                                 multifile=self.multifile)
            else:
                with open(config_path, "w") as f:
                    f.write(self._dump())
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
        # other ranks never write: nothing for them to wait for, so no broadcast
        self.already_saved = True

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Implement to save the config in some other place as well (called on rank 0 only)."""


class LightningCLI:
    """Lightning's configurable command line: classes from a config file and/or command line arguments."""

    def __init__(
        self,
        model_class: Optional[Union[type[LightningModule], Callable[..., LightningModule]]] = None,
        datamodule_class: Optional[Union[type[LightningDataModule], Callable[..., LightningDataModule]]] = None,
        save_config_callback: Optional[type[SaveConfigCallback]] = SaveConfigCallback,
        save_config_kwargs: Optional[dict[str, Any]] = None,
        trainer_class: Union[type[Trainer], Callable[..., Trainer]] = Trainer,
        trainer_defaults: Optional[dict[str, Any]] = None,
        seed_everything_default: Union[bool, int] = True,
        parser_kwargs: Optional[Union[dict[str, Any], dict[str, dict[str, Any]]]] = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: ArgsType = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        """Parse the arguments, instantiate the classes and (``run=True``) run the chosen subcommand.

        Arguments as Lightning's ``LightningCLI``: ``model_class`` / ``datamodule_class`` (``None``: any
        subclass, given with ``--model=MyModel``), ``save_config_callback`` (``None``: no config.yaml in the
        log dir), ``trainer_defaults``, ``seed_everything_default``, ``parser_kwargs``, ``args`` (a list of
        command line arguments, a dict or a Namespace instead of ``sys.argv``), ``run`` (``False``: only
        instantiate, then ``cli.trainer.fit(cli.model)``), ``auto_configure_optimizers``,
        ``load_from_checkpoint_support`` (the model and datamodule save their config as hyperparameters, class paths
        included, so ``Model.load_from_checkpoint`` builds them again as the CLI did).
        """
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers

        self.model_class = model_class
        self._model_class = model_class or LightningModule
        self.subclass_mode_model = (model_class is None) or subclass_mode_model
        self.datamodule_class = datamodule_class
        self._datamodule_class = datamodule_class or LightningDataModule
        self.subclass_mode_data = (datamodule_class is None) or subclass_mode_data

        main_kwargs, subparser_kwargs = self._setup_parser_kwargs(self.parser_kwargs)
        self.setup_parser(run, main_kwargs, subparser_kwargs)
        self.parse_arguments(self.parser, args)
        self._parse_ckpt_path()
        self.subcommand = self.config["subcommand"] if run else None
        self._set_seed()
        if load_from_checkpoint_support:
            self._add_instantiators()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # -- the parser ---------------------------------------------------------------------------
    def _setup_parser_kwargs(self, parser_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        names = self.subcommands().keys()
        main_kwargs = {k: v for k, v in parser_kwargs.items() if k not in names}
        subparser_kwargs = {k: v for k, v in parser_kwargs.items() if k in names}
        return main_kwargs, subparser_kwargs

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Method that instantiates the argument parser."""
        from gpulayer.trainer import __version__  # the Lightning version whose behaviour this is
        kwargs.setdefault("dump_header", [f"gpulayer.trainer=={__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c", "--config", action=ActionConfigFile, help="Path to a configuration file in json or yaml format."
        )
        return parser

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any],
                     subparser_kwargs: dict[str, Any]) -> None:
        """Initialize and setup the parser, subcommands, and arguments."""
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments: dict[str, list[str]] = {}
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Adds default arguments to the parser."""
        parser.add_argument(
            "--seed_everything", type=Union[bool, int], default=self.seed_everything_default,
            help="Set to an int to run seed_everything with this value before classes instantiation."
                 "Set to True to use a random seed.",
        )

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Adds arguments from the core classes to the parser."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        trainer_defaults = {"trainer." + k: v for k, v in self.trainer_defaults.items() if k != "callbacks"}
        parser.set_defaults(trainer_defaults)
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        # without a datamodule class, the data is optional: the module may have its own loaders
        parser.add_lightning_class_args(self._datamodule_class, "data", subclass_mode=self.subclass_mode_data,
                                        required=self.datamodule_class is not None)

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:
                parser.add_optimizer_args((Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Implement to add extra arguments to the parser or link arguments."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Defines the list of available subcommands and the arguments to skip."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        parser_subcommands = parser.add_subcommands()
        trainer_class = (
            self.trainer_class if isinstance(self.trainer_class, type) else class_from_function(self.trainer_class)
        )
        for subcommand in self.subcommands():
            fn = getattr(trainer_class, subcommand)
            description = _get_short_description(fn)
            subparser_kwargs = kwargs.get(subcommand, {})
            subparser_kwargs.setdefault("description", description)
            subcommand_parser = self._prepare_subcommand_parser(trainer_class, subcommand, **subparser_kwargs)
            self._subcommand_parsers[subcommand] = subcommand_parser
            parser_subcommands.add_subcommand(subcommand, subcommand_parser, help=description)

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs: Any) -> LightningArgumentParser:
        parser = self.init_parser(**kwargs)
        self._add_arguments(parser)
        skip: set[Union[str, int]] = set(self.subcommands()[subcommand])
        added = parser.add_method_arguments(klass, subcommand, skip=skip)
        self._subcommand_method_arguments[subcommand] = added
        return parser

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Creates argument links for optimizers and learning rate schedulers that specified a ``link_to``."""
        for key, (class_type, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(class_type, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=_add_class_path_generator(class_type))

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parses command line arguments and stores it in ``self.config``."""
        if args is not None and len(sys.argv) > 1:
            rank_zero_warn(
                "LightningCLI's args parameter is intended to run from within Python like if it were from the command "
                "line. To prevent mistakes it is not recommended to provide both args and command line arguments, got: "
                f"sys.argv[1:]={sys.argv[1:]}, args={args}."
            )
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """With a ``ckpt_path``, the model's hyperparameters come from the checkpoint (as Lightning)."""
        if not self.config.get("subcommand"):
            return
        ckpt_path = self.config[self.config.subcommand].get("ckpt_path")
        if not (ckpt_path and os.path.isfile(ckpt_path)):
            return
        hparams = torch.load(ckpt_path, weights_only=False, map_location="cpu").get("hyper_parameters", {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            self.config = self.parser.parse_object({self.config.subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    # -- instantiation ------------------------------------------------------------------------
    def _add_instantiators(self) -> None:
        for key, klass, subclasses in (("model", self._model_class, self.subclass_mode_model),
                                       ("data", self._datamodule_class, self.subclass_mode_data)):
            self.parser.add_instantiator(_ConfigHparamsInstantiator(self, key), _returned_type(klass),
                                         subclasses=subclasses)

    def _config_dump(self) -> dict[str, Any]:
        """The parsed config as plain YAML values (class paths, not classes), of the subcommand when there is one."""
        if not hasattr(self, "config_dump"):
            text = self.parser.dump(self.config, skip_link_targets=False, skip_none=False, format="yaml")
            dump = yaml.safe_load(text)
            self.config_dump = dump[self.config.subcommand] if "subcommand" in self.config else dump
        return self.config_dump

    def before_instantiate_classes(self) -> None:
        """Implement to run some code before instantiating the classes."""

    def instantiate_classes(self) -> None:
        """Instantiates the classes and sets their attributes."""
        # jsonargparse 4.49 renamed instantiate_classes to instantiate (the old name warns)
        instantiate = getattr(self.parser, "instantiate", None) or self.parser.instantiate_classes
        self.config_init = instantiate(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Implement to run some code after instantiating the classes."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Instantiates the trainer; ``kwargs`` override the parsed trainer arguments."""
        extra_callbacks = [self._get(self.config_init, c) for c in self._parser(self.subcommand).callback_keys]
        trainer_config = {**self._get(self.config_init, "trainer", default={}), **kwargs}
        return self._instantiate_trainer(trainer_config, extra_callbacks)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        key = "callbacks"
        if key not in config:  # a trainer class whose __init__ has no `callbacks`
            rank_zero_warn(f"The `{self.trainer_class.__qualname__}` class does not expose the `{key}` argument so "
                           "they will not be included.")
            return self.trainer_class(**config)
        if config[key] is None:
            config[key] = []
        elif not isinstance(config[key], list):
            config[key] = [config[key]]
        config[key].extend(callbacks)
        if key in self.trainer_defaults:
            value = self.trainer_defaults[key]
            value = value if isinstance(value, list) else [value]
            # the defaults skip the parser: a callback given as {"class_path": ..., "init_args": ...} is built here
            config[key] += [instantiate_class((), v) if isinstance(v, dict) and "class_path" in v else v for v in value]
        if self.save_config_callback and not config.get("fast_dev_run", False):
            config[key].append(self.save_config_callback(
                self._parser(self.subcommand), self.config.get(str(self.subcommand), self.config),
                **self.save_config_kwargs,
            ))
        return self.trainer_class(**config)

    def _parser(self, subcommand: Optional[str]) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    @staticmethod
    def configure_optimizers(lightning_module: LightningModule, optimizer: Optimizer,
                             lr_scheduler: Optional[LRSchedulerTypeUnion] = None) -> Any:
        """Override to customize the module's ``configure_optimizers`` built from ``--optimizer``/``--lr_scheduler``."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}}
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: Optional[str]) -> None:
        """With ``--optimizer`` (and ``--lr_scheduler``) given, they replace the model's ``configure_optimizers``."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)

        def automatic(class_type: Any, register: dict[str, tuple[Any, str]]) -> list[str]:
            found = []
            for key, (base_class, link_to) in register.items():
                bases = base_class if isinstance(base_class, tuple) else (base_class,)
                if link_to == "AUTOMATIC" and any(issubclass(c, class_type) for c in bases):
                    found.append(key)
            return found

        optimizers = automatic(Optimizer, parser._optimizers)
        lr_schedulers = automatic(LRSchedulerTypeTuple, parser._lr_schedulers)
        if not optimizers:
            return
        if len(optimizers) > 1 or len(lr_schedulers) > 1:
            raise MisconfigurationException(
                f"`{self.__class__.__name__}.add_configure_optimizers_method_to_model` expects at most one optimizer "
                f"and one lr_scheduler to be 'AUTOMATIC', but found {optimizers + lr_schedulers}. In this case the "
                "user is expected to link the argument groups and implement `configure_optimizers`, see "
                "https://lightning.ai/docs/pytorch/stable/common/lightning_cli.html"
                "#optimizers-and-learning-rate-schedulers"
            )
        optimizer_class = parser._optimizers[optimizers[0]][0]
        optimizer_init = self._get(self.config_init, optimizers[0])
        if not isinstance(optimizer_class, tuple):
            optimizer_init = _global_add_class_path(optimizer_class, optimizer_init)
        if not optimizer_init:  # registered automatically, not given by the user
            return
        lr_scheduler_init = None
        if lr_schedulers:
            lr_scheduler_class = parser._lr_schedulers[lr_schedulers[0]][0]
            lr_scheduler_init = self._get(self.config_init, lr_schedulers[0])
            if not isinstance(lr_scheduler_class, tuple):
                lr_scheduler_init = _global_add_class_path(lr_scheduler_class, lr_scheduler_init)
        if _is_overridden("configure_optimizers", self.model, LightningModule):
            rank_zero_warn(
                f"`{self.model.__class__.__name__}.configure_optimizers` will be overridden by "
                f"`{self.__class__.__name__}.configure_optimizers`."
            )
        optimizer = instantiate_class(self.model.parameters(), optimizer_init)
        lr_scheduler = instantiate_class(optimizer, lr_scheduler_init) if lr_scheduler_init else None
        fn = partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=lr_scheduler)
        update_wrapper(fn, self.configure_optimizers)
        self.model.configure_optimizers = MethodType(fn, self.model)

    # -- running ------------------------------------------------------------------------------
    def _get(self, config: Namespace, key: str, default: Optional[Any] = None) -> Any:
        """A config value, which might be inside the subcommand's namespace."""
        return config.get(str(self.subcommand), config).get(key, default)

    def _run_subcommand(self, subcommand: str) -> None:
        before_fn = getattr(self, f"before_{subcommand}", None)
        if callable(before_fn):
            before_fn()
        fn = getattr(self, subcommand, getattr(self.trainer, subcommand))
        fn(**self._prepare_subcommand_kwargs(subcommand))
        after_fn = getattr(self, f"after_{subcommand}", None)
        if callable(after_fn):
            after_fn()

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        fn_kwargs = {
            k: v for k, v in self.config_init[subcommand].items() if k in self._subcommand_method_arguments[subcommand]
        }
        fn_kwargs["model"] = self.model
        if self.datamodule is not None:
            fn_kwargs["datamodule"] = self.datamodule
        return fn_kwargs

    def _set_seed(self) -> None:
        config_seed = self._get(self.config, "seed_everything")
        if config_seed is False:
            return
        config_seed = seed_everything(workers=True) if config_seed is True else seed_everything(config_seed, workers=True)
        if self.subcommand:
            self.config[self.subcommand]["seed_everything"] = config_seed
        else:
            self.config["seed_everything"] = config_seed


def _class_path_from_class(class_type: type) -> str:
    return class_type.__module__ + "." + class_type.__name__


def _global_add_class_path(class_type: type, init_args: Optional[Union[Namespace, dict[str, Any]]] = None
                           ) -> dict[str, Any]:
    if isinstance(init_args, Namespace):
        init_args = init_args.as_dict()
    return {"class_path": _class_path_from_class(class_type), "init_args": init_args or {}}


def _add_class_path_generator(class_type: type) -> Callable[[Namespace], dict[str, Any]]:
    def add_class_path(init_args: Namespace) -> dict[str, Any]:
        return _global_add_class_path(class_type, init_args)
    return add_class_path


def instantiate_class(args: Union[Any, tuple[Any, ...]], init: dict[str, Any]) -> Any:
    """Instantiates ``init["class_path"]`` with positional ``args`` and ``init["init_args"]``."""
    import importlib
    kwargs = init.get("init_args", {})
    if not isinstance(args, tuple):
        args = (args,)
    module_name, class_name = init["class_path"].rsplit(".", 1)
    return getattr(importlib.import_module(module_name), class_name)(*args, **kwargs)


def _returned_type(value: Union[Callable[..., Any], type]) -> type:
    return value if isinstance(value, type) else inspect.signature(value).return_annotation


class _ConfigHparamsInstantiator:
    """Builds the model (or datamodule) of ``key`` with its config as what ``save_hyperparameters`` stores.

    The config holds class paths and init args where the object receives instances (an optimizer callable, an
    encoder module); stored that way, ``load_from_checkpoint`` rebuilds them through ``instantiate_module``.
    """

    def __init__(self, cli: LightningCLI, key: str) -> None:
        self.cli = cli
        self.key = key

    def __call__(self, class_type: type, *args: Any, applied_instantiation_links: dict[str, Any],
                 **kwargs: Any) -> Any:
        hparams = self.cli._config_dump().get(self.key, {})
        if "class_path" in hparams:
            # the same keys with or without subclass mode: the arguments flat, the class apart
            hparams = {"_class_path": hparams["class_path"], **hparams.get("init_args", {}),
                       **hparams.get("dict_kwargs", {})}
        prefix = self.key + "."
        for target, value in applied_instantiation_links.items():  # values linked at instantiation
            if target.startswith(prefix):
                path = target[len(prefix):]
                path = path[len("init_args."):] if path.startswith("init_args.") else path
                _set_nested(hparams, path.split("."), value)
        token = given_hyperparameters.set({**hparams, "_instantiator": INSTANTIATOR})
        try:
            return class_type(*args, **kwargs)
        finally:
            given_hyperparameters.reset(token)


def _set_nested(data: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        data = data.setdefault(key, {})
    data[keys[-1]] = value


def instantiate_module(class_type: type, config: dict[str, Any]) -> Any:
    """Builds ``class_type`` (a module or datamodule) from hyperparameters saved through LightningCLI: what
    ``load_from_checkpoint`` calls for a checkpoint whose ``_instantiator`` names this function."""
    parser = ArgumentParser(exit_on_error=False)
    if "_class_path" in config:
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        config = {"class_path": config["_class_path"],
                  "dict_kwargs": {k: v for k, v in config.items() if k != "_class_path"}}
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    return instantiate(parser.parse_object({"module": config})).module


INSTANTIATOR = f"{__name__}.{instantiate_module.__name__}"


def _get_short_description(component: object) -> Optional[str]:
    doc = getattr(component, "__doc__", None)
    if not doc:
        return None
    return doc.strip().splitlines()[0]

