"""Every `COLLS_*` environment variable, declared once and read here.

Like NCCL's `NCCL_PARAM` table: each variable has a name, a type, a default and one line of meaning,
and `get(name)` reads it from the environment *at call time* (so a test or a script may set it just
before), validates it, and returns the typed value, or raises `InvalidArgument` naming the variable
and what to give. No other module reads a `COLLS_*` variable from the environment; one that starts
processes may write the launcher's variables (`LAUNCHER`) into a child's environment.

Three kinds of variable:
- user-facing options of colls itself (`CORE`);
- options of one transport (`TRANSPORT`), read by `colls.bootstrap` and given to the transport's
  constructor (transports read no environment);
- variables that `colls run`, `colls.spawn` and the other launchers set for each rank (`LAUNCHER`):
  how a rank learns who it is; a user does not set them.

The page docs/configuration.md is generated from this table: after editing it, run
`colls config --markdown > docs/configuration.md` (tests/test_config.py checks the page).
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from transports.errors import InvalidArgument

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Variable:
    """One `COLLS_*` variable: how it is parsed, what it defaults to and what it means."""

    name: str
    kind: str            # "text", "int", "float", "bool", "path" or "choice"
    default: object      # the value `get` returns when the variable is unset or empty (None: none)
    meaning: str         # one line, for the docs page
    section: str         # "core", "transport" or "launcher"
    choices: tuple[str, ...] = ()     # kind "choice": the values allowed (lower case)
    minimum: float | None = None      # kind "int"/"float": the smallest value allowed
    above: float | None = None        # kind "float": the value must be greater than this
    default_text: str = ""            # how the docs page shows the default, where `default` is None

    def parse(self, given: str):
        """`given` (the variable's raw text) as this variable's type.

        Args:
            given: the environment's value, not empty.

        Returns:
            The typed value.

        Raises:
            InvalidArgument: `given` is not a value of this variable, naming it and what to give.
        """
        text = given.strip()
        if self.kind == "text":
            return text
        if self.kind == "path":
            return Path(text).expanduser()
        if self.kind == "bool":
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise self.error(given, "give 1 or 0 (or true/false, yes/no, on/off)")
        if self.kind == "choice":
            if text.lower() not in self.choices:
                raise self.error(given, f"choose one of {', '.join(self.choices)}")
            return text.lower()
        try:
            value = int(text) if self.kind == "int" else float(text)
        except ValueError:
            raise self.error(given, "give an integer" if self.kind == "int" else "give a number") from None
        if self.kind == "float" and not math.isfinite(value):
            raise self.error(given, "give a finite number")
        if self.minimum is not None and not value >= self.minimum:
            raise self.error(given, f"give a number of at least {self.minimum:g}")
        if self.above is not None and not value > self.above:
            raise self.error(given, f"give a finite number > {self.above:g}")
        return value

    def error(self, given: str, what: str) -> InvalidArgument:
        """The error for a value `given` that this variable does not take."""
        return InvalidArgument(f"{self.name}={given!r}: {what} ({self.meaning})")


def _core(name: str, kind: str, default: object, meaning: str, **more) -> Variable:
    return Variable(name, kind, default, meaning, "core", **more)


def _transport(name: str, kind: str, default: object, meaning: str, **more) -> Variable:
    return Variable(name, kind, default, meaning, "transport", **more)


def _launcher(name: str, kind: str, meaning: str, **more) -> Variable:
    return Variable(name, kind, None, meaning, "launcher", **more)


VARIABLES: tuple[Variable, ...] = (
    # --- core: options of colls itself --------------------------------------------------------
    _core("COLLS_TRANSPORT", "choice", None,
          "how ranks exchange data when `colls.init(transport=)` does not say (`colls run` passes "
          "its `--transport` this way)",
          choices=("local", "shm", "mpi", "cuda_ipc"),
          default_text="shm under `colls run`, mpi under mpiexec, local alone"),
    _core("COLLS_TIMEOUT", "float", 300.0,
          "seconds a collective may wait for its peers before raising `CollectiveTimeout`",
          above=0),
    _core("COLLS_ALGO", "text", "",
          "algorithms forced per collective, read when a communicator is made, e.g. "
          "`all_reduce:ring;broadcast:binomial`"),
    _core("COLLS_TUNE_FILE", "path", Path("~/.cache/colls/tune.json").expanduser(),
          "where `colls tune` saves what it measured and algorithm selection reads it",
          default_text="~/.cache/colls/tune.json"),
    _core("COLLS_HOST", "text", None,
          "this rank's host name for grouping ranks by host (`colls run --hosts` sets virtual ones)",
          default_text="the machine's host name"),
    _core("COLLS_DEBUG", "bool", False,
          "log one line per call to stderr and check that every rank makes the same call"),
    _core("COLLS_TRACE", "path", None,
          "keep each rank's last 100 calls and write them to `FILE.<rank>` when a call fails",
          default_text="off"),
    # --- transport: options of one transport, given to its constructor by colls.bootstrap ------
    _transport("COLLS_SHM_SLOTS", "int", 4, "shm: slots in each rank's inbound FIFO", minimum=1),
    _transport("COLLS_SHM_CHUNK_BYTES", "int", 0,
               "shm: bytes per FIFO slot, a multiple of 64 (0: 256 KiB, less for large groups)",
               minimum=0),
    _transport("COLLS_SHM_MAPPED_BYTES", "int", 128 << 10,
               "shm: sends from registered memory at least this large are mapped", minimum=0),
    _transport("COLLS_CUDA_DEVICE", "int", None, "cuda_ipc: the GPU this rank uses", minimum=0,
               default_text="the rank modulo the number of GPUs"),
    _transport("COLLS_SIM_THREADS", "bool", False,
               "sim: run simulated ranks as threads even where greenlet is installed"),
    # --- launcher: set for each rank by colls run, colls.spawn, colls bench, colls fuzz ---------
    _launcher("COLLS_PLUGINS", "text",
              "plugin modules (or .py files), comma-separated, that each rank imports as its "
              "communicator is made, so that their `colls.algorithm` schedules run by name: "
              "`--plugin` of `colls run` and `colls bench` sets it (a script may too, see docs/plugins.md)"),
    _launcher("COLLS_RANK", "int", "this process's rank in the job", minimum=0),
    _launcher("COLLS_WORLD_SIZE", "int", "how many ranks the job has", minimum=1),
    _launcher("COLLS_LOCAL_RANK", "int", "this process's rank among those of its machine", minimum=0),
    _launcher("COLLS_RENDEZVOUS", "path", "the private directory where the ranks meet"),
    _launcher("COLLS_JOB", "text", "the job's name; its shared-memory segments are named after it"),
    _launcher("COLLS_DEATHS", "path",
              "under `colls run --transport mpi`: where a rank that ended badly leaves its status "
              "(it also marks the job's processes, which the launcher stops at the end)"),
    _launcher("COLLS_FUZZ_REGISTERED", "bool",
              "under `colls fuzz --registered`: ranks put their buffers in registered memory"),
)

BY_NAME: dict[str, Variable] = {variable.name: variable for variable in VARIABLES}


def declared(name: str) -> Variable:
    """The declaration of `name`.

    Args:
        name: a `COLLS_*` variable's name.

    Returns:
        Its `Variable`.

    Raises:
        KeyError: no such variable is declared (a misspelt name in colls itself).
    """
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in colls.config.VARIABLES") from None


def get(name: str, default: object = None):
    """The value of the variable `name` in this process's environment now.

    Args:
        name: a declared `COLLS_*` variable.
        default: returned instead of the declared default when the variable is unset or empty
            (for a default that depends on the caller, as the rank's GPU); None: the declared one.

    Returns:
        The typed value (int, float, bool, str, Path or a choice), or the default.

    Raises:
        InvalidArgument: the variable is set to something it does not take (naming it, and what to give).
        KeyError: `name` is not declared.
    """
    variable = declared(name)
    given = os.environ.get(name, "")
    if not given.strip():
        return variable.default if default is None else default
    return variable.parse(given)


def is_set(name: str) -> bool:
    """Whether the variable `name` is set to something other than blanks.

    Args:
        name: a declared `COLLS_*` variable.

    Returns:
        True when the environment gives it a value (which `get` would parse).

    Raises:
        KeyError: `name` is not declared.
    """
    declared(name)
    return bool(os.environ.get(name, "").strip())


def check_all() -> None:
    """Parse every `COLLS_*` variable set in the environment, so a bad value fails at once.

    Raises:
        InvalidArgument: one is set to something it does not take, or a `COLLS_` name is not declared
            (a misspelling, or an option that no longer exists).
    """
    for name in sorted(os.environ):
        if name.startswith("COLLS_"):
            if name not in BY_NAME:
                raise InvalidArgument(f"{name} is not a colls variable; see docs/configuration.md")
            get(name)


SECTIONS = (
    ("core", "Options", "What a user may set for any program that uses colls."),
    ("transport", "Transport options",
     "Options of one transport, read where colls makes it (`colls.init`; the sim transport: `colls plan`) "
     "and given to its constructor: a transport itself reads no environment."),
    ("launcher", "Set by the launchers",
     "`colls run`, `colls.spawn`, `colls bench` and `colls fuzz` set these for each rank; "
     "do not set them yourself."),
)


def _default_text(variable: Variable) -> str:
    if variable.section == "launcher":
        return "set by the launcher"
    if variable.default_text:
        return variable.default_text
    if variable.kind == "bool":
        return "1" if variable.default else "0"
    if variable.default == "":
        return "unset"
    if isinstance(variable.default, float) and variable.default.is_integer():
        return f"{variable.default:g}"
    return str(variable.default)


def markdown() -> str:
    """The docs page docs/configuration.md, generated from `VARIABLES`.

    Returns:
        The page's text, ending in a newline.
    """
    kinds = {"text": "text", "int": "integer", "float": "number", "bool": "0 or 1", "path": "path",
             "choice": "one of"}
    lines = ["# Configuration", "",
             "<!-- generated by `colls config --markdown > docs/configuration.md`; "
             "edit colls/config.py, not this page -->", "",
             "colls reads these environment variables, and no others. Each is read when it is needed "
             "(a communicator's options when it is made), so a script may set one before it calls "
             "`colls.init`. An unset or empty variable takes its default; a value of the wrong kind "
             "is an `InvalidArgument` naming the variable and what to give. Arguments win over "
             "variables: `colls.init(transport=...)`, `timeout=`, `algorithm=`. `colls config` prints "
             "each variable's value in the current environment, and checks those set.", ""]
    for section, title, text in SECTIONS:
        lines += [f"## {title}", "", text, "", "| variable | type | default | meaning |",
                  "| --- | --- | --- | --- |"]
        for variable in VARIABLES:
            if variable.section == section:
                kind = kinds[variable.kind]
                if variable.choices:
                    kind += " " + ", ".join(variable.choices)
                lines.append(f"| `{variable.name}` | {kind} | {_default_text(variable)} | "
                             f"{variable.meaning} |")
        lines.append("")
    return "\n".join(lines)


def transport_options(kind: str) -> dict:
    """The constructor options of a transport between processes of one machine, from the
    configuration (COLLS_SHM_*, COLLS_CUDA_DEVICE, the launcher's COLLS_JOB): transports read no
    environment themselves.

    Args:
        kind: "shm" or "cuda_ipc".

    Returns:
        The keyword arguments of the transport's constructor (and of `transports.shm.shm_group`).
    """
    from transports.shm import ShmOptions

    options: dict = {"options": ShmOptions(slots=get("COLLS_SHM_SLOTS"),
                                           chunk_bytes=get("COLLS_SHM_CHUNK_BYTES"),
                                           mapped_bytes=get("COLLS_SHM_MAPPED_BYTES"),
                                           job=get("COLLS_JOB"))}
    if kind == "cuda_ipc":
        options["device"] = get("COLLS_CUDA_DEVICE")
    return options


def main(argv: list[str] | None = None) -> int:
    """`colls config [--markdown]`: print every variable's current value (`*`: set), or the docs page.

    Args:
        argv: the arguments (default: sys.argv[1:]).

    Returns:
        The exit status: 0, or 1 when a variable set in the environment does not parse.
    """
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    try:
        check_all()
    except InvalidArgument as error:
        print(error, file=sys.stderr)
        return 1
    for variable in VARIABLES:
        mark = "*" if is_set(variable.name) else " "
        print(f"{mark} {variable.name} = {get(variable.name)!r}")
    return 0

