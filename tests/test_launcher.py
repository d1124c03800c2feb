"""`colls run` on real processes: environment, output prefixes, failure handling, timeout, cleanup."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from colls.launcher import cleanup_job_segments, job_environment, launch
from transports.base import process_alive
from transports.segment import _unmapped, mpich_segments

REPO_ROOT = Path(__file__).resolve().parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """Our environment with the repo importable, so children find `colls` even when not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.pop("COLLS_TRANSPORT", None)
    env.update(extra)
    return env


def colls_run(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """`colls run args…` through `python -m colls.cli`, output captured as text."""
    return subprocess.run([sys.executable, "-m", "colls.cli", "run", *args], cwd=cwd, env=child_env(**env),
                          capture_output=True, text=True, timeout=60)


def wait_until(condition, seconds: float) -> bool:
    """Poll `condition()` until it holds (True) or `seconds` pass (False): for a state another
    process reaches in its own time, which a busy machine may delay."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def write_script(tmp_path: Path, name: str, body: str) -> str:
    """Write a helper program into tmp_path and return its path."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


ENV_PRINTER = """
    import os, stat, sys
    keys = ["COLLS_RANK", "COLLS_WORLD_SIZE", "COLLS_LOCAL_RANK", "COLLS_TRANSPORT", "COLLS_JOB",
            "COLLS_RENDEZVOUS", "PYTHONUNBUFFERED"]
    print(" ".join(f"{key}={os.environ.get(key)}" for key in keys))
    mode = stat.S_IMODE(os.stat(os.environ["COLLS_RENDEZVOUS"]).st_mode)
    print(f"rendezvous mode {mode:o}", file=sys.stderr)
    print("args", sys.argv[1:])
"""


def parse_env_lines(stdout: str) -> dict[int, dict[str, str]]:
    """{rank: {variable: value}} from ENV_PRINTER's prefixed lines."""
    found = {}
    for line in stdout.splitlines():
        match = re.fullmatch(r"\[(\d+)\] (COLLS_RANK=.*)", line)
        if match:
            found[int(match.group(1))] = dict(item.split("=", 1) for item in match.group(2).split())
    return found


@pytest.mark.timeout(60)
def test_every_rank_gets_its_environment_and_prefixed_output(tmp_path: Path) -> None:
    script = write_script(tmp_path, "env.py", ENV_PRINTER)
    result = colls_run("-n", "3", script, "-n", "7", "--flag")
    assert result.returncode == 0, result.stderr
    ranks = parse_env_lines(result.stdout)
    assert sorted(ranks) == [0, 1, 2]
    jobs = {variables["COLLS_JOB"] for variables in ranks.values()}
    rendezvous = {variables["COLLS_RENDEZVOUS"] for variables in ranks.values()}
    assert len(jobs) == 1 and re.fullmatch(r"[0-9a-f]{12}", jobs.pop())
    assert len(rendezvous) == 1 and os.path.basename(rendezvous.pop()).startswith("colls-rdv-")
    for rank, variables in ranks.items():
        assert variables["COLLS_RANK"] == variables["COLLS_LOCAL_RANK"] == str(rank)
        assert variables["COLLS_WORLD_SIZE"] == "3"
        assert variables["COLLS_TRANSPORT"] == "shm"
        assert variables["PYTHONUNBUFFERED"] == "1"
        assert f"[{rank}] args ['-n', '7', '--flag']" in result.stdout.splitlines()
        assert f"[{rank}] rendezvous mode 700" in result.stderr.splitlines()


@pytest.mark.timeout(60)
def test_ranks_share_the_cpus_as_openmp_threads_unless_told_otherwise(tmp_path: Path) -> None:
    script = write_script(tmp_path, "threads.py", """
        import os
        print("threads", os.environ.get("OMP_NUM_THREADS"))
    """)
    env = child_env()
    env.pop("OMP_NUM_THREADS", None)
    shared = subprocess.run([sys.executable, "-m", "colls.cli", "run", "-n", "2", script], env=env,
                            capture_output=True, text=True, timeout=60)
    told = colls_run("-n", "2", script, OMP_NUM_THREADS="3")
    each = max(1, len(os.sched_getaffinity(0)) // 2)
    assert sorted(shared.stdout.splitlines()) == [f"[0] threads {each}", f"[1] threads {each}"], shared.stderr
    assert sorted(told.stdout.splitlines()) == ["[0] threads 3", "[1] threads 3"], told.stderr


@pytest.mark.timeout(60)
def test_rendezvous_directory_is_removed(tmp_path: Path) -> None:
    script = write_script(tmp_path, "env.py", ENV_PRINTER)
    result = colls_run("-n", "2", script)
    directory = parse_env_lines(result.stdout)[0]["COLLS_RENDEZVOUS"]
    assert result.returncode == 0 and not os.path.exists(directory)


@pytest.mark.timeout(60)
def test_transport_flag_wins_and_exported_transport_is_kept(tmp_path: Path) -> None:
    script = write_script(tmp_path, "env.py", ENV_PRINTER)
    flagged = colls_run("-n", "1", "--transport", "mpi", script, COLLS_TRANSPORT="local")
    exported = colls_run("-n", "1", script, COLLS_TRANSPORT="local")
    assert parse_env_lines(flagged.stdout)[0]["COLLS_TRANSPORT"] == "mpi"
    assert parse_env_lines(exported.stdout)[0]["COLLS_TRANSPORT"] == "local"
    refused = colls_run("-n", "1", script, COLLS_TRANSPORT="pigeon")   # before any rank starts
    assert refused.returncode == 2 and "COLLS_TRANSPORT='pigeon': choose one of" in refused.stderr


@pytest.mark.timeout(60)
def test_module_form_passes_arguments(tmp_path: Path) -> None:
    write_script(tmp_path, "hello_module.py", """
        import os, sys
        print("module", os.environ["COLLS_RANK"], sys.argv[1:])
    """)
    result = colls_run("-n", "2", "-m", "hello_module", "-n", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[0] module 0 ['-n', 'x']", "[1] module 1 ['-n', 'x']"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "mpi"])
def test_python_first_as_under_mpiexec(tmp_path: Path, transport: str) -> None:
    """`colls run -n 2 python script.py args` and `... python -m module args`, the mpiexec habit (it
    ran `python` as the script: "can't open file .../python")."""
    if transport == "mpi" and not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    script = write_script(tmp_path, "who.py", """
        import os, sys
        print("rank", os.environ.get("COLLS_RANK") or os.environ["PMI_RANK"], sys.argv[1:])
    """)
    write_script(tmp_path, "who_module.py", "import runpy\nrunpy.run_path('who.py')\n")
    expected = ["[0] rank 0 ['-n', 'x']", "[1] rank 1 ['-n', 'x']"]
    for python in ("python", sys.executable):
        for program in ([script], ["-m", "who_module"]):
            done = colls_run("--transport", transport, "-n", "2", python, *program, "-n", "x", cwd=tmp_path,
                             PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
            assert done.returncode == 0, done.stderr[-500:]
            assert sorted(done.stdout.splitlines()) == expected, (python, program, done.stdout)


@pytest.mark.timeout(60)
def test_a_python_that_is_not_there_or_has_nothing_to_run_is_refused(tmp_path: Path) -> None:
    done = colls_run("-n", "2", "python9.99", "x.py")
    assert done.returncode == 2 and "python9.99: no such Python on PATH" in done.stderr
    done = colls_run("-n", "2", "python")
    assert done.returncode == 2 and "nothing to run: give python a script" in done.stderr


@pytest.mark.timeout(60)
def test_lines_are_never_split_and_a_last_partial_line_is_ended(tmp_path: Path) -> None:
    script = write_script(tmp_path, "chatty.py", """
        import os, sys
        rank = os.environ["COLLS_RANK"]
        for index in range(300):
            print(f"rank {rank} line {index} " + "x" * 200)
        sys.stdout.write("no newline")
    """)
    result = colls_run("-n", "3", script)
    lines = result.stdout.splitlines()
    assert len(lines) == 3 * 301
    for line in lines:
        assert re.fullmatch(r"\[(\d)\] (rank \1 line \d+ x{200}|no newline)", line), line


@pytest.mark.timeout(60)
def test_failing_rank_returns_its_code_and_stops_the_others(tmp_path: Path) -> None:
    script = write_script(tmp_path, "fail.py", """
        import os, sys, time
        if os.environ["COLLS_RANK"] == "1":
            time.sleep(0.3)
            sys.exit(3)
        time.sleep(120)
    """)
    start = time.monotonic()
    result = colls_run("-n", "3", script)
    assert result.returncode == 3
    assert time.monotonic() - start < 15
    assert "colls run: rank 1 exited with code 3" in result.stderr


@pytest.mark.timeout(60)
def test_rank_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    script = write_script(tmp_path, "stubborn.py", """
        import os, signal, sys, time
        if os.environ["COLLS_RANK"] == "0":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            print("ignoring SIGTERM", flush=True)
            time.sleep(120)
        time.sleep(0.5)
        sys.exit(2)
    """)
    start = time.monotonic()
    result = colls_run("-n", "2", script)
    assert result.returncode == 2
    assert time.monotonic() - start < 20


@pytest.mark.timeout(60)
def test_rank_killed_by_a_signal_is_named(tmp_path: Path) -> None:
    script = write_script(tmp_path, "killed.py", """
        import os, signal, time
        if os.environ["COLLS_RANK"] == "2":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)
    """)
    result = colls_run("-n", "3", script)
    assert result.returncode == 128 + signal.SIGKILL
    assert "colls run: rank 2 killed by signal SIGKILL" in result.stderr


@pytest.mark.timeout(60)
def test_timeout_kills_the_job_with_124(tmp_path: Path) -> None:
    script = write_script(tmp_path, "sleepy.py", "import time\ntime.sleep(120)\n")
    start = time.monotonic()
    result = colls_run("-n", "2", "--timeout", "1", script)
    assert result.returncode == 124
    assert time.monotonic() - start < 15
    assert "timed out" in result.stderr


@pytest.mark.timeout(60)
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_segment_left_by_a_crashed_rank_is_removed(tmp_path: Path) -> None:
    script = write_script(tmp_path, "leaky.py", """
        import os, sys
        job = os.environ["COLLS_JOB"]
        print("job", job)
        if os.environ["COLLS_RANK"] == "1":
            os.close(os.open(f"/dev/shm/colls-{job}-x", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            sys.exit(1)
    """)
    result = colls_run("-n", "2", script)
    job = re.search(r"job ([0-9a-f]+)", result.stdout).group(1)
    assert result.returncode == 1
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"colls-{job}-")]
    assert "removed 1 shared-memory segment" in result.stderr


@pytest.mark.timeout(30)
@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_cleanup_job_segments_removes_only_that_job() -> None:
    ours, theirs = "/dev/shm/colls-testjob01-a", "/dev/shm/colls-testjob02-a"
    for path in (ours, theirs, ours[:-1] + "b"):
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    try:
        assert cleanup_job_segments("testjob01") == 2
        assert not os.path.exists(ours) and os.path.exists(theirs)
    finally:
        cleanup_job_segments("testjob02")
    assert not os.path.exists(theirs)


@pytest.mark.timeout(60)
def test_interrupt_to_the_launcher_stops_every_rank(tmp_path: Path) -> None:
    script = write_script(tmp_path, "waiter.py", f"""
        import os, time
        open(os.path.join({str(tmp_path)!r}, "pid." + os.environ["COLLS_RANK"]), "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    launcher = subprocess.Popen([sys.executable, "-m", "colls.cli", "run", "-n", "2", script],
                                env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("pid.*"))) < 2 or any(not p.read_text() for p in tmp_path.glob("pid.*")):
        assert time.monotonic() < deadline, "ranks never started"
        time.sleep(0.05)
    launcher.send_signal(signal.SIGINT)
    _, stderr = launcher.communicate(timeout=20)
    assert launcher.returncode == 130
    assert "received SIGINT" in stderr
    for pid_file in tmp_path.glob("pid.*"):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid_file.read_text()), 0)


@pytest.mark.timeout(60)
def test_launch_function_runs_a_program(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    script = write_script(tmp_path, "ok.py", "import os\nprint('size', os.environ['COLLS_WORLD_SIZE'])\n")
    assert launch([script], nprocs=2, env={"COLLS_TRANSPORT": "local"}) == 0
    assert sorted(capfd.readouterr().out.splitlines()) == ["[0] size 2", "[1] size 2"]


def test_job_environment_and_bad_arguments() -> None:
    assert job_environment(1, 4, "shm", "rendezvous-dir", "abc")["COLLS_LOCAL_RANK"] == "1"
    with pytest.raises(ValueError):
        launch(["x.py"], nprocs=0)
    with pytest.raises(ValueError):
        launch([], nprocs=2)
    with pytest.raises(ValueError, match="timeout"):
        launch(["x.py"], nprocs=1, timeout=float("nan"))   # (found by review: NaN meant none)


@pytest.mark.timeout(60)
def test_cli_lists_only_implemented_commands_and_rejects_a_missing_program() -> None:
    help_text = subprocess.run([sys.executable, "-m", "colls.cli", "--help"], env=child_env(),
                               capture_output=True, text=True).stdout
    for command in ("run", "tune", "fuzz", "train", "bench", "plan", "config"):
        assert f"    {command} " in help_text, command
    assert colls_run("-n", "2").returncode == 2


@pytest.mark.timeout(120)
def test_demo_runs_on_three_ranks() -> None:
    result = colls_run("-n", "3", "-m", "colls.demo")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert sorted(line[:4] for line in lines) == ["[0] ", "[1] ", "[2] "]
    assert all(line.endswith("correct") and "of 3 over shm" in line for line in lines)


MPIEXEC = Path(sys.executable).parent / "mpiexec"
needs_mpiexec = pytest.mark.skipif(not MPIEXEC.exists(),
                                   reason="mpiexec is not installed (pip install 'colls[mpi]')")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport,signum", [("mpi", signal.SIGTERM), ("shm", signal.SIGHUP),
                                              ("mpi", signal.SIGHUP)])
def test_a_terminating_signal_to_the_launcher_stops_every_rank(tmp_path: Path, transport, signum) -> None:
    """Found by review: under --transport mpi a SIGTERM left mpiexec and every rank
    running (mpiexec leads a session of its own), and a SIGHUP (a closed terminal) orphaned the
    ranks on either transport."""
    if transport == "mpi" and not MPIEXEC.exists():
        pytest.skip("mpiexec is not installed (pip install 'colls[mpi]')")
    script = write_script(tmp_path, "waiter.py", f"""
        import os, time
        rank = os.environ.get("COLLS_RANK") or os.environ["PMI_RANK"]
        open(os.path.join({str(tmp_path)!r}, "pid." + rank), "w").write(str(os.getpid()))
        time.sleep(120)
    """)
    launcher = subprocess.Popen([sys.executable, "-m", "colls.cli", "run", "--transport", transport,
                                 "-n", "2", script], env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 40
    while len(list(tmp_path.glob("pid.*"))) < 2 or any(not p.read_text() for p in tmp_path.glob("pid.*")):
        assert time.monotonic() < deadline, "ranks never started"
        time.sleep(0.05)
    launcher.send_signal(signum)
    _, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + signum
    assert f"received {signal.Signals(signum).name}" in stderr
    # gone when the launcher returns, under mpiexec too, where MPI's proxies stop the ranks in
    # their own time (on a busy machine, seconds after mpiexec ended): colls run waits for them.
    # (A rank whose parent, the proxy, was killed may stay a zombie where nobody reaps it.)
    pids = [int(pid_file.read_text()) for pid_file in tmp_path.glob("pid.*")]
    assert not [pid for pid in pids if process_alive(pid)], "ranks still running after colls run returned"


@pytest.mark.timeout(90)
@needs_mpiexec
def test_a_rank_that_exits_before_init_under_mpiexec_ends_the_job(tmp_path: Path) -> None:
    """Found by review: the others wait in MPI_Init (no deadline) for a rank that
    exited with a code (not a signal) before it got there, and the job never ended; their MPICH
    segment stayed in /dev/shm when they were stopped."""
    script = write_script(tmp_path, "early.py", f"""
        import os, time
        open(os.path.join({str(tmp_path)!r}, "pid." + os.environ["PMI_RANK"]), "w").write(str(os.getpid()))
        if os.environ["PMI_RANK"] == "2":
            time.sleep(0.5)
            raise SystemExit("rank 2 fails before colls.init")
        import colls
        colls.init()
    """)
    before = mpich_segments()
    began = time.monotonic()
    done = colls_run("--transport", "mpi", "-n", "3", script)
    assert done.returncode == 1, done.stderr[-500:]
    assert "rank 2 exited with code 1" in done.stderr
    assert time.monotonic() - began < 30
    # our ranks are gone, and none of their segments is left: a new one still there is another
    # job's (tests and jobs may run beside this one), mapped by that job's live ranks
    pids = [int(pid_file.read_text()) for pid_file in tmp_path.glob("pid.*")]
    assert not [pid for pid in pids if process_alive(pid)], "ranks still running after colls run returned"
    assert not _unmapped(mpich_segments() - before), mpich_segments() - before


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["mpi", "shm"])
@needs_mpiexec
def test_a_rank_that_raises_between_collectives_under_mpiexec_releases_its_peers(tmp_path: Path,
                                                                                  transport) -> None:
    """Found by review: under mpiexec a rank that raised outside a collective waited in
    MPI_Finalize while its peers waited for it in their next collective, until their deadline (five
    minutes by default), and nobody named it. It now aborts the world as it goes."""
    script = write_script(tmp_path, "raiser.py", """
        import numpy as np
        import colls
        comm = colls.init()
        for step in range(50):
            if comm.rank == 2 and step == 5:
                raise RuntimeError("boom at step 5")
            comm.all_reduce(np.ones(1000))
    """)
    began = time.monotonic()
    done = subprocess.run([str(MPIEXEC), "-n", "3", sys.executable, script], env=child_env(
        COLLS_TRANSPORT=transport, COLLS_TIMEOUT="120"), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert time.monotonic() - began < 30
    reported = done.stderr.count("rank 2 ended with an uncaught RuntimeError: boom at step 5")
    assert reported == 2, done.stderr[-800:]   # by ranks 0 and 1, in their CommunicatorAborted


@pytest.mark.timeout(90)
@needs_mpiexec
def test_ranks_under_an_outer_launcher_form_a_job_of_their_own(tmp_path: Path) -> None:
    """Found by review: `colls.spawn` under mpiexec, and `colls run` with an MVAPICH
    rank variable set, gave ranks that each joined the outer job (worlds of one) instead of theirs."""
    spawner = write_script(tmp_path, "spawner.py", """
        import colls
        print(colls.spawn(lambda comm: (comm.rank, comm.size), 2, timeout=30), flush=True)
    """)
    done = subprocess.run([str(MPIEXEC), "-n", "1", sys.executable, spawner], env=child_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[(0, 2), (1, 2)]", done.stderr[-500:]
    who = write_script(tmp_path, "who.py", "import colls\nc = colls.init()\nprint('size', c.size)\n")
    done = colls_run("-n", "2", who, MV2_COMM_WORLD_RANK="0")
    assert sorted(done.stdout.splitlines()) == ["[0] size 2", "[1] size 2"], done.stderr[-500:]


@pytest.mark.timeout(60)
def test_the_rendezvous_waits_as_long_as_init_is_told(tmp_path: Path) -> None:
    """Found by review: `colls.init(timeout=2)` waited its rendezvous' fixed 60 s for a
    rank that never came."""
    script = write_script(tmp_path, "absent.py", """
        import os, sys, time
        if os.environ["COLLS_RANK"] == "1":
            sys.exit(0)            # never calls colls.init
        import colls
        began = time.monotonic()
        try:
            colls.init(timeout=2)
        finally:
            print(f"after {time.monotonic() - began:.1f} s", flush=True)
    """)
    done = colls_run("-n", "2", script)
    assert done.returncode == 1
    waited = float(re.search(r"\[0\] after ([0-9.]+) s", done.stdout).group(1))
    assert 1.9 <= waited < 5.0, done.stdout


@pytest.mark.timeout(60)
def test_a_signal_ignored_by_whoever_started_the_launcher_stays_ignored(tmp_path: Path) -> None:
    """`nohup colls run …`: a SIGHUP the launcher was started ignoring stops nothing."""
    script = write_script(tmp_path, "nap.py", f"""
        import os, time
        open(os.path.join({str(tmp_path)!r}, "up." + os.environ["COLLS_RANK"]), "w").close()
        time.sleep(2)
        print('slept')
    """)
    launcher = subprocess.Popen([sys.executable, "-m", "colls.cli", "run", "-n", "2", script],
                                env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    # while the ranks run (a fixed sleep could let a busy machine's job end first, or not begin)
    assert wait_until(lambda: len(list(tmp_path.glob("up.*"))) == 2, 30), "ranks never started"
    launcher.send_signal(signal.SIGHUP)
    stdout, stderr = launcher.communicate(timeout=30)
    assert launcher.returncode == 0, stderr
    assert sorted(stdout.splitlines()) == ["[0] slept", "[1] slept"]
