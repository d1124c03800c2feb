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


@pytest.mark.timeout(60)
def test_module_form_passes_arguments(tmp_path: Path) -> None:
    write_script(tmp_path, "hello_module.py", """
        import os, sys
        print("module", os.environ["COLLS_RANK"], sys.argv[1:])
    """)
    result = colls_run("-n", "2", "-m", "hello_module", "-n", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[0] module 0 ['-n', 'x']", "[1] module 1 ['-n', 'x']"]


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
    assert job_environment(1, 4, "shm", "/tmp/r", "abc")["COLLS_LOCAL_RANK"] == "1"
    with pytest.raises(ValueError):
        launch(["x.py"], nprocs=0)
    with pytest.raises(ValueError):
        launch([], nprocs=2)


@pytest.mark.timeout(60)
def test_cli_lists_only_implemented_commands_and_rejects_a_missing_program() -> None:
    help_text = subprocess.run([sys.executable, "-m", "colls.cli", "--help"], env=child_env(),
                               capture_output=True, text=True).stdout
    for command in ("run", "tune", "fuzz", "train", "bench", "plan"):
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
