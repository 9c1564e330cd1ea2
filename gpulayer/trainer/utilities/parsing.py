"""Hyperparameter collection (Lightning's ``utilities.parsing`` path).

``AttributeDict`` is the mapping ``self.hparams`` returns; ``collect_hparams``
finds the arguments of the ``__init__`` calls that built an object, walking up
from the frame that called ``save_hyperparameters`` through every constructor of
the same object (a subclass's arguments win over its parent's).
"""

from __future__ import annotations

import inspect
import types
from argparse import Namespace
from typing import Any


class AttributeDict(dict):
    """A dict whose keys also read and write as attributes: ``hparams.lr`` is ``hparams["lr"]``.

    Its ``repr`` is one ``"key": value`` line per key, sorted, with the values aligned,
    as Lightning prints hyperparameters.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'") from None

    def __repr__(self) -> str:
        if not self:
            return ""
        width = max(len(str(k)) for k in self) + 3  # the key, its two quotes and the colon
        return "\n".join(f"{chr(34) + str(k) + chr(34) + ':':<{width}} {self[k]}" for k in sorted(self, key=str))


def parse_class_init_keys(cls: type) -> tuple[str, str | None, str | None]:
    """The names ``cls.__init__`` gives to self, ``*args`` and ``**kwargs`` (None when absent)."""
    params = list(inspect.signature(cls.__init__).parameters.values())
    var_args = next((p.name for p in params if p.kind == inspect.Parameter.VAR_POSITIONAL), None)
    var_kwargs = next((p.name for p in params if p.kind == inspect.Parameter.VAR_KEYWORD), None)
    return params[0].name, var_args, var_kwargs


def _init_frame_args(frame: types.FrameType) -> tuple[Any, dict[str, Any]]:
    """(self, its arguments) when ``frame`` runs a class's ``__init__`` that uses ``super()``; (None, {}) if not."""
    local_vars = frame.f_locals
    if frame.f_code.co_name != "__init__" or "__class__" not in local_vars:
        return None, {}
    cls = local_vars["__class__"]
    self_name, var_args, var_kwargs = parse_class_init_keys(cls)
    names = [n for n in inspect.signature(cls.__init__).parameters if n in local_vars]
    args = {n: local_vars[n] for n in names}
    if var_kwargs:
        args.update(args.get(var_kwargs) or {})
    skip = {self_name, var_args, var_kwargs, "__class__", "frame", "frame_args"}
    return local_vars.get(self_name), {k: v for k, v in args.items() if k not in skip}


def collect_hparams(obj: Any, frame: types.FrameType, classes: tuple[type, ...] = ()) -> dict[str, Any]:
    """The constructor arguments of ``obj``, from ``frame`` up through the ``__init__`` chain that built it.

    With ``classes``, the chain goes on through the constructors of enclosing objects of those classes too
    (Lightning's rule: a module built inside another module's ``__init__`` saves that one's arguments as well);
    it stops at the first constructor of anything else."""
    found: list[dict[str, Any]] = []
    inside = False
    while frame is not None and frame.f_back is not None:
        owner, args = _init_frame_args(frame)
        if owner is obj or (owner is not None and classes and isinstance(owner, classes)):
            found.append(args)
            inside = True
        elif inside:
            break  # past the outermost constructor of obj
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for args in found:  # base class first, so a subclass's value of the same name wins
        merged.update(args)
    return merged


def to_hparams_dict(hp: Any) -> Any:
    """A dict or Namespace becomes an ``AttributeDict``; other mappings (OmegaConf) stay as given."""
    if isinstance(hp, Namespace):
        hp = vars(hp)
    if isinstance(hp, dict):
        return AttributeDict(hp)
    if isinstance(hp, (bool, int, float, str)):
        raise ValueError(f"Primitives {(bool, int, float, str)} are not allowed.")
    from collections.abc import MutableMapping
    if not isinstance(hp, MutableMapping):
        raise ValueError(f"Unsupported config type of {type(hp)}.")
    return hp


def is_picklable(obj: Any) -> bool:
    import pickle
    try:
        pickle.dumps(obj)
        return True
    except Exception:
        return False


def clean_namespace(hparams: Any) -> None:
    """Drop (with a warning) the hyperparameters ``pickle`` cannot save: a checkpoint must hold what it records."""
    from gpulayer.trainer.utilities.rank_zero import rank_zero_warn
    for key in [k for k, v in hparams.items() if not is_picklable(v)]:
        rank_zero_warn(f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress this "
                       f"warning by setting `self.save_hyperparameters(ignore=['{key}'])`.")
        del hparams[key]


__all__ = ["AttributeDict", "clean_namespace", "collect_hparams", "is_picklable", "parse_class_init_keys",
           "to_hparams_dict"]
