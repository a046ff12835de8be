"""
Run a model-written program against its tests, with timeouts, and make a verdict that nothing the
program does can change; measure whether its entry point uses a helper. Its walls are walls.py's.

    sandbox.run("print(1 + 1)").stdout                          # '2\\n' (a Result: ok, ...)
    sandbox.run_tests(program, test, "add", setup=context)      # TestReport(passed=2, total=3, ...)
    sandbox.run_tests(program, test, "add", helper="aux")       # ... helper_use="used"
    sandbox.run_tests_many([(program, test, "add", context), ...])  # a batch, in parallel, in order
    python -m pytest tests/test_sandbox.py; python tests/bench_sandbox.py  # hostile programs; speed

A tester process runs the test, never the program; a program process serves calls of its entry
point with plain data of exact builtin types, so no lying __eq__ or frame trick reaches the asserts.
A helper's use is the tester's measure, not the program's word. docs/sandbox.md: the threat model.
"""
import ast
import builtins
import dataclasses
import functools
import json
import marshal
import os
import re
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import walls
# walls' functions that ours call inside; sandbox.isolation_level, _PROBE, _encode, _decode as before
from walls import (_PROBE, _answer, _call_text, _clock, _decode, _describe, _encode, _end,  # noqa: F401
                   _exchange, _fork, _messages, _powerless, _raised, _reply, _say, _spawn, isolation_level)

MAX_OUTPUT = 64 * 1024  # bytes kept of stdout and of stderr each
MAX_REPLY = 16 << 20    # bytes of one reply line of the program
GRACE = 3.0             # seconds for start-up and reporting, on top of the timeouts
BACKSTOP = 4            # a test's wall clock, in timeouts, for what the program's CPU time (_clock) misses


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
    failing_call: str | None = None  # its last call of the entry point, as "f(1, [2])" (the test's data)
    wrong_answer: bool = False  # it failed on the test's own check, not on the program's error or time
    helper_use: str = ""  # "used", "wrapped", "unused", "unstable" or "" (not measured): _helper_use

    @property
    def all_passed(self):
        return self.total > 0 and self.passed == self.total


def run(code, timeout=10.0, *, memory_mb=2048, isolation=None, env=None, max_output=MAX_OUTPUT):
    """Run `code` as `python -` runs a script (stdin then at EOF), `timeout` seconds of wall clock.
    -> Result; nothing the code does makes this raise."""
    start = time.monotonic()
    level = isolation or isolation_level()
    job = dict(mode="run", program=code, timeout=float(timeout), isolation=level, memory_mb=memory_mb)
    reports, out, err, truncated, _ = walls.execute(job, None, timeout + GRACE, env, max_output)
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
    # The run's cap, fixed up front: BACKSTOP x `timeout` for loading, each test (and 2 for a helper), GRACE.
    cap = BACKSTOP * timeout * (len(groups) + 1 + 2 * bool(helper)) + GRACE
    rep = TestReport(0, 0, [], None, 0, None, 0.0, isolation=level)
    # A helper is measured where the program has a def of it at the top level (at a line's start).
    defined = helper and re.search(rf"^(async\s+)?def\s+{re.escape(helper)}\b", program, re.MULTILINE)
    job = dict(mode="tests", program=program, entry_point=entry_point, isolation=level,
               memory_mb=memory_mb, helper=helper if defined else None,
               max_reply=MAX_REPLY, supervise="_serve_tests", serve="_serve",  # (our functions inside)
               fresh_scratch=bool(helper))  # (each round of the measure, a /tmp of its own)
    test_job = dict(preamble=preamble, arg=arg, groups=groups, timeout=float(timeout),
                    max_timeouts=max_timeouts, backstop=BACKSTOP)
    reports, rep.stdout, rep.stderr, _, overdue = walls.execute(job, test_job, cap, env, max_output, _abort)
    # The reports come from the tester and the supervisor only, on a pipe no program process holds:
    # each test's (outcome, its statement where it stopped, why, its calls of the entry point, the last
    # one's text, whether its answer was wrong), "loaded", "helper", "done", "stalled", "error", "infra".
    try:  # trusted reports, but a fault there must not raise
        # Past "done" every verdict is in: a failure then (the helper's measure's) leaves helper_use "".
        rep.infra_error = reports.get("infra", [None])[0] if "done" not in reports else None
        rep.error = reports.get("error", [None])[0]
        rep.helper_use = reports.get("helper", [""])[0]
        for index in range(len(groups)):  # a test without a verdict stays "skipped"
            verdict = reports.get(index, ("skipped", None, None, 1, None, 0))
            outcome, statement, why, calls, call, wrong = verdict
            if calls == 0 and outcome == "passed":  # (`assert True`) every program passes it: no test
                continue
            rep.outcomes.append(outcome)
            if outcome != "passed" and rep.failure_reason is None:
                rep.failed_statement, rep.failure_reason, rep.failing_call = statement, why, call
                rep.wrong_answer = bool(wrong)
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
        reports = list(pool.map(one, jobs))
        # A run that failed to start or finish while another held the tasks that runs share (a
        # normal user without a pids cgroup: docs/sandbox.md) goes again, once the batch has ended.
        again = [i for i, report in enumerate(reports) if report.infra_error]
        for i, report in zip(again, pool.map(one, [jobs[i] for i in again])):
            reports[i] = report
        return reports
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


# ------------------------------------------------------------------------------------------
# Inside (walls ships these to its fork server: their globals are walls._BOOT's modules, walls' and ours)


def _serve_tests(job):
    """The supervisor's work for run_tests: the tester, and the relay of its calls to program processes."""
    # The tester (the test, the report pipe) and the program never share a process. Plain data
    # crosses between them, here, and nothing else.
    (ask_r, ask_w), (answer_r, answer_w) = os.pipe(), os.pipe()
    tester = _fork(_tester, (job["test_fd"], ask_w, answer_r), (job["report_fd"],), job, ask_w, answer_r)
    # One program process serves the calls until one times out or ends it; the next call meets a fresh
    # one, so nothing of a broken call reaches the next test. Each call of the helper's measure has its
    # own too, whose calls of the helper the tester makes in the helper's process. We never learn the round.
    role, procs = "", {"": _spawn(job, "")}  # the first loads while the tester reads the test
    for seconds, deadline, call, to in _messages(open(ask_r, "rb")):
        if to == "fresh":  # a call of the helper's measure: the last call's program process ends
            if "" in procs:
                _end(procs.pop(""), 0)
            role, to = "measured", ""
        proc = procs[to] = procs.get(to) or _spawn(job, to or role)  # to: "" (the entry point's) or "helper"
        until = _clock(proc) + seconds  # the program process's CPU time when the test's time runs out
        tag, data = _exchange(proc, call, until, deadline, job["max_reply"])
        left = until - _clock(proc)  # the test's time left (read before _end reaps the process)
        if tag != "R":
            returncode, _ = _end(procs.pop(to), 0)
            if tag == "D" and not data:
                how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
                data = f"the program process ended during the call ({how})"
        os.write(answer_w, marshal.dumps((tag, data, left)))
    # The tester has ended. If SIGPROF killed it, as a test's CPU time ran out (_check), say so.
    if os.waitstatus_to_exitcode(os.waitpid(tester, 0)[1]) == -signal.SIGPROF:
        _say(job["report_fd"], "stalled")


def _serve(job, call_r, reply_w, role):
    """A program process's work for run_tests (walls._program walled it in): load the program, answer
    each call (None: "loaded?") of its entry point, or of its helper where `role` is "helper". Where it
    is "measured" (a round of the helper's measure), the helper's calls go to the tester (_stood_in).
    Nothing here can be trusted once the program runs."""
    namespace = {"__name__": "solution"}  # (no demo runs)
    entry, calls = job["helper"] if role == "helper" else job["entry_point"], open(call_r, "rb")
    try:
        exec(compile(job["program"], "<program>", "exec"), namespace)
        if entry not in namespace:
            raise NameError(f"name {entry!r} is not defined")
        function, helper = namespace[entry], namespace.get(job["helper"])
    except BaseException as e:
        return _reply(reply_w, "F", _describe(e))

    # Measured, the helper is a stand-in of ours from here on (at load time it was the program's own,
    # as in every round), the same in every round: its call goes out as data, and what the tester
    # answers comes back. A thread of the program's own calls the helper itself.
    def stand_in(*args, **kwargs):
        if _thread.get_ident() != main_thread:
            return helper(*args, **kwargs)
        # (Not _reply: its "F" for arguments that are no data would leave us waiting; they raise.)
        os.write(reply_w, json.dumps(_encode(("H", args, kwargs), 0)).encode() + b"\n")
        tag, value = marshal.load(calls)
        if tag == "R":
            return value
        raise getattr(builtins, value[0])(value[1])
    if role == "measured":
        namespace[job["helper"]], main_thread = stand_in, _thread.get_ident()
    # Each call is (args, kwargs) of plain data, from the tester's marshal; None asks "loaded?".
    # Marshal only ever carries what trusted code wrote (marshal.load is not safe on hostile bytes),
    # so what the program sends back is JSON.
    for call in _messages(calls):
        try:
            reply = "R", function(*call[0], **call[1]) if call else None
        except BaseException as e:
            reply = _raised(e)
        _reply(reply_w, *reply)


def _altered(value):
    """The helper's result changed: a number negated, a text one NUL longer, a container's last item
    (a set's least) altered or dropped; a bool becomes an int (2, -1), since its one other value is
    what any bool answer that changes becomes; None becomes 0."""
    kind = type(value)
    last = next(reversed(value)) if kind is dict and value else None  # (a dict's last key)
    changes = {type(None): lambda v: 0, bool: lambda v: 2 if v else -1, int: lambda v: ~v,
               float: lambda v: -v - 1.5, complex: lambda v: -v - 1.5,
               str: lambda v: v + "\0", bytes: lambda v: v + b"\0",
               list: lambda v: [*v[:-1], _altered(v[-1])] if v else [None],
               tuple: lambda v: (*v[:-1], _altered(v[-1])) if v else (None,),
               set: lambda v: v - {min(v, key=repr)} if v else {None},
               dict: lambda v: {**v, last: _altered(v[last])} if v else {None: 0}}
    return changes[kind](value)


def _tester(job, ask_w, answer_r):
    """Run the test, the entry point a proxy of the program process (_program); report each verdict."""
    report = job["report_fd"]
    _powerless(job)
    # The test comes from a file that only this process opens, so no program process ever holds it.
    test = marshal.load(open(job["test_fd"], "rb"))
    answers = open(answer_r, "rb")
    # The running test's time left (_allow), calls of the entry point, and failure (tag, why) once one failed
    running = {"entry": job["entry_point"]}
    answered = []  # with a helper: each call, its answer's hash and that of the answer a wrapper would give

    def ask(call, measure):  # to the relay (_serve_tests) and back, as marshal's plain data -> _answer's
        if min(running["seconds"], running["deadline"] - time.monotonic()) <= 0:
            return _answer("T", "", test["timeout"])
        os.write(ask_w, marshal.dumps((running["seconds"], running["deadline"], call, measure)))
        try:
            tag, data, running["seconds"] = marshal.load(answers)
        except EOFError:  # exit by os._exit, so that no `finally` or handler of the test's runs on
            os._exit(_say(report, "infra", "the supervisor died"))
        return _answer(tag, data, test["timeout"])

    # What the test calls as the entry point (and check's argument) is a proxy. A failed call (a
    # timeout, a crash, non-data) fails its test, since it raises a BaseException that the test's
    # `except Exception` can't catch, and every later call of the same test fails the same way.
    def candidate(*args, **kwargs):
        running["calls"] += 1
        running["call"] = args, kwargs
        if running["failure"] is None:
            try:
                call = marshal.dumps((args, kwargs))
            except ValueError as e:  # an argument that is a function or an object, so the test can't run
                os._exit(_say(report, "infra", f"an argument can't go to the program: {e}"))
            tag, value = ask(call, "")
            tag, value = ("failed", "a malformed reply") if tag == "H" else (tag, value)  # (unmeasured)
            if job["helper"]:
                answered.append((call, _fingerprint(tag, value, False), _fingerprint(tag, value, True)))
            if tag == "R":
                return value
            if tag == "E":
                running["raised"] = value
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
    # waits for that, with a test's time (_allow). A program that doesn't load is at fault.
    _allow(running, test["timeout"], test["backstop"])
    tag, why = ask(marshal.dumps(None), "")
    if tag != "R":
        return _say(report, "error", f"the program failed to load: {why}")
    _say(report, "loaded")
    all_passed = _check(test, scope, running, report)
    _say(report, "done")
    if job["helper"] and all_passed:  # (after "done": what happens here changes no verdict)
        _allow(running, 2 * test["timeout"], test["backstop"])  # (for all the rounds)
        _say(report, "helper", _helper_use(ask, answered))


def _allow(running, seconds, backstop):
    """Give the calls from now on `seconds` of their program process's CPU time (walls._clock) and
    `backstop` x `seconds` of wall clock, and our own work `seconds` of CPU time (past them: SIGPROF)."""
    running.update(seconds=seconds, deadline=time.monotonic() + backstop * seconds)
    signal.setitimer(signal.ITIMER_PROF, seconds)


def _helper_use(ask, answered):
    """The tests' calls made again in five rounds, the helper's results as it answers them or stood in
    for (_stood_in), each call of each round on a fresh process, all in an order of chance ->
    "unstable" (as it answers, an answer differs), "unused" (with a stand-in for them: its first
    argument, its first result, None, no answer differs), else "used" (with them _altered, an answer
    becomes another value, not the helper's) or "wrapped" (only the helper's)."""
    # The count is ours: the program's processes hold no part of it. A call that fails or times out
    # differs, an exception is no value. A program that counts its processes (by files it leaves)
    # and answers right in the first only must guess where each call's "again" is: 1 in 5 a call.
    changed = {measure: [] for measure in ("again", "identity", "constant", "none", "altered")}
    first_results = {measure: [] for measure in changed}
    for measure, (call, first, wrapped) in sorted([(m, a) for m in changed for a in answered],
                                                  key=lambda _: os.urandom(8)):
        tag, value = _stood_in(ask, call, measure, first_results[measure])
        new = _fingerprint(tag, value, False)
        changed[measure] += [(tag, new, wrapped)] if new is None or new != first else []
    if changed["again"]:
        return "unstable"
    if not all(changed[measure] for measure in ("identity", "constant", "none")):
        return "unused"
    values = [(new, wrapped) for tag, new, wrapped in changed["altered"] if tag == "R"]
    if any(new != wrapped for new, wrapped in values):
        return "used"
    return "wrapped" if values else "unused"


def _stood_in(ask, call, measure, first_result):
    """A call of the entry point in a round of the helper's measure -> its answer (tag, value). Each of
    its calls of the helper is made in the helper's own process; the round's stand-in for the result
    (or the result, in "again") goes back to the program. `first_result`: the round's first, once seen."""
    tag, value = ask(call, "fresh")  # (a fresh program process for each call)
    while tag == "H":  # (args, kwargs) of a call of the helper
        (args, kwargs), (tag, value) = value, ask(marshal.dumps(value), "helper")
        if tag == "R":
            if not first_result:
                first_result.append(value)
            stand_ins = {"identity": args[0] if args else None, "constant": first_result[0], "none": None}
            reply = "R", stand_ins.get(measure, _altered(value) if measure == "altered" else value)
        else:  # it raised, or failed (an exit, then), rebuilt there as its builtin class
            reply = "E", ((type(value).__name__, str(value)) if tag == "E" else ("SystemExit", value))
        tag, value = ask(marshal.dumps(reply), "")
    return tag, value


def _fingerprint(tag, value, altered):
    """The hash of an answer ("R", value) or ("E", exception), of its data (so NaN equals NaN); with
    `altered`, of the value _altered; None for a failed call, or where that fails."""
    try:
        if tag == "R":
            return hash(json.dumps(_encode(_altered(value) if altered else value, 0)))
        return hash((type(value).__name__, str(value))) if tag == "E" and not altered else None
    except Exception:  # (ValueError: nested past 100 once _altered; MemoryError)
        return None


def _check(test, scope, running, report):
    """Run each test's statements in `scope` until one fails; report its verdict: where it stopped, why."""
    # Each test has `timeout` seconds (_allow) from its start; after max_timeouts timeouts the rest are
    # skipped (a program that hangs on every call must not take timeout x tests seconds). Our own work
    # has CPU time too: a set whose keys' hashes the program made collide is quadratic to build, in C.
    verdicts = []
    for index, group in enumerate(test["groups"]):
        running.update(failure=None, calls=0, call=None, raised=None)
        _allow(running, test["timeout"], test["backstop"])
        status, text, wrong = "passed", "", False
        for source in group:  # each compiles, as _split_check tried
            try:
                exec(compile(source, "<check>", "exec"), scope)
            except BaseException as e:  # SystemExit too, as exiting is not passing
                # A wrong answer: the test's own check failed, on data the program returned
                status, text, wrong = "failed", _describe(e), e is not running["raised"]
            if running["failure"]:  # a failed call fails its test, even where the test caught it
                (status, text), wrong = running["failure"], False
            if status != "passed":
                break
        signal.setitimer(signal.ITIMER_PROF, 0)
        call = _call_text(running["entry"], running["call"])
        _say(report, index, status, source[:300], text, running["calls"], call, wrong)
        verdicts.append(status)
        if verdicts.count("timeout") >= test["max_timeouts"]:
            break
    return verdicts.count("passed") == len(test["groups"])  # -> every test ran, and passed


_INSIDE = (_serve_tests, _serve, _altered, _tester, _allow, _helper_use, _stood_in, _fingerprint, _check)
walls.ship(_INSIDE)
