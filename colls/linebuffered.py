"""`python -m colls.linebuffered (script.py | -m module) args…`: run one MPI rank with its output
prefixed by `[rank] `, a whole line at a time.

`colls run --transport mpi` starts ranks through `mpiexec`, whose own `-prepend-rank` prefixes every
write it reads, so a line written in two flushes comes out cut in half. Instead each rank routes its
file descriptors 1 and 2 through a pipe read by a thread here, which writes only complete lines
(each in one write, so lines of different ranks never mix).
"""

from __future__ import annotations

import os
import runpy
import sys
import threading


def _relay(fd: int, prefix: bytes) -> tuple[int, threading.Thread]:
    """Route `fd` through a pipe; returns (the original fd's duplicate, the relay thread)."""
    read_end, write_end = os.pipe()
    original = os.dup(fd)
    os.dup2(write_end, fd)
    os.close(write_end)

    def pump() -> None:
        pending = b""
        while chunk := os.read(read_end, 65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if lines:
                os.write(original, b"".join(prefix + line + b"\n" for line in lines))
        if pending:
            os.write(original, prefix + pending + b"\n")
        os.close(read_end)

    thread = threading.Thread(target=pump, name=f"colls-relay-{fd}", daemon=True)
    thread.start()
    return original, thread


def run_program(arguments: list[str]) -> None:
    """Run `script.py args…` or `-m module args…` as `__main__`, as `python` itself would."""
    if arguments[0] == "-m":
        sys.argv = arguments[1:]
        runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = arguments
        sys.path[0] = os.path.dirname(os.path.abspath(arguments[0]))
        runpy.run_path(arguments[0], run_name="__main__")


def main() -> None:
    """Relay stdout and stderr with the rank's prefix, run the program as `__main__`, then drain."""
    arguments = sys.argv[1:]
    if not arguments:
        raise SystemExit("usage: python -m colls.linebuffered (script.py | -m module) [args ...]")
    rank = next((os.environ[v] for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
                 if v in os.environ), "?")
    relays = [(fd, *_relay(fd, f"[{rank}] ".encode())) for fd in (1, 2)]
    try:
        run_program(arguments)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original, thread in relays:
            os.dup2(original, fd)      # closes the pipe's last write end: the relay sees EOF
            thread.join(5)


if __name__ == "__main__":
    main()
