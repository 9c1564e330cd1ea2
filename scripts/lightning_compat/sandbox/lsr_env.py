"""Facts about this machine that Lightning's tests import from Lightning's ``utilities.imports`` modules.

They choose what a test can run (``_IS_WINDOWS``, ``_TORCH_GREATER_EQUAL_2_8``, ``_RICH_AVAILABLE``): computed
here from the platform and installed packages, so the gpulayer side skips exactly what the Lightning side skips.
"""

import importlib.metadata
import importlib.util
import re
import sys

_FACT = re.compile(r"^_(IS_WINDOWS|IS_MACOS|IS_LINUX|\w+_AVAILABLE|TORCH_GREATER_EQUAL_\w+|TORCH_LESS_EQUAL_\w+"
                   r"|TORCHMETRICS_GREATER_EQUAL_\w+|PYTHON_GREATER_EQUAL_\w+)$")
_DISTRIBUTIONS = {"TORCHMETRICS": "torchmetrics", "TORCH": "torch"}
# facts that name a package with an extra: the modules that extra installs
_EXTRAS = {"JSONARGPARSE_SIGNATURES": ("jsonargparse", "docstring_parser", "typeshed_client")}


def is_fact(name):
    return bool(_FACT.match(name))


def _version(distribution):
    try:
        text = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def __getattr__(name):
    if not is_fact(name):
        raise AttributeError(name)
    if name == "_IS_WINDOWS":
        return sys.platform == "win32"
    if name == "_IS_MACOS":
        return sys.platform == "darwin"
    if name == "_IS_LINUX":
        return sys.platform.startswith("linux")
    match = re.match(r"^_(\w+?)_(GREATER|LESS)_EQUAL_(\d+)_(\d+)(?:_(\d+))?$", name)
    if match:
        package, direction = match.group(1), match.group(2)
        wanted = tuple(int(x) for x in match.groups()[2:] if x is not None)
        if package == "PYTHON":
            have = sys.version_info[:len(wanted)]
        else:
            have = _version(_DISTRIBUTIONS.get(package, package.lower()))
            if have is None:
                return False
            have = have[:len(wanted)]
        return have >= wanted if direction == "GREATER" else have <= wanted
    package = name[1:-len("_AVAILABLE")]
    modules = _EXTRAS.get(package, (package.lower(),))
    return all(importlib.util.find_spec(module) is not None for module in modules)
