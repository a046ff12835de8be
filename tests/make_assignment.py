"""
The course kit: a copy of this repository with some functions blanked, for students to write again,
with its handout, ASSIGNMENT.md; the TA's copy with the answers; and grading.

    python tests/make_assignment.py --list                       # the functions a course can blank
    python tests/make_assignment.py OUT --functions group_advantages,policy_loss
    python tests/make_assignment.py OUT_TA --functions group_advantages,policy_loss --solutions
    python tests/make_assignment.py --grade STUDENT --functions group_advantages,policy_loss
    cd OUT && pytest -k group_advantages                         # a student's loop

A blanked function keeps its signature and docstring; its body (and its comments) become a `raise
NotImplementedError` that names it. The handout's text is docs/course.md's, which also says what
each copy holds. Before it finishes the kit checks the copy (every test of a blanked function fails)
and reports which other tests wait for a blanked function. --solutions writes the TA's copy instead:
nothing blanked, the same handout, and SOLUTIONS.md (the reference bodies, the wrong answers the
tests catch, the expected figures). --grade runs each function's tests on a student's modules.
"""
import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "docs" / "course.md"

# The functions a course can blank, in the order of work: where each lives, what of the paper it is,
# the `pytest -k` expression that selects its tests (their names say which function they check:
# words joined by "or"), and its points.
TEACHABLE = {
    "sample_token": ("sampler.py", "Sec. 2 step 1: a token from softmax(logits / T), top-k, top-p",
                     "sample_token", 10),
    "decode_step": ("sampler.py", "Sec. 2 step 1: one step of KV-cache decoding", "decode_step", 5),
    "cached_attention": ("sampler.py", "Sec. 2 step 1: a layer's attention, writing and reading the KV cache",
                         "cached_attention", 6),
    "completion_logprobs": ("magrpo.py", "Eq. 2: log pi_theta(a_t | h, a_<t) of each completion token",
                            "completion_logprobs", 15),
    "group_advantages": ("magrpo.py", "Eq. 1: A^(g) = R^(g) - mean_g' R^(g')", "group_advantages", 8),
    "policy_loss": ("magrpo.py", "Eq. 2: J(theta_i) = E[A^(g) log pi_theta_i(a_i^(g) | h_i)], as a loss",
                    "policy_loss", 8),
    "node_return": ("magrpo.py", "Sec. 3: R_t = r_t + gamma * mean(R_{t+1} of the children)",
                    "node_return", 4),
    "joint_actions": ("magrpo.py", "Sec. 2 step 2: aligned or cross joint actions", "joint_actions", 4),
    "pass_at_k": ("eval.py", "Sec. 6: pass@k = 1 - C(n - c, k) / C(n, k) (Chen et al. 2021)", "pass_at_k", 6),
    "extract_function": ("rewards.py", "Sec. 4: the one function kept of a model's output",
                         "extract_function", 6),
    "band_score": ("rewards.py", "Sec. 5: a level's score, 1 in its band, ramps to 0 outside",
                   "band_score or band_edges", 4),
}

# Tests that need several functions: the handout has them run once the last of those is written.
# (functions, the -k expression, what they test)
TOGETHER = [
    (("sample_token", "decode_step", "cached_attention"), "generate",
     "generate's tests: the whole sampler, against transformers' model.generate, seeds and EOS"),
    (("sample_token", "decode_step", "cached_attention", "completion_logprobs", "group_advantages",
      "policy_loss", "node_return"), "train_step",
     "whole MAGRPO steps: sampling, Eq. 1, Eq. 2 and the update"),
    (("group_advantages", "node_return"), "episode", "the multi-turn tree's returns and advantages"),
]

# What the students' copy leaves out: the kit's own tests (they would show the answers), and, when a
# function is blanked, the files and the functions (a test helper, magrpo's textbook pass) that hold an
# answer of it. The tests that compare with them then read recorded values (docs/course.md, For the TA).
LEFT_OUT = ["tests/test_make_assignment.py"]
# bench_gpu.py imports bench_logprobs.py, and test_benchmarks.py runs bench_gpu.py.
ANSWERS = {"completion_logprobs": (["tests/bench_logprobs.py", "tests/bench_gpu.py", "tests/test_benchmarks.py"],
                                   [("tests/conftest.py", "logprobs_row_by_row"), ("magrpo.py", "row_logprobs")])}
# Functions that are part of another's answer, blanked with it and shown in its section of the handout:
# sample_token's top-k/top-p cut is kept_floor's (sample_token calls it), so a copy without sample_token
# has no cut to read either.
PARTS = {"sample_token": [("sampler.py", "kept_floor")]}
RECORDING = "tests/fixtures/reference_logprobs.pt"
STUB = "{name}: write it (see its docstring and ASSIGNMENT.md)"
TA_SECTION = "For the TA: expected figures"  # docs/course.md's last section: in SOLUTIONS.md only


def fail(message):
    sys.exit(f"make_assignment.py: error: {message}")


def find_function(source, name):
    """The one top-level `def name` of a module's source (an ast node)."""
    found = [node for node in ast.parse(source).body
             if isinstance(node, ast.FunctionDef) and node.name == name]
    if len(found) != 1:
        fail(f"{name}: want one top-level def of it, found {len(found)}")
    return found[0]


def blank(source, name):
    """`source` with function `name`'s body replaced by a raise that names it; its decorators,
    signature and docstring kept. Comments inside the body go too (they would give the answer)."""
    fn = find_function(source, name)
    lines = source.split("\n")
    has_doc = ast.get_docstring(fn, clean=False) is not None
    keep_to = fn.body[0].end_lineno if has_doc else fn.body[0].lineno - 1  # the last line kept
    indent = re.match(r"\s*", lines[fn.body[0].lineno - 1]).group()
    stub = f'{indent}raise NotImplementedError("{STUB.format(name=name)}")'
    return "\n".join(lines[:keep_to] + [stub] + lines[fn.end_lineno:])


def replace_function(source, name, new=""):
    """`source` with the top-level function `name` (and its decorators) replaced by the text `new`:
    removed by default. Grading and the kit's tests put a student's or a wrong answer in with it."""
    fn = find_function(source, name)
    lines = source.split("\n")
    first = min([fn.lineno] + [d.lineno for d in fn.decorator_list]) - 1
    return "\n".join(lines[:first] + ([new.rstrip("\n")] if new else []) + lines[fn.end_lineno:])


def body_lines(source, name):
    """The code lines of a function's body after its docstring, stripped, but imports and comments:
    what blanking removes that could give the answer away."""
    fn = find_function(source, name)
    body = fn.body[1:] if ast.get_docstring(fn, clean=False) is not None else fn.body
    lines = source.split("\n")[body[0].lineno - 1:fn.end_lineno] if body else []
    code = [line.strip() for line in lines if line.strip()]
    return [line for line in code if not line.startswith(("#", "import ", "from "))]


def tracked_files():
    """The files git tracks (a clean clone's), else every file but caches and runs."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return [f for f in listed.stdout.split("\0") if f and (ROOT / f).is_file()]
    skip = {".git", "__pycache__", ".pytest_cache", "out", "runs"}
    files = [p.relative_to(ROOT) for p in ROOT.rglob("*") if p.is_file()]
    return [str(rel) for rel in files if not skip & set(rel.parts)]


def copy_repository(out, leave_out=()):
    """The repository's files, but those of `leave_out`, copied to `out`."""
    for rel in tracked_files():
        if rel not in leave_out:
            (Path(out) / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, Path(out) / rel)


def record_reference(out):
    """Run, on this repository, the tests that ask for the row-by-row reference, writing each value
    they get into the copy's recording (conftest._reference)."""
    target = Path(out) / RECORDING
    target.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MAGRPO_RECORD_REFERENCE": str(target)}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "logprob",
                        "tests/test_magrpo.py", "tests/test_sampler.py"],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0 or not target.exists():
        fail(f"recording the reference log-probs: their tests fail in {ROOT}:\n{p.stdout[-2000:]}")


def make_students_copy(out, names):
    """The copy students get: the listed functions blanked, no answer left (LEFT_OUT, ANSWERS), and
    the handout."""
    leave_out = set(LEFT_OUT)
    for name in names:
        leave_out.update(ANSWERS.get(name, ([], []))[0])
    copy_repository(out, leave_out)
    for name in names:
        for where, function in [(TEACHABLE[name][0], name)] + PARTS.get(name, []):
            module = out / where
            module.write_text(blank(module.read_text(), function))
        helpers = ANSWERS.get(name, ([], []))[1]
        if helpers:
            record_reference(out)
        for where, helper in helpers:
            path = out / where
            path.write_text(replace_function(path.read_text(), helper))
    course = out / COURSE.relative_to(ROOT)  # without its last section, the TA's figures and answers
    course.write_text(course.read_text().split(f"\n## {TA_SECTION}\n")[0])
    (out / "ASSIGNMENT.md").write_text(assignment_text(names))
    leftovers(out, names)


def leftovers(out, names):
    """Stop if a line of a blanked function's body (30 characters or more) is anywhere in the copy,
    but for the lines that the library's modules hold elsewhere too (a student has those anyway)."""
    library = set()
    for module in Path(out).glob("*.py"):
        library.update(line.strip() for line in module.read_text().split("\n"))
    lines = set()
    blanked = [(TEACHABLE[name][0], name) for name in names]
    blanked += [part for name in names for part in PARTS.get(name, [])]
    for where, function in blanked:
        body = body_lines((ROOT / where).read_text(), function)
        lines.update(line for line in body if len(line) >= 30 and line not in library)
    for path in sorted(Path(out).rglob("*")):
        if path.suffix in (".py", ".md", ".txt", ".json", ".ini", ".cfg"):
            found = lines & {line.strip() for line in path.read_text(errors="replace").split("\n")}
            if found:
                fail(f"{path.relative_to(out)} holds a line of a blanked function's body: "
                     f"{sorted(found)[0]!r}")


# -----------------------------------------------------------------------------
# The handout, from docs/course.md


def course_sections():
    """docs/course.md's sections, {heading without its #s: its text}, at every heading level."""
    sections, heading = {}, None
    for line in COURSE.read_text().split("\n"):
        match = re.match(r"#+ (.*)", line)
        if match:
            heading = match.group(1).strip("` ")
            sections[heading] = []
        elif heading:
            sections[heading].append(line)
    return {heading: "\n".join(lines).strip() for heading, lines in sections.items()}


def points_in(text):
    return sum(int(n) for n in re.findall(r"\((\d+) points\)", text))


def order_of_work(names):
    """The handout's steps: each function with its tests, then the tests that needed it and the
    functions before it."""
    steps = []
    for k, name in enumerate(names, 1):
        module, _, expression, points = TEACHABLE[name]
        step = f"{k}. `{name}` ({module}, {points} points): `pytest -k \"{expression}\"`"
        for needs, together, words in TOGETHER:
            blanked = [n for n in needs if n in names]
            if blanked and blanked[-1] == name:
                step += f"; then `pytest -k {together}`: {words}"
        steps.append(step)
    steps.append(f"{len(names) + 1}. the final check, below, then the written experiments")
    return "\n".join(steps)


def signature_and_docstring(module, name):
    """A function's header and docstring, as its module has them."""
    source = (ROOT / module).read_text()
    fn = find_function(source, name)
    end = fn.body[0].end_lineno if ast.get_docstring(fn, clean=False) is not None else fn.lineno
    return "\n".join(source.split("\n")[fn.lineno - 1:end])


def function_section(name, sections):
    """One problem of the handout: signature and docstring as the module has them (and its PARTS'),
    the deliverable."""
    module, equation, expression, points = TEACHABLE[name]
    code = "\n\n\n".join(signature_and_docstring(where, function)
                          for where, function in [(module, name)] + PARTS.get(name, []))
    return (f"### `{name}` ({module}, {points} points)\n\n{equation}.\n\n```python\n{code}\n```\n\n"
            f"{sections[name]}\n\nIts tests: `pytest -k \"{expression}\"`.")


def assignment_text(names):
    """ASSIGNMENT.md: the handout of a copy in which `names` are blanked."""
    sections = course_sections()
    handout = ["Setup", "What is graded", "The final check", "Written experiments"]
    function_points = sum(TEACHABLE[name][3] for name in names)
    other_points = points_in(sections["The final check"]) + points_in(sections["Written experiments"])
    table = ["| function | module | the paper | points | its tests |", "|---|---|---|---|---|"]
    for name in names:
        module, equation, expression, points = TEACHABLE[name]
        cell = equation.replace("|", "\\|")  # a bar would end the table's cell
        table.append(f"| `{name}` | {module} | {cell} | {points} | `pytest -k \"{expression}\"` |")
    parts = [
        "# Assignment: MAGRPO, function by function\n",
        "MAGRPO (Liu et al., arXiv 2508.04652) trains several LLM agents that cooperate on one task with one "
        "shared reward: each agent samples a group of completions, Eq. 1 compares each joint action's reward "
        "with its group's, Eq. 2 is each agent's policy gradient. This repository implements it; the "
        f"functions below raise NotImplementedError: write them again. {function_points} points for the "
        f"functions, {other_points} for the final check and the written experiments, "
        f"{function_points + other_points} in all.\n",
        "\n".join(table) + "\n",
        f"## {handout[0]}\n\n{sections[handout[0]]}\n",
        f"## Order of work\n\n{order_of_work(names)}\n",
        "## The functions\n",
        *[function_section(name, sections) + "\n" for name in names],
        *[f"## {heading}\n\n{sections[heading]}\n" for heading in handout[1:]],
    ]
    return "\n".join(parts)


def solutions_text(names):
    """SOLUTIONS.md, the TA's: each function's reference body and the wrong answers its tests are
    known to catch (tests/test_make_assignment.py's), the expected figures, how to grade."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_make_assignment import WRONG
    parts = ["# Solutions (the TA's; not for students)\n",
             f"Grading: `python tests/make_assignment.py --grade STUDENT_DIR --functions {','.join(names)}` "
             "(docs/course.md, For the TA).\n"]
    for name in names:
        module = TEACHABLE[name][0]
        source = (ROOT / module).read_text()
        reference = ast.get_source_segment(source, find_function(source, name))
        parts.append(f"## `{name}` ({module})\n\n```python\n{reference}\n```\n")
        caught = [f"- {mistake}: the test says \"{words}\"" for function, mistake, _, _, words in WRONG
                  if function == name]
        if caught:
            parts.append("Wrong answers its tests catch, and words of their failure message:\n\n"
                         + "\n".join(caught) + "\n")
    parts.append(f"## Expected figures\n\n{course_sections()[TA_SECTION]}\n")
    return "\n".join(parts)

# -----------------------------------------------------------------------------
# Running the copy's tests


def run_tests(where, *args, paths=("tests/",), stop=None):
    """{test id: None if it passed, else its failure text} of a pytest run in `where` (skipped tests
    left out); `stop`, a threading.Event, once set kills the run, which then gives {}."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        run = subprocess.Popen([*command, *args, *paths], cwd=where, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        while stop is not None and run.poll() is None:
            if stop.wait(0.5):
                run.kill()
        run.wait()
        if stop is not None and stop.is_set():
            return {}
        if not os.path.exists(report):
            fail(f"pytest did not run in {where}")
        outcomes = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            test = f"{case.get('classname').split('.')[-1]}.py::{case.get('name')}"
            failure = case.find("failure") if case.find("failure") is not None else case.find("error")
            if case.find("skipped") is None and failure is None:
                outcomes[test] = None
            elif case.find("skipped") is None:
                outcomes[test] = f"{failure.get('message', '')}\n\n{failure.text or ''}"
    return outcomes


def selects(expression, test):
    """Whether `pytest -k expression` (words joined by "or") selects a test: a word in its name."""
    return any(word in test.lower() for word in expression.lower().split(" or "))


def own_expression(names):
    return " or ".join(f"({TEACHABLE[name][2]})" for name in names)


def check(out, names, suite=("tests/",)):
    """The copy's tests in the files `suite`: each blanked function's must all fail (else stop).
    -> (their count per function, {blanked function: the other tests of the fast suite that fail
    calling it}, the tests that fail for another reason, the number that pass)."""
    # The rest of the suite runs beside the blanked functions' own tests (2 cores), and is stopped
    # at once if those refuse the copy.
    refused = threading.Event()
    pool = ThreadPoolExecutor(max_workers=1)
    others = pool.submit(run_tests, out, "-m", "not slow", "-k", f"not ({own_expression(names)})",
                         paths=suite, stop=refused)
    own = run_tests(out, "-k", own_expression(names), paths=suite)
    counts = {}
    for name in names:
        tests = {test: why for test, why in own.items() if selects(TEACHABLE[name][2], test)}
        passing = [test for test, why in tests.items() if why is None]
        if not tests or passing:
            refused.set()
            pool.shutdown()
            fail(f"{name}: its tests do not fail when it is blanked ({len(passing)} of {len(tests)} pass: "
                 f"{', '.join(passing[:3]) or 'no test selected'})")
        counts[name] = len(tests)
    waiting, unexplained, passed = {name: [] for name in names}, [], 0
    rest = others.result()
    pool.shutdown()
    for test, why in rest.items():
        # A blanked part (kept_floor) waits for its function (sample_token).
        owners = {part: name for name in names for _, part in PARTS.get(name, [])}
        called = {owners.get(f, f) for f in re.findall(r"NotImplementedError: (\w+): write it", why or "")}
        called &= set(names)
        for name in called:
            waiting[name].append(test)
        if why is not None and not called:
            unexplained.append(test)
        passed += why is None
    return counts, waiting, unexplained, passed


def report(out, names, counts, waiting, unexplained, passed):
    by_name = ", ".join(f"{name} {counts[name]}" for name in names)
    print(f"wrote {out} (ASSIGNMENT.md, the handout): {', '.join(names)} blanked; their own tests fail until "
          f"they are written ({by_name})")
    for name, tests in waiting.items():
        if tests:
            files = {}
            for test in tests:
                files[test.split("::")[0]] = files.get(test.split("::")[0], 0) + 1
            where = ", ".join(f"{file} {n}" for file, n in files.items())
            print(f"  {len(tests)} other tests of the fast suite call {name} and wait for it ({where})")
    print(f"  the fast suite's other {passed} tests pass")
    if unexplained:
        print(f"  {len(unexplained)} tests fail without calling a blanked function (do they fail in the "
              f"repository too?): {', '.join(unexplained[:5])}")

# -----------------------------------------------------------------------------
# The TA's copy, and grading


def make_solutions(out, names):
    copy_repository(out)
    (out / "ASSIGNMENT.md").write_text(assignment_text(names))
    (out / "SOLUTIONS.md").write_text(solutions_text(names))
    failing = [test for test, why in run_tests(out, "-k", own_expression(names)).items() if why is not None]
    if failing:
        fail(f"the TA's copy: tests of the listed functions fail: {', '.join(failing[:5])}")
    print(f"wrote {out} (the TA's copy: ASSIGNMENT.md, SOLUTIONS.md); the tests of {', '.join(names)} pass")


def grade(student, names):
    """Each function's tests on the student's modules in a fresh copy of this repository (its tests,
    not the student's) -> printed: per function tests passed, points, the first failure's message."""
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        copy_repository(tmp)
        for module in {TEACHABLE[name][0] for name in names}:
            if not (student / module).is_file():
                fail(f"--grade: {student / module} does not exist")
            shutil.copy2(student / module, Path(tmp) / module)
        outcomes = run_tests(tmp, "-k", own_expression(names))
    for name in names:
        tests = {test: why for test, why in outcomes.items() if selects(TEACHABLE[name][2], test)}
        passed = sum(why is None for why in tests.values())
        points = TEACHABLE[name][3] * passed / max(1, len(tests))
        total += points
        most = TEACHABLE[name][3]
        print(f"{name:20} {passed:3} of {len(tests):3} tests pass  {points:5.1f} of {most} points")
        first = next((why for why in tests.values() if why is not None), None)
        if first:  # its message: a few lines, what differs and, where known, why
            for line in first.strip().split("\n\n")[0].split("\n")[:4]:
                print("    " + line[:300])
    most = sum(TEACHABLE[name][3] for name in names)
    print(f"{'total':20} {total:.1f} of {most} points (the final check and the written experiments are "
          "graded by hand)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="make_assignment.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", help="the directory to write the copy into (must not exist)")
    p.add_argument("--functions", help="comma list of the functions to blank (see --list)")
    p.add_argument("--list", action="store_true", help="list the functions a course can blank")
    p.add_argument("--solutions", action="store_true",
                   help="write the TA's copy: nothing blanked, SOLUTIONS.md")
    p.add_argument("--grade", metavar="STUDENT",
                   help="grade a student's copy: its modules, this repository's tests")
    return p.parse_args(argv)


def main():
    args = parse_args()
    if args.list:
        for name, (module, equation, expression, points) in TEACHABLE.items():
            print(f"{name:20} {module:10} {points:2} points  pytest -k \"{expression}\"   # {equation}")
        return
    names = [n.strip() for n in (args.functions or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in TEACHABLE]
    if unknown or not names:
        fail(f"--functions: unknown {', '.join(unknown) or 'empty list'}: use --list to see the functions")
    names = [name for name in TEACHABLE if name in names]  # in the order of work
    if args.grade:
        return grade(Path(args.grade), names)
    if not args.out:
        fail("give OUT (the directory to write), or --grade STUDENT, or --list")
    out = Path(args.out)
    if out.exists():
        fail(f"{out} already exists: pick a new directory")
    try:
        if args.solutions:
            return make_solutions(out, names)
        make_students_copy(out, names)
        report(out, names, *check(out, names))
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # an assignment that does not grade is no assignment
        raise


if __name__ == "__main__":
    main()
