"""`colls fuzz`: bounded runs on every transport, and proof that it catches planted faults.

The fault tests plant each bug of `planted_faults.py` (a test-only plugin: `--plugin`) in a `colls fuzz`
subprocess and require it to be reported within a bounded number of programs, shrunk to a program
of at most three steps, replayed by the printed seed with the same failure (and passing without the
fault), and reproduced by the printed snippet. The oracle's claims (exact in any order) are checked
directly, without ranks.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from planted_faults import planted

from colls.fuzz import Program, Step, fuzz, judge, make_group
from colls.fuzz.oracle import DTYPES, inputs, matmul, reduced, valid_ops
from colls.fuzz.program import INVALID, Space, programs
from colls.fuzz.session import Verdict
from colls.fuzz.snippet import render

REPO_ROOT = Path(__file__).resolve().parent.parent
PLANTED = Path(__file__).resolve().parent / "planted_faults.py"   # the faults, as a fuzzer plugin
KNOWN_BUGS: list[str] = []   # e.g. ["--skip", "all_to_all:inplace"] while a bug the fuzzer found is open


def child_env(**extra: str) -> dict[str, str]:
    """Our environment with the repo importable and no fault planted unless asked."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    for name in ("COLLS_TRANSPORT", "COLLS_ALGO"):
        env.pop(name, None)
    env.update(extra)
    return env


def colls_fuzz(*args: str, timeout: float = 120, mpiexec: list[str] | None = None,
               **env: str) -> subprocess.CompletedProcess:
    """`colls fuzz args…` as a subprocess (under `mpiexec` if given), output captured."""
    command = [*(mpiexec or []), sys.executable, "-m", "colls.cli", "fuzz", *args]
    return subprocess.run(command, env=child_env(**env), capture_output=True, text=True, timeout=timeout)


def find_mpiexec() -> str:
    """mpiexec beside this Python (pip's mpich) or on PATH, else skip."""
    pytest.importorskip("mpi4py")
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec (pip install mpich)")
    return found


def summary_counts(stdout: str) -> tuple[int, int]:
    """(programs, ops) from the summary's last line."""
    match = re.search(r"^([\d,]+) programs \([\d.]+/s\), ([\d,]+) ops", stdout, re.M)
    assert match, stdout
    return int(match.group(1).replace(",", "")), int(match.group(2).replace(",", ""))


# -- bounded runs on every transport ---------------------------------------------------------------

@pytest.mark.timeout(120)
def test_bounded_run_local_in_process() -> None:
    stats, found = fuzz("local", (1, 6), programs=150, seed=1, deadline_s=30)
    assert found is None
    assert stats.programs == 150 and stats.steps >= 150 and stats.total_bytes > 0
    assert {"all_reduce", "all_to_all_v", "scatter", "split"} <= set(stats.calls)


@pytest.mark.timeout(120)
def test_bounded_run_shm() -> None:
    result = colls_fuzz("--transport", "shm", "--ranks", "2-5", "--programs", "120", "--seed", "2",
                        *KNOWN_BUGS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "colls fuzz: shm, 2-5 ranks, seed 2, 120 programs" in result.stdout
    programs_run, ops = summary_counts(result.stdout)
    assert programs_run == 120 and ops >= 120
    assert re.search(r"^all_reduce\s+\d+", result.stdout, re.M)   # the summary table


@pytest.mark.mpi
@pytest.mark.timeout(180)
def test_bounded_run_mpi_under_mpiexec_and_self_launched() -> None:
    mpiexec = find_mpiexec()
    result = colls_fuzz("--transport", "mpi", "--programs", "80", "--seed", "3", *KNOWN_BUGS,
                        mpiexec=[mpiexec, "-n", "4"], timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mpi, 2-4 ranks" in result.stdout and summary_counts(result.stdout)[0] == 80
    # without mpiexec, --transport mpi starts its own: one header, one summary (rank 0 only)
    result = colls_fuzz("--transport", "mpi", "--ranks", "2-3", "--programs", "20", "--seed", "4",
                        *KNOWN_BUGS, timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("colls fuzz: mpi, 2-3 ranks") == 1 and summary_counts(result.stdout)[0] == 20


# -- the fuzzer catches planted faults -------------------------------------------------------------

# fault -> (options, the failure kind it must be reported as); seeds fixed so the bounds are stable
FAULT_RUNS = {
    "block_boundary": (["--seed", "7", "--ranks", "2-5"], ("wrong result", "crash")),
    "ring_wrong_peer": (["--seed", "7", "--ranks", "3", "--deadline", "0.3"], ("timeout",)),
    "odd_skip_reduction": (["--seed", "7", "--ranks", "2-5"], ("wrong result",)),
    "op_order": (["--seed", "7", "--ranks", "2-5"], ("wrong result",)),
}
MAX_PROGRAMS = 300
MAX_SHRUNK_STEPS = 3


def parse_failure(stdout: str) -> dict[str, object]:
    """The facts a failing run prints: where it failed, how fast, how small, the replay seed."""
    head = re.search(r"^FAILED on \w+: rank (\d+), step (\d+) (\S+?)\(.*?: ([a-z ]+): (\w+)", stdout, re.M)
    found = re.search(r"^found after (\d+) programs?.* to (\d+) steps? on (\d+) ranks:", stdout, re.M)
    replay = re.search(r"^replay: .*--replay (\S+)$", stdout, re.M)
    snippet = re.search(r"^(# colls fuzz on .*?print\(\"passed\"\)\n)", stdout, re.M | re.S)
    assert head and found and replay and snippet, stdout
    return {"rank": int(head.group(1)), "step": int(head.group(2)), "collective": head.group(3),
            "kind": head.group(4), "error": head.group(5), "programs": int(found.group(1)),
            "steps": int(found.group(2)), "seed": replay.group(1), "snippet": snippet.group(1)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", sorted(FAULT_RUNS))
def test_planted_fault_is_caught_shrunk_and_replayed(fault: str, tmp_path: Path) -> None:
    options, kinds = FAULT_RUNS[fault]
    result = colls_fuzz("--transport", "local", "--programs", str(MAX_PROGRAMS), "--max-bytes", "65536",
                        "--shrink-seconds", "60", "--quiet", *KNOWN_BUGS, *options,
                        "--plugin", f"{PLANTED}:{fault}")
    assert result.returncode == 1, result.stdout + result.stderr
    failure = parse_failure(result.stdout)
    assert failure["kind"] in kinds, result.stdout
    assert failure["programs"] <= MAX_PROGRAMS
    assert failure["steps"] <= MAX_SHRUNK_STEPS, result.stdout
    assert f"colls fuzz --plugin {PLANTED}:{fault} --transport local --replay" in result.stdout

    # the printed seed reruns the very program: the same failure with the fault, a pass without it
    deadline = options[options.index("--deadline") + 1] if "--deadline" in options else "30"
    again = colls_fuzz("--replay", failure["seed"], "--deadline", deadline, "--plugin", f"{PLANTED}:{fault}")
    assert again.returncode == 1, again.stdout + again.stderr
    replayed = re.search(r"^rank \d+, step (\d+) (\S+?)\(.*?: ([a-z ]+): ", again.stdout, re.M)
    assert replayed, again.stdout
    assert (int(replayed.group(1)), replayed.group(2)) == (failure["step"], failure["collective"])
    assert colls_fuzz("--replay", failure["seed"], "--transport", "shm").returncode == 0

    # and the snippet is a script that reproduces it on its own (not for the hang: 10 s per call)
    if fault != "ring_wrong_peer":
        script = tmp_path / "snippet.py"
        script.write_text(failure["snippet"])
        faulty = subprocess.run([sys.executable, str(script)], env=child_env(),
                                capture_output=True, text=True, timeout=60)
        # the same way: a wrong result fails a check, a crash raises the same exception
        raised = "AssertionError" if failure["kind"] == "wrong result" else str(failure["error"])
        assert faulty.returncode != 0 and raised in faulty.stderr + faulty.stdout
        # the snippet loads the plugin itself; without those lines it passes
        assert f"load('{PLANTED}:{fault}')" in failure["snippet"]
        script.write_text("\n".join(line for line in failure["snippet"].splitlines()
                                     if "colls.fuzz.plugins" not in line and not line.startswith("load(")))
        clean = subprocess.run([sys.executable, str(script)], env=child_env(), capture_output=True,
                               text=True, timeout=60)
        assert clean.returncode == 0 and "passed" in clean.stdout, clean.stderr


@pytest.mark.timeout(120)
def test_planted_fault_on_shm_processes() -> None:
    result = colls_fuzz("--transport", "shm", "--ranks", "2-5", "--programs", str(MAX_PROGRAMS),
                        "--seed", "7", "--max-bytes", "65536", "--quiet", *KNOWN_BUGS,
                        "--plugin", f"{PLANTED}:odd_skip_reduction")
    assert result.returncode == 1, result.stdout + result.stderr
    failure = parse_failure(result.stdout)
    assert failure["collective"] == "reduce" and failure["kind"] == "wrong result"
    assert failure["steps"] <= MAX_SHRUNK_STEPS


@pytest.mark.timeout(120)
def test_registered_buffers_on_shm_processes_pass() -> None:
    # every message of 64 B or more from a registered buffer goes mapped: the fuzzer's small ones too
    result = colls_fuzz("--transport", "shm", "--ranks", "2-5", "--programs", str(MAX_PROGRAMS),
                        "--seed", "11", "--max-bytes", "65536", "--registered", "--quiet", *KNOWN_BUGS,
                        COLLS_SHM_MAPPED_BYTES="64")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failing programs" in result.stdout


@pytest.mark.timeout(60)
def test_a_crash_names_the_rank_and_the_step() -> None:
    # block_boundary cuts the ring all-gather's last block one element short: a rank's first exchange
    # receives that short block while its owner sends its whole input (the own block is copied only
    # after the first exchange), so the receiver stops on the size: CollectiveMismatch
    program = Program(3, 5, (Step("barrier"), Step("all_gather", algorithm="ring", rows=4)))
    group = make_group("local", 3)
    with planted("block_boundary"):
        verdict = judge(program, group.run(program, 5.0), 5.0)
    primary = verdict.primary
    assert primary is not None and primary["step"] == 1 and primary["kind"] == "crash"
    assert "all_gather(ring" in primary["label"] and "CollectiveMismatch" in primary["message"]
    assert judge(program, group.run(program, 5.0), 5.0).ok   # and nothing is left planted


def test_the_primary_failure_is_the_cause_not_an_abort_that_reached_an_earlier_step() -> None:
    # rank 0 was still in its barrier (step 0) when rank 2's crash in step 1 aborted it
    aborted = {"rank": 0, "step": 0, "kind": "aborted", "label": "barrier", "detail": "",
               "message": "CommunicatorAborted: rank 0: rank 2 failed in world all_gather #1"}
    crash = {"rank": 2, "step": 1, "kind": "crash", "label": "all_gather(ring)", "detail": "",
             "message": "ValueError"}
    wrong = {"rank": 1, "step": 3, "kind": "wrong result", "label": "reduce", "detail": "", "message": ""}
    assert Verdict([aborted, crash], {}, {}).primary is crash
    assert Verdict([wrong, crash], {}, {}).primary is crash            # the earlier step first
    assert Verdict([aborted], {}, {}).primary is aborted


@pytest.mark.timeout(60)
def test_the_first_bug_it_found_stays_fixed() -> None:
    """The fuzzer's first find, as it shrank it: all_to_all(x, out=x) overwrote blocks it had yet to
    send (fixed in 9cf9bff)."""
    program = Program.from_token("c1.eNqrVirOrEpVsjLWUSpOTU1RsjIAMkpSC4qVrKKrlbIz84BCSok5OfEl-fFASklHKTc_"
                                 "BaheKTOvICcxOVWpNrYWAOsRFlM")
    assert program.steps == (Step("all_to_all", rows=1, mode="inplace"),) and program.size == 3
    for transport in ("local", "shm"):
        group = make_group(transport, 3)
        try:
            verdict = judge(program, group.run(program, 10.0), 10.0)
        finally:
            group.close()
        assert verdict.ok, verdict.primary


def test_every_bad_call_fails_at_once_whatever_salt_a_program_draws() -> None:
    """Found with both cores loaded: the `src` bad call with salt 1 (an invalid step's root) asked to
    receive from rank -2, which is colls.ANY_SOURCE, and waited for a message that never came."""
    steps = tuple(Step("invalid", bad=bad, root=salt) for bad in sorted(INVALID) for salt in range(16))
    program = Program(2, 0, steps)
    group = make_group("local", 2)
    try:
        verdict = judge(program, group.run(program, 30.0), 30.0)
    finally:
        group.close()
    assert verdict.ok, verdict.primary


@pytest.mark.parametrize("transport", ["local", "shm"])
def test_an_all_gather_from_its_own_block_of_out_runs_and_prints_as_such(transport) -> None:
    """The in-place all_gather (the input is this rank's block of the output, as MPI_IN_PLACE and
    torch's all_gather_into_tensor have it), each algorithm, as a run and as its printed snippet.
    With the input taken from block 0 instead of its own, the fuzzer finds it in its first programs."""
    import colls

    for algorithm in (None, *colls.algorithms("all_gather")):
        program = Program(3, 7, (Step("all_gather", rows=2, tail=(3,), mode="inplace", algorithm=algorithm),))
        group = make_group(transport, 3)
        try:
            verdict = judge(program, group.run(program, 10.0), 10.0)
        finally:
            group.close()
        assert verdict.ok, (algorithm, verdict.primary)
        namespace: dict[str, object] = {}
        exec(compile(render(program, "local"), "<snippet>", "exec"), namespace)
        colls.spawn(namespace["program"], program.size, transport="local", timeout=30)


# -- the machinery without ranks -------------------------------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(programs(Space(1, 8, max_steps=12)))
def test_programs_round_trip_through_their_seed_and_render_as_python(program: Program) -> None:
    assert Program.from_token(program.token()) == program
    compile(render(program, "shm"), "<snippet>", "exec")
    compile(render(program, "mpi"), "<snippet>", "exec")


@pytest.mark.timeout(120)
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(programs(Space(1, 5, max_steps=8, max_bytes=1 << 14)))
def test_snippets_run_the_programs_they_print(program: Program) -> None:
    """The snippet is the program: exec it on local ranks and it passes as the fuzzer's run does."""
    import colls

    namespace: dict[str, object] = {}
    exec(compile(render(program, "local"), "<snippet>", "exec"), namespace)
    colls.spawn(namespace["program"], program.size, transport="local", timeout=30)


@pytest.mark.parametrize("dtype", DTYPES)
def test_oracle_inputs_reduce_exactly_in_any_order(dtype: str) -> None:
    """What the bitwise checks rest on: any order or bracketing of a reduction gives the same bytes."""
    rng = np.random.default_rng(0)
    for op, size in itertools.product(valid_ops(dtype), (2, 5, 8)):
        xs = inputs(3, 1, size, "all_reduce", 50, dtype, (2,), op)
        want = reduced(xs, op).tobytes()
        if op == "MATMUL":   # not commutative: only the bracketing may change
            assert _tree(list(xs), matmul).tobytes() == want
            continue
        if op == "AVG":
            continue   # AVG is SUM then one division, and SUM is covered
        ufunc = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
                 "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
        for _ in range(3):
            shuffled = [xs[i] for i in rng.permutation(size)]
            assert _tree(shuffled, ufunc).tobytes() == want, (dtype, op, size)


def _tree(xs: list[np.ndarray], combine) -> np.ndarray:
    while len(xs) > 1:
        xs = [combine(xs[i], xs[i + 1]) if i + 1 < len(xs) else xs[i] for i in range(0, len(xs), 2)]
    return xs[0]


def test_inputs_are_deterministic_and_differ_by_rank_and_step() -> None:
    first = inputs(9, 4, 3, "all_gather", 70000, "float32", (), "SUM")
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, inputs(9, 4, 3, "all_gather", 70000,
                                                                         "float32", (), "SUM"), strict=True))
    assert first[0].tobytes() != first[1].tobytes()
    assert first[0].tobytes() != inputs(9, 5, 3, "all_gather", 70000, "float32", (), "SUM")[0].tobytes()
