"""A failing program as a short Python script that reproduces it without the fuzzer's machinery.

The script calls the library exactly as the fuzzer did, with the same inputs (`inputs` derives
them from the seed) and the same checks (`verify` against the numpy oracle's `expected`).
"""

from __future__ import annotations

from .plugins import snippet_lines
from .program import INVALID, ROOTED, Program, Step, split_colors


def _name(comm: int) -> str:
    return "comm" if comm == 0 else f"sub{comm}"


def _call(step: Step, i: int, group: str, root: str) -> str:
    """The library call of step `i` on communicator `group`."""
    args = [f"x{i}"]
    if step.kind == "scatter" and step.mode == "out":
        args = [f"x{i} if {group}.rank == {root} else None"]   # receivers may pass out only
    if step.kind == "all_to_all_v":
        args.append(f"counts{i}[{group}.rank]")
    if step.kind in ROOTED:
        args.append(f"root={root}")
    if step.op:
        args.append(f"op={step.op}" if step.op == "MATMUL" else f"op=colls.{step.op}")
    if step.mode != "new":
        args.append(f"out=out{i}")
    if step.algorithm:
        args.append(f"algorithm={step.algorithm!r}")
    if step.kind == "barrier":
        args = args[-1:] if step.algorithm else []
    if step.async_op:
        args.append("async_op=True")
    return f"{group}.{step.kind}({', '.join(args)})"


def _collective(step: Step, i: int, group: str, size: int | None) -> list[str]:
    """The lines of one collective step (inputs, expected result, the call, its check)."""
    variable = f"w{i}" if step.async_op else f"y{i}"
    if step.kind == "barrier":
        return [f"{variable} = {_call(step, i, group, '0')}"]
    root = str(step.root % size) if size else f"{step.root} % {group}.size"
    lines = [f"xs{i} = inputs(SEED, {i}, {group}.size, {step.kind!r}, {step.rows}, {step.dtype!r}, "
             f"{step.tail!r}, {step.op!r})"]
    if step.kind == "all_to_all_v":
        lines.append(f"counts{i} = send_counts(SEED, {i}, xs{i})")
    extra = f", counts=counts{i}" if step.kind == "all_to_all_v" else ""
    op = f", {step.op!r}" if step.op else ""
    root_arg = f", root={root}" if step.kind in ROOTED else ""
    lines.append(f"want{i} = expected({step.kind!r}, xs{i}, {group}.rank{op}{root_arg}{extra})")
    if step.kind == "broadcast" and step.mode == "inplace":
        lines.append(f"x{i} = xs{i}[{group}.rank].copy() if {group}.rank == {root} "
                     f"else sentinel_like(xs{i}[{group}.rank])")
    else:
        lines.append(f"x{i} = xs{i}[{group}.rank].copy()")
    if step.mode == "out":
        lines.append(f"out{i} = None if want{i} is None else sentinel_like(want{i})"
                     if step.kind in ROOTED else f"out{i} = sentinel_like(want{i})")
    elif step.mode == "inplace" and step.kind == "all_gather":   # x is this rank's block of out
        lines.append(f"out{i} = sentinel_like(want{i})")
        lines.append(f"x{i} = out{i}[{group}.rank * len(xs{i}[0]):({group}.rank + 1) * len(xs{i}[0])]")
        lines.append(f"x{i}[...] = xs{i}[{group}.rank]")
    elif step.mode == "inplace":
        lines.append(f"out{i} = x{i}")
    lines.append(f"{variable} = {_call(step, i, group, root)}")
    if not step.async_op:
        lines.append(_verify(step, i, f"y{i}"))
    return lines


def _point_to_point(step: Step, i: int, group: str) -> list[str]:
    """The lines of a p2p shift: post the first call async, the second blocking unless async."""
    dst, src = f"({group}.rank + shift{i}) % {group}.size", f"({group}.rank - shift{i}) % {group}.size"
    send = f"{group}.send(x{i}, {dst}, tag={step.tag}"
    recv = f"{group}.recv(buf{i}, {src}, tag={step.tag}"
    first, second = (recv, send) if step.mode == "out" else (send, recv)
    lines = [f"xs{i} = inputs(SEED, {i}, {group}.size, 'p2p', {step.rows}, {step.dtype!r}, {step.tail!r})",
             f"shift{i} = 1 + ({step.root} - 1) % max(1, {group}.size - 1)",
             f"x{i}, want{i} = xs{i}[{group}.rank].copy(), xs{i}[{src}]",
             f"buf{i} = sentinel_like(want{i})",
             f"first{i} = {first}, async_op=True)"]
    if step.async_op:
        return lines + [f"w{i} = (first{i}, {second}, async_op=True))"]
    return lines + [f"{second})", f"first{i}.wait()",
                    f"verify('step {i}', buf{i}, want{i}, x{i}, xs{i}[{group}.rank], buf{i})"]


def _invalid(step: Step, i: int, group: str) -> list[str]:
    """The lines of an invalid call: it must raise an error naming the argument and the rank."""
    named = INVALID[step.bad]
    lines = ["try:", f"    bad_call({step.bad!r}, {group}, {step.root})",
             "except (ValueError, TypeError) as error:",
             f"    assert f'rank {{{group}.rank}}' in str(error) and {named!r} in str(error), error",
             "else:", f"    raise AssertionError('step {i}: the invalid call raised nothing')"]
    if step.bad == "blocks":   # one rank: every length splits into one block
        return [f"if {group}.size > 1:", *("    " + line for line in lines)]
    return lines


def _verify(step: Step, i: int, got: str) -> str:
    out = f"out{i}" if step.mode != "new" else "None"
    return f"verify('step {i}', {got}, want{i}, x{i}, xs{i}[{group_of(step)}.rank], {out})"


def group_of(step: Step) -> str:
    return _name(step.comm)


def _guarded(lines: list[str], comm: int) -> list[str]:
    """Indent the lines under `if subK is not None:` for a sub-communicator's step."""
    if comm == 0 or not lines:
        return lines
    return [f"if {_name(comm)} is not None:", *("    " + line for line in lines)]


def _waits(pending: list[tuple[int, int, Step]]) -> list[str]:
    lines = []
    for _, i, step in sorted(pending, key=lambda p: (p[0], p[1])):
        if step.kind == "barrier":
            lines += _guarded([f"w{i}.wait()"], step.comm)
        elif step.kind == "p2p":
            lines += _guarded([f"if {group_of(step)}.size > 1:", f"    [w.wait() for w in w{i}]",
                               f"    verify('step {i}', buf{i}, want{i}, x{i}, xs{i}[{group_of(step)}.rank], "
                               f"buf{i})"], step.comm)
        else:
            lines += _guarded([_verify(step, i, f"w{i}.wait()")], step.comm)
    pending.clear()
    return lines


def render(program: Program, transport: str, plugins: list[str] = (), headline: str = "") -> str:
    """The program as a runnable script for `transport` (mpi: to start under mpiexec), loading
    the fuzzer's `plugins` first (`colls.fuzz.plugins`)."""
    body: list[str] = []
    pending: list[tuple[int, int, Step]] = []
    splits = 0
    for i, step in enumerate(program.steps):
        group = _name(step.comm)
        size = program.size if step.comm == 0 else None
        if step.kind == "split":
            splits += 1
            if size:
                table = split_colors(step.coloring, step.reverse, size)
                colors = [c for c, _ in table]
                keys = [k for _, k in table]
                key = f"key={keys!r}[{group}.rank]" if step.reverse else "key=None"
                body.append(f"sub{splits} = {group}.split({colors!r}[{group}.rank], {key})")
            else:
                body.append(f"sub{splits} = {group}.split(*split_colors({step.coloring!r}, {step.reverse}, "
                            f"{group}.size)[{group}.rank]) if {group} is not None else None")
            continue
        if step.kind == "wait":
            body += [f"# step {i}: wait for the async calls"] + _waits(pending)
            continue
        body.append(f"# step {i}: {step.label()}")
        if step.kind == "p2p":
            lines = [f"if {group}.size > 1:", *("    " + line for line in _point_to_point(step, i, group))]
            body += _guarded(lines, step.comm)
        elif step.kind == "invalid":
            body += _guarded(_invalid(step, i, group), step.comm)
        else:
            body += _guarded(_collective(step, i, group, size), step.comm)
        if step.async_op:
            pending.append((step.wait, i, step))
    if pending:
        body += ["# wait for the async calls still pending"] + _waits(pending)
    if all(line.startswith("#") for line in body):
        body.append("pass")

    names = ["expected", "inputs", "verify"]
    text = "\n".join(body)
    names += [n for n in ("send_counts", "sentinel_like") if n + "(" in text]
    names += ["MATMUL"] if "op=MATMUL" in text else []
    if "bad_call(" in text:
        lines_import = ["from colls.fuzz.execute import bad_call"]
    else:
        lines_import = []
    header = [f"# {headline}" if headline else "# colls fuzz: a collective program"]
    if transport == "mpi":
        header.append(f"# run: mpiexec -n {program.size} python this_file.py")
    lines = [*header, *snippet_lines(list(plugins)), "import colls", *lines_import,
             f"from colls.fuzz.oracle import {', '.join(sorted(names))}"]
    if "split_colors(" in text:
        lines.append("from colls.fuzz.program import split_colors")
    lines += ["", f"SEED = {program.seed}", "", "", "def program(comm):"]
    lines += ["    " + line for line in body]
    lines += ["", ""]
    if transport == "mpi":
        lines += ["if __name__ == \"__main__\":", "    program(colls.init(timeout=10))"]
    else:
        lines += ["if __name__ == \"__main__\":",
                  f"    colls.spawn(program, {program.size}, transport={transport!r}, timeout=10)",
                  "    print(\"passed\")"]
    return "\n".join(lines) + "\n"
