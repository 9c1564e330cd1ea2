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
    """Drop, in place and with a warning, the values of a dict or ``Namespace`` that ``pickle`` cannot save: a
    checkpoint must hold what it records."""
    from gpulayer.trainer.utilities.rank_zero import rank_zero_warn

    mapping = vars(hparams) if isinstance(hparams, Namespace) else hparams
    for key in [k for k, v in mapping.items() if not is_picklable(v)]:
        rank_zero_warn(f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress this "
                       f"warning by setting `self.save_hyperparameters(ignore=['{key}'])`.")
        del mapping[key]


def collect_init_args(frame: types.FrameType, path_args: list[dict[str, Any]], inside: bool = False,
                      classes: tuple[type, ...] = ()) -> list[dict[str, Any]]:
    """Append to ``path_args`` the arguments of each ``__init__`` on the stack above ``frame``, innermost first,
    stopping past the last constructor of that chain; ``classes`` limits it to constructors of those classes."""
    while frame is not None and frame.f_back is not None:
        cls = frame.f_locals.get("__class__")
        _, args = _init_frame_args(frame)
        if cls is not None and frame.f_code.co_name == "__init__" and (not classes or issubclass(cls, classes)):
            path_args.append(args)
            inside = True
        elif inside:
            break
        frame = frame.f_back
    return path_args


def _attr_holders(model: Any, attribute: str) -> list[Any]:
    """Who holds ``attribute``, in Lightning's order: the model, its ``hparams``, the Trainer's datamodule, its
    ``hparams``; the last one found is the one read."""
    trainer = getattr(model, "_trainer", None)
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    holders = []
    for obj in (model, datamodule):
        if obj is None:
            continue
        if hasattr(obj, attribute):
            holders.append(obj)
        hparams = getattr(obj, "hparams", None)
        if hparams is not None and attribute in hparams:
            holders.append(hparams)
    return holders


def _missing(attribute: str) -> AttributeError:
    return AttributeError(f"{attribute} is neither stored in the model namespace nor the `hparams` namespace/dict, "
                          "nor the datamodule.")


def lightning_hasattr(model: Any, attribute: str) -> bool:
    """Whether ``attribute`` is on the model, in its ``hparams``, or on the Trainer's datamodule (or its hparams)."""
    return bool(_attr_holders(model, attribute))


def lightning_getattr(model: Any, attribute: str) -> Any:
    """The value of ``attribute`` where ``lightning_hasattr`` finds it (the datamodule's wins over the model's)."""
    holders = _attr_holders(model, attribute)
    if not holders:
        raise _missing(attribute)
    holder = holders[-1]
    return holder[attribute] if isinstance(holder, dict) else getattr(holder, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any) -> None:
    """Set ``attribute`` on every holder ``lightning_hasattr`` finds, so the model and its data agree."""
    holders = _attr_holders(model, attribute)
    if not holders:
        raise _missing(attribute)
    for holder in holders:
        if isinstance(holder, dict):
            holder[attribute] = value
        else:
            setattr(holder, attribute, value)


__all__ = ["AttributeDict", "clean_namespace", "collect_hparams", "collect_init_args", "is_picklable",
           "lightning_getattr", "lightning_hasattr", "lightning_setattr", "parse_class_init_keys", "to_hparams_dict"]
