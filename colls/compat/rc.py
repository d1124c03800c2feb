"""`mpi4py.rc`: the runtime options a script sets before `from mpi4py import MPI`.

The facade reads `initialize` (False: nothing works before `MPI.Init`) and `irecv_bufsz`; the
others are kept for the scripts that set or read them (colls always gives THREAD_MULTIPLE and raises
exceptions on error). As in mpi4py, `configure` runs when `mpi4py.MPI` is first imported: the
MPI4PY_RC_* variables override the options, and an option of the wrong kind is warned about and
reset to its default.
"""

from __future__ import annotations

import os
import warnings

THREAD_LEVELS = ("single", "funneled", "serialized", "multiple")
ERRORS = ("default", "exception", "abort", "fatal")


class Rc:
    """mpi4py's runtime configuration options: unknown options are a TypeError, as in mpi4py."""

    initialize = True
    threads = True
    thread_level = "multiple"
    finalize = None
    fast_reduce = True
    recv_mprobe = True
    irecv_bufsz = 32768
    errors = "exception"

    def __init__(self, **kwargs: object) -> None:
        self(**kwargs)

    def __setattr__(self, name: str, value: object) -> None:
        if not hasattr(self, name):
            raise TypeError(f"mpi4py.rc has no option {name!r}")
        super().__setattr__(name, value)

    def __call__(self, **kwargs: object) -> None:
        """Set the options given as keywords."""
        unknown = [key for key in kwargs if not hasattr(self, key)]
        if unknown:
            raise TypeError(f"mpi4py.rc: unexpected option {unknown[0]!r}")
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return "<mpi4py.rc>"


def _boolean(text: str) -> object:
    return {"true": True, "yes": True, "on": True, "y": True, "1": True,
            "false": False, "no": False, "off": False, "n": False, "0": False}.get(text.lower(), text)


# option -> (what the environment's text becomes, whether a value is one it takes)
_KINDS = {
    "initialize": (_boolean, lambda v: isinstance(v, bool)),
    "threads": (_boolean, lambda v: isinstance(v, bool)),
    "thread_level": (str.lower, lambda v: v in THREAD_LEVELS),
    "finalize": (lambda text: None if text.lower() == "none" else _boolean(text),
                 lambda v: v is None or isinstance(v, bool)),
    "fast_reduce": (_boolean, lambda v: isinstance(v, bool)),
    "recv_mprobe": (_boolean, lambda v: isinstance(v, bool)),
    "irecv_bufsz": (lambda text: int(text) if text.strip().isdigit() else text,
                    lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "errors": (str.lower, lambda v: v in ERRORS),
}


def configure(rc: Rc | None, pickle: object) -> None:
    """What `from mpi4py import MPI` does first: MPI4PY_RC_<OPTION> variables set `rc`'s options
    and MPI4PY_PICKLE_PROTOCOL/THRESHOLD `pickle`'s; an option of the wrong kind is warned about
    ("mpi4py.rc.<option>: unexpected value ...") and set back to its default. `rc` may be None (a
    script deleted `mpi4py.rc`)."""
    for name, (convert, valid) in _KINDS.items():
        text = os.environ.get(f"MPI4PY_RC_{name.upper()}")
        if rc is None:
            continue
        if text is not None:
            object.__setattr__(rc, name, convert(text))
        value = getattr(rc, name)
        if not valid(value):
            warnings.warn(f"mpi4py.rc.{name}: unexpected value {value!r}", RuntimeWarning, stacklevel=3)
            object.__setattr__(rc, name, getattr(Rc, name))
    for name in ("PROTOCOL", "THRESHOLD"):
        text = os.environ.get(f"MPI4PY_PICKLE_{name}")
        if text is not None:
            setattr(pickle, name, int(text))
