"""Building a module or datamodule back from a checkpoint, and ``hparams.yaml`` files (Lightning's ``core.saving``).

``Model.load_from_checkpoint(path, **kwargs)`` calls ``Model(**hyper_parameters, **kwargs)``
with the hyperparameters the checkpoint saved (keyword arguments win; only the
names ``__init__`` accepts are passed unless it takes ``**kwargs``; a single saved
object goes back into the argument it came from), then the module's
``on_load_checkpoint`` and ``load_state_dict``. The same works for datamodules with
their own keys.
"""

from __future__ import annotations

import ast
import importlib
import csv
import inspect
import os
import sys
from argparse import Namespace
from enum import Enum
from typing import Any

import torch

from gpulayer.trainer.utilities.model_helpers import is_overridden, trainer_base
from gpulayer.trainer.utilities.parsing import parse_class_init_keys
from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

CHECKPOINT_PAST_HPARAMS_KEYS = ("hparams", "module_arguments")  # what very old checkpoints used


def _map_cpu_when_absent(storage: Any, location: str) -> Any:
    """Tensors saved on a device this machine lacks come back on the CPU; others where they were."""
    if location.startswith("cuda") and not torch.cuda.is_available():
        return storage.cpu()
    if location.startswith("mps") and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return storage.cpu()
    return None


def load_file(path_or_buffer: Any, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
    """``torch.load`` of a path, URL-less file object or buffer, as Lightning's ``pl_load`` (full pickle unless
    ``weights_only=True``)."""
    weights_only = bool(weights_only)
    if isinstance(path_or_buffer, (str, os.PathLike)):
        with open(path_or_buffer, "rb") as f:
            return torch.load(f, map_location=map_location, weights_only=weights_only)
    return torch.load(path_or_buffer, map_location=map_location, weights_only=weights_only)


def load_from_checkpoint(cls: type, checkpoint_path: Any, map_location: Any = None, hparams_file: Any = None,
                         strict: bool | None = None, weights_only: bool | None = None, **kwargs: Any) -> Any:
    Module, LightningDataModule = trainer_base(cls, "Module"), trainer_base(cls, "LightningDataModule")
    ckpt = load_file(checkpoint_path, map_location=map_location or _map_cpu_when_absent, weights_only=weights_only)
    key = cls.CHECKPOINT_HYPER_PARAMS_KEY
    if hparams_file is not None:
        ext = str(hparams_file).rsplit(".", 1)[-1].lower()
        if ext == "csv":
            ckpt[key] = load_hparams_from_tags_csv(hparams_file)
        elif ext in ("yml", "yaml"):
            ckpt[key] = load_hparams_from_yaml(hparams_file)
        else:
            raise ValueError(".csv, .yml or .yaml is required for `hparams_file`")
    ckpt.setdefault(key, {})
    ckpt[key].update(kwargs)
    obj = _instantiate(cls, ckpt, kwargs)
    if LightningDataModule is not None:
        state = ckpt.get(type(obj).__qualname__)
        if state:
            obj.load_state_dict(state)
        return obj
    if Module is None:
        raise NotImplementedError(f"Unsupported {cls}")
    module_strict = getattr(obj, "_strict_loading", None)
    if module_strict is not None and strict is not None and strict != module_strict:
        raise ValueError(f"You set `.load_from_checkpoint(..., strict={strict!r})` which is in conflict with "
                         f"`{cls.__name__}.strict_loading={module_strict!r}. Please set the same value for both of them.")
    strict = (module_strict if module_strict is not None else True) if strict is None else strict
    if is_overridden("configure_model", obj, Module):  # layers it builds must exist before the weights load
        obj.configure_model()
    obj.on_load_checkpoint(ckpt)
    keys = obj.load_state_dict(ckpt["state_dict"], strict=strict)
    if not strict:
        if keys.missing_keys:
            rank_zero_warn(f"Found keys that are in the model state dict but not in the checkpoint: {keys.missing_keys}")
        if keys.unexpected_keys:
            rank_zero_warn(f"Found keys that are not in the model state dict but in the checkpoint: {keys.unexpected_keys}")
    state_dict = ckpt["state_dict"]
    if not state_dict:
        rank_zero_warn(f"The state dict in {checkpoint_path!r} contains no parameters.")
        return obj
    device = next((t.device for t in state_dict.values() if isinstance(t, torch.Tensor)), torch.device("cpu"))
    return obj.to(device)


def _instantiate(cls: type, ckpt: dict[str, Any], new_kwargs: dict[str, Any]) -> Any:
    Module = trainer_base(cls, "Module")

    self_name, var_args, var_kwargs = parse_class_init_keys(cls)
    init_names = [n for n in inspect.signature(cls.__init__).parameters if n not in (self_name, var_args, var_kwargs)]
    loaded: dict[str, Any] = {}
    key = cls.CHECKPOINT_HYPER_PARAMS_KEY
    if key in ckpt:
        if Module is not None:
            for old in CHECKPOINT_PAST_HPARAMS_KEYS:
                loaded.update(ckpt.get(old, {}))
        loaded.update(ckpt.get(key) or {})
        hp_type = ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_TYPE)
        if hp_type is not None and isinstance(hp_type, type) and not isinstance(loaded, hp_type):
            try:
                loaded = hp_type(loaded)
            except Exception:  # a type that does not build from a dict: keep the dict
                pass
        name = ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_NAME)
        if name and name in init_names:
            loaded = {name: loaded}  # save_hyperparameters(one_object): the object goes back into its argument
    init_kwargs = {**loaded, **new_kwargs}
    instantiator = _trusted_instantiator(cls, init_kwargs.pop("_instantiator", None), init_kwargs.get("_class_path"))
    if instantiator is None:
        init_kwargs.pop("_class_path", None)
    if var_kwargs is None:
        init_kwargs = {k: v for k, v in init_kwargs.items() if k in init_names or k == "_class_path"}
    return instantiator(cls, init_kwargs) if instantiator else cls(**init_kwargs)


# what a checkpoint's `_instantiator` may name (LightningCLI writes it): a name from a file must not run any code
ALLOWED_INSTANTIATORS = {"gpulayer.trainer.cli.instantiate_module"}


def _trusted_instantiator(cls: type, path: Any, class_path: Any) -> Any:
    """The function a checkpoint names to build ``cls`` from its hyperparameters, once checked as trusted."""
    if path is None:
        return None
    if path not in ALLOWED_INSTANTIATORS:
        raise ValueError(f"The checkpoint's instantiator {path!r} is not one of {sorted(ALLOWED_INSTANTIATORS)}, "
                         "so it was not run; if you trust this checkpoint, add it to "
                         "gpulayer.trainer.core.saving.ALLOWED_INSTANTIATORS before loading.")
    if class_path is not None:
        module_name, _, name = str(class_path).rpartition(".")
        target = getattr(sys.modules.get(module_name), name, None)  # sys.modules only: loading imports nothing
        if not (isinstance(target, type) and issubclass(target, cls)):
            raise ValueError(f"The checkpoint asks for class {class_path!r}, which is not an imported subclass of "
                             f"{cls.__name__}, so it was not built; import the module that defines it first.")
    module_name, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), name)


# -- hparams files -------------------------------------------------------------------------------

def save_hparams_to_yaml(config_yaml: str | os.PathLike, hparams: Any, use_omegaconf: bool = True) -> None:
    """Write ``hparams`` (a dict or Namespace) as YAML; values YAML cannot hold are skipped with a warning."""
    try:
        import yaml
    except ImportError:  # PyYAML is not a dependency of gpulayer: plain values still get a readable file
        yaml = None
    folder = os.path.dirname(os.fspath(config_yaml))
    if folder and not os.path.isdir(folder):
        raise RuntimeError(f"Missing folder: {folder}.")
    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    try:
        from omegaconf import OmegaConf
        from omegaconf.dictconfig import DictConfig
        if use_omegaconf and isinstance(hparams, DictConfig):
            with open(config_yaml, "w", encoding="utf-8") as f:
                OmegaConf.save(hparams, f, resolve=True)
            return
    except ImportError:
        pass
    if not isinstance(hparams, dict):
        raise TypeError("hparams must be dictionary")
    kept: dict[str, Any] = {}
    for k, v in hparams.items():
        try:
            v = vars(v) if isinstance(v, Namespace) else v
            v = v.name if isinstance(v, Enum) else v  # an Enum member by its name (Lightning's file)
            yaml.dump(v) if yaml is not None else _plain_yaml(v)
        except Exception:
            rank_zero_warn(f"Skipping '{k}' parameter because it is not possible to safely dump to YAML.")
            continue
        kept[k] = v
    with open(config_yaml, "w", newline="", encoding="utf-8") as f:
        if yaml is not None:
            yaml.dump(kept, f)
        else:
            f.write(_plain_yaml(kept) if kept else "{}\n")


def _plain_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists and scalars, as PyYAML's default dump lays them out (sorted keys)."""
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            return "{}\n"
        out = []
        for k in sorted(value, key=str):
            v = value[k]
            if isinstance(v, (dict, list, tuple)) and v:
                out.append(f"{pad}{_scalar(k)}:\n" + _plain_yaml(v, indent if isinstance(v, (list, tuple)) else indent + 2))
            else:
                out.append(f"{pad}{_scalar(k)}: {_plain_yaml(v).strip()}\n")
        return "".join(out)
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]\n"
        return "".join(f"{pad}- " + _plain_yaml(v, indent + 2).lstrip() for v in value)
    return _scalar(value) + "\n"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        plain = value and value.strip() == value and not any(c in value for c in ":#{}[],&*!|>'\"%@`\n") \
            and value.lower() not in ("null", "true", "false", "yes", "no", "on", "off", "~")
        try:
            float(value)
            plain = False
        except ValueError:
            pass
        return value if plain else "'" + value.replace("'", "''") + "'"
    raise TypeError(f"{type(value).__name__} is not a plain YAML value")


def load_hparams_from_yaml(config_yaml: str | os.PathLike, use_omegaconf: bool = True) -> dict[str, Any]:
    """The dict a ``hparams.yaml`` holds; ``{}`` (with a warning) when the file is missing."""
    import yaml

    if not os.path.isfile(config_yaml):
        rank_zero_warn(f"Missing Tags: {config_yaml}.", category=RuntimeWarning)
        return {}
    with open(config_yaml, encoding="utf-8") as f:
        hparams = yaml.full_load(f)
    if use_omegaconf:
        try:
            from omegaconf import OmegaConf
            from omegaconf.errors import UnsupportedValueType, ValidationError
        except ImportError:
            return hparams
        try:
            return OmegaConf.create(hparams)
        except (UnsupportedValueType, ValidationError):  # a value OmegaConf cannot hold (a class): the plain dict
            pass
    return hparams


def load_hparams_from_tags_csv(tags_csv: str | os.PathLike) -> dict[str, Any]:
    """The ``key,value`` rows of a tags CSV, values parsed as Python literals where they are one."""
    if not os.path.isfile(tags_csv):
        rank_zero_warn(f"Missing Tags: {tags_csv}.", category=RuntimeWarning)
        return {}
    with open(tags_csv, newline="") as f:
        rows = list(csv.DictReader(f, delimiter=","))
    out = {}
    for row in rows:
        try:
            out[row["key"]] = ast.literal_eval(row["value"])
        except (ValueError, SyntaxError):
            out[row["key"]] = row["value"]
    return out


def save_hparams_to_tags_csv(tags_csv: str | os.PathLike, hparams: Any) -> None:
    folder = os.path.dirname(os.fspath(tags_csv))
    if folder and not os.path.isdir(folder):
        raise RuntimeError(f"Missing folder: {folder}.")
    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    with open(tags_csv, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["key", "value"], delimiter=",")
        writer.writerow({"key": "key", "value": "value"})
        for k, v in hparams.items():
            writer.writerow({"key": k, "value": v})
