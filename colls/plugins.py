"""Loading plugins: modules of the user's that register algorithms (`colls.algorithm`) or change the
library before any communicator exists (the fuzzer's planted faults).

Three ways in, one registration:
- `--plugin mypkg.algos` (or `path/to/file.py`) on `colls run`, `colls fuzz`, `colls bench` and
  `colls plan`; `colls run` and `colls bench` hand it to their ranks as COLLS_PLUGINS;
- COLLS_PLUGINS=mod1,mod2 in a script's environment, loaded when a communicator is made;
- the entry-point group `colls.algorithms` of installed packages, loaded the first time the
  catalogue is listed or an algorithm name it lacks is looked up (`algorithms.registry`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from algorithms.registry import ENTRY_POINT_GROUP, load_entry_points
from transports.errors import InvalidArgument

from . import config

__all__ = ["ENTRY_POINT_GROUP", "load", "load_entry_points", "load_environment", "with_plugins"]


def load(spec: str) -> ModuleType:
    """Import the plugin `spec` (a .py path or a module name, optionally `:argument`) and set it up.

    Loading the same plugin again returns the module it made the first time.

    Args:
        spec: `path/to/file.py` or `package.module`, either with `:argument` after it, which is
            passed to the module's `setup(argument)`.

    Returns:
        The imported module.

    Raises:
        ValueError: the file or module cannot be found, or takes an argument but has no `setup`.
    """
    target, _, argument = spec.partition(":")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"plugin {spec}: no file {path}")
        name = f"colls_plugin_{path.stem}"
        module = sys.modules.get(name)
        if module is None:
            found = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(found)
            sys.modules[name] = module
            try:
                found.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as error:
            raise ValueError(f"plugin {spec}: {error}") from None
    if argument:
        setup = getattr(module, "setup", None)
        if setup is None:
            raise ValueError(f"plugin {spec}: {target} has no setup(argument) to take {argument!r}")
        setup(argument)
    return module


def load_environment() -> list[ModuleType]:
    """Load every plugin COLLS_PLUGINS names (comma-separated), as a communicator is made.

    Returns:
        The modules, in the order named (already imported ones are not run again).

    Raises:
        InvalidArgument: one cannot be loaded, naming COLLS_PLUGINS and the plugin.
    """
    modules = []
    for spec in _specs(config.get("COLLS_PLUGINS")):
        try:
            modules.append(load(spec))
        except ValueError as error:
            raise InvalidArgument(f"COLLS_PLUGINS: {error}") from None
    return modules


def with_plugins(specs: list[str]) -> str:
    """COLLS_PLUGINS for ranks a launcher starts: this process's, then `specs` (each .py path made
    absolute, so that a rank started elsewhere finds it).

    Args:
        specs: what `--plugin` gave, in order.

    Returns:
        The comma-separated value, each plugin once.
    """
    given = _specs(config.get("COLLS_PLUGINS"))
    for spec in specs:
        target, colon, argument = spec.partition(":")
        if target.endswith(".py"):
            spec = str(Path(target).resolve()) + colon + argument
        if spec not in given:
            given.append(spec)
    return ",".join(given)


def _specs(text: str) -> list[str]:
    return [spec.strip() for spec in (text or "").split(",") if spec.strip()]
