"""Communicator attributes (keyvals, `Get_attr`/`Set_attr`) and error handlers of `MPI.Comm`.

Attributes live on the communicator's handle: `Set_attr` on one handle is seen through every copy
of it. Keyvals are numbered per process. Of MPI's predefined attributes, `TAG_UB` is the largest tag
the transport carries, `IO` is MPI.ANY_SOURCE (every rank can do I/O), `WTIME_IS_GLOBAL` 0, `APPNUM` 0,
`UNIVERSE_SIZE` None (no dynamic processes), `LASTUSEDCODE` the last predefined error code.

Error handlers are kept as MPI keeps them (`Get_errhandler` hands back what `Set_errhandler` set;
by default what `mpi4py.rc.errors` asks for, MPI.ERRORS_RETURN unless set): whatever the handler,
the facade raises an exception on error.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from typing import Any

from .handles import NumberedHandle
from .request import ANY_SOURCE

KEYVAL_INVALID = 603979776   # MPICH's MPI_KEYVAL_INVALID
TAG_UB, IO, WTIME_IS_GLOBAL, UNIVERSE_SIZE, LASTUSEDCODE, APPNUM = (
    1681915905, 1681915909, 1681915911, 1681915913, 1681915915, 1681915917)   # MPICH's keyvals
ERR_LASTCODE = 1073741823
_PREDEFINED = (TAG_UB, IO, WTIME_IS_GLOBAL, UNIVERSE_SIZE, LASTUSEDCODE, APPNUM)
_keyvals: dict[int, tuple[Any, Any]] = {}   # keyval -> (copy_fn, delete_fn)
_next_keyval = itertools.count(1 << 20)
_lock = threading.Lock()


class Errhandler(NumberedHandle):
    """An MPI error handler: one of the predefined ones (None as handle: MPI.ERRHANDLER_NULL)."""

    _h: str | None

    def __new__(cls, errhandler: Errhandler | None = None) -> Errhandler:
        self = object.__new__(cls)
        if errhandler is not None and not isinstance(errhandler, Errhandler):
            raise TypeError(f"Errhandler: expecting an MPI.Errhandler, got {type(errhandler).__name__}")
        self._h = None if errhandler is None else errhandler._h
        return self

    @classmethod
    def _named(cls, name: str) -> Errhandler:
        handler = object.__new__(cls)
        handler._h = name
        return handler

    def __eq__(self, other: object) -> bool:
        return self._h == other._h if isinstance(other, Errhandler) else NotImplemented

    __hash__ = None   # type: ignore[assignment] - handles are unhashable in mpi4py

    def __bool__(self) -> bool:
        return self._h is not None

    def __repr__(self) -> str:
        return f"<colls.compat.MPI.Errhandler {self._h or 'ERRHANDLER_NULL'}>"

    def __reduce__(self) -> object:
        for constant in _CONSTANTS:
            if self is constant:
                return constant._h or "ERRHANDLER_NULL"
        return (Errhandler, ()) if self._h is None else (_named, (self._h,))

    def Free(self) -> None:
        """Release this handle (it becomes MPI.ERRHANDLER_NULL; the predefined constants stay)."""
        if self._h is None:
            raise _error("ERR_ARG", "Errhandler.Free: MPI.ERRHANDLER_NULL")
        if not any(self is constant for constant in _CONSTANTS):
            self._h = None

    def free(self) -> None:
        """Free, where this handle is not null."""
        if self._h is not None:
            self.Free()

    def toint(self) -> int:
        """A small int naming the handler (0: MPI.ERRHANDLER_NULL)."""
        return _NAMES.index(self._h) if self._h in _NAMES else 0

    @classmethod
    def fromint(cls, number: int) -> Errhandler:
        """The handler `toint` numbered `number`."""
        return cls._named(_NAMES[number]) if 0 < number < len(_NAMES) else cls()


def _named(name: str) -> Errhandler:
    return Errhandler._named(name)


def _error(code: str, message: str) -> Exception:
    from .errors import ERROR_CLASSES, MPIException

    return MPIException(ERROR_CLASSES[code][0], message)


_NAMES = (None, "ERRORS_RETURN", "ERRORS_ARE_FATAL", "ERRORS_ABORT")
ERRHANDLER_NULL = Errhandler()
ERRORS_RETURN = Errhandler._named("ERRORS_RETURN")
ERRORS_ARE_FATAL = Errhandler._named("ERRORS_ARE_FATAL")
ERRORS_ABORT = Errhandler._named("ERRORS_ABORT")
_CONSTANTS = (ERRHANDLER_NULL, ERRORS_RETURN, ERRORS_ARE_FATAL, ERRORS_ABORT)


def default_errhandler() -> Errhandler:
    """The error handler of COMM_WORLD and COMM_SELF, as `mpi4py.rc.errors` chooses it ("exception",
    the default: MPI.ERRORS_RETURN; "default" or "fatal": ERRORS_ARE_FATAL; "abort": ERRORS_ABORT)."""
    errors = getattr(getattr(sys.modules.get("mpi4py"), "rc", None), "errors", "exception")
    return {"default": ERRORS_ARE_FATAL, "fatal": ERRORS_ARE_FATAL, "abort": ERRORS_ABORT}.get(errors,
                                                                                             ERRORS_RETURN)


class Attributes:
    """Mixin of `Comm`: attribute caching and error handlers (needs `_handle()` and `_comm`)."""

    @classmethod
    def Create_keyval(cls, copy_fn: Callable[..., Any] | bool | None = None,
                      delete_fn: Callable[..., Any] | None = None, nopython: bool = False) -> int:
        """A new attribute key. On Dup an attribute is copied when `copy_fn` is True (the same
        object), or is `copy_fn(comm, keyval, value)` unless that returns NotImplemented; a false or
        None `copy_fn` copies nothing. `delete_fn(comm, keyval, value)` runs when the attribute is
        deleted or its communicator freed."""
        with _lock:
            keyval = next(_next_keyval)
            _keyvals[keyval] = (copy_fn, delete_fn)
        return keyval

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:
        """Forget an attribute key; returns MPI.KEYVAL_INVALID."""
        with _lock:
            _known(keyval, "Free_keyval")
            del _keyvals[keyval]
        return KEYVAL_INVALID

    def Get_attr(self, keyval: int) -> Any:
        """The attribute stored under `keyval` (or a predefined one), None if not set."""
        if keyval in _PREDEFINED:
            return self._predefined(keyval)
        _known(keyval, "Get_attr")
        return self._handle().attrs.get(keyval)

    def Set_attr(self, keyval: int, attrval: Any) -> None:
        """Store `attrval` under `keyval` on this communicator (replacing, and deleting, the old one)."""
        _known(keyval, "Set_attr")
        attrs = self._handle().attrs
        if keyval in attrs:
            self.Delete_attr(keyval)
        attrs[keyval] = attrval

    def Delete_attr(self, keyval: int) -> None:
        """Remove the attribute under `keyval`, calling its keyval's delete function."""
        _known(keyval, "Delete_attr")
        attrs = self._handle().attrs
        if keyval in attrs:
            value = attrs.pop(keyval)
            delete_fn = _keyvals[keyval][1]
            if delete_fn is not None:
                delete_fn(self, keyval, value)

    def _copied_attributes(self) -> dict[int, Any]:
        """The attributes a Dup of this communicator starts with."""
        copied = {}
        for keyval, value in self._handle().attrs.items():
            copy_fn = _keyvals.get(keyval, (None, None))[0]
            if copy_fn is True:
                copied[keyval] = value
            elif callable(copy_fn):
                result = copy_fn(self, keyval, value)
                if result is not NotImplemented:
                    copied[keyval] = result
        return copied

    def _delete_attributes(self) -> None:
        for keyval in list(self._handle().attrs):
            self.Delete_attr(keyval)

    def _predefined(self, keyval: int) -> Any:
        if keyval == TAG_UB:
            return self._comm.transport.user_tag_limit - 1
        return {IO: ANY_SOURCE, WTIME_IS_GLOBAL: 0, UNIVERSE_SIZE: None, LASTUSEDCODE: ERR_LASTCODE,
                APPNUM: 0}[keyval]

    # -- error handlers --------------------------------------------------------------------------

    def Get_errhandler(self) -> Errhandler:
        """The error handler set on this communicator (MPI.ERRORS_RETURN unless another was set)."""
        return Errhandler(self._handle().errhandler)

    def Set_errhandler(self, errhandler: Errhandler) -> None:
        """Keep `errhandler` for `Get_errhandler` (the facade raises exceptions whatever it is)."""
        if not isinstance(errhandler, Errhandler) or not errhandler:
            raise _error("ERR_ARG", f"Set_errhandler: expecting a predefined MPI.Errhandler, got "
                                    f"{errhandler!r}")
        self._handle().errhandler = Errhandler(errhandler)

    @classmethod
    def Create_errhandler(cls, errhandler_fn: Callable[..., Any]) -> Errhandler:
        """Not supported: user-defined error handlers (the facade raises exceptions)."""
        raise NotImplementedError("user-defined error handlers (Comm.Create_errhandler) are not supported "
                                  "by the colls mpi4py facade: errors raise exceptions")

    def Call_errhandler(self, errorcode: int) -> None:
        """Invoke the error handler: the predefined ones return (the facade raises its errors itself)."""
        self._handle()


def _known(keyval: int, what: str) -> None:
    if keyval not in _keyvals:
        raise _error("ERR_KEYVAL", f"Comm.{what}: {keyval!r} is not a keyval made by Create_keyval")
