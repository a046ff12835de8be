"""
The course kit: a copy of this repository with some functions blanked, for students to write again,
and ASSIGNMENT.md, which gives each one's specification (its docstring), the paper's equation, and
the command that grades it. Before it finishes it checks the copy: the blanked functions' tests fail,
the tests of every other function of the list still pass.

    python tests/make_assignment.py --list                         # what a course can blank
    python tests/make_assignment.py OUT --functions group_advantages,policy_loss
    cd OUT && pytest -k group_advantages                           # a student's loop

A blanked function keeps its signature and docstring; its body (and its comments) become a
`raise NotImplementedError` that names it.
"""
import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The functions a course can blank: where each lives, what of the paper it is, and the `pytest -k`
# expression that selects its tests (their names say which function they check): words joined by "or".
TEACHABLE = {
    "sample_token": ("sampler.py", "Sec. 2 step 1: a token from softmax(logits / T), top-k, top-p",
                     "sample_token"),
    "decode_step": ("sampler.py", "Sec. 2 step 1: one step of KV-cache decoding", "decode_step"),
    "completion_logprobs": ("magrpo.py", "Eq. 2: log pi_theta(a_t | h, a_<t) of each completion token",
                            "completion_logprobs"),
    "group_advantages": ("magrpo.py", "Eq. 1: A^(g) = R^(g) - mean_g' R^(g')", "group_advantages"),
    "policy_loss": ("magrpo.py", "Eq. 2: J(theta_i) = E[A^(g) log pi_theta_i(a_i^(g) | h_i)], as a loss",
                    "policy_loss"),
    "node_return": ("magrpo.py", "Sec. 3: R_t = r_t + gamma * mean(R_{t+1} of the children)", "node_return"),
    "joint_actions": ("magrpo.py", "Sec. 2 step 2: aligned or cross joint actions", "joint_actions"),
    "pass_at_k": ("eval.py", "Sec. 6: pass@k = 1 - C(n - c, k) / C(n, k) (Chen et al. 2021)", "pass_at_k"),
    "extract_function": ("rewards.py", "Sec. 4: the one function kept of a model's output",
                         "extract_function"),
    "band_score": ("rewards.py", "Sec. 5: a level's score, 1 in its band, ramps to 0 outside",
                   "band_score or band_edges"),
}


def fail(message):
    sys.exit(f"make_assignment.py: error: {message}")


def blank(source, name):
    """`source` with function `name`'s body replaced by a raise that names it; its decorators,
    signature and docstring kept. Comments inside the body go too (they would give the answer)."""
    tree = ast.parse(source)
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
    if len(found) != 1:
        fail(f"{name}: want one top-level def of it, found {len(found)}")
    fn = found[0]
    lines = source.split("\n")
    has_doc = ast.get_docstring(fn, clean=False) is not None
    keep_to = fn.body[0].end_lineno if has_doc else fn.body[0].lineno - 1  # the last line kept
    indent = re.match(r"\s*", lines[fn.body[0].lineno - 1]).group()
    stub = f'{indent}raise NotImplementedError("{name}: write it (see its docstring and ASSIGNMENT.md)")'
    return "\n".join(lines[:keep_to] + [stub] + lines[fn.end_lineno:])


def copy_repository(out):
    """The files git tracks (a clean clone's), else every file but caches and runs, copied to `out`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        files = [f for f in listed.stdout.split("\0") if f and (ROOT / f).is_file()]
    else:
        skip = {".git", "__pycache__", ".pytest_cache", "out", "runs"}
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    for rel in files:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, out / rel)


def assignment_text(names):
    """ASSIGNMENT.md: each blanked function's specification, equation and grading command."""
    parts = ["# Assignment\n", "Write the functions below again: each raises NotImplementedError now. "
             "Its docstring is the specification, and its tests grade it (run them from this folder).\n"]
    for name in names:
        module, equation, expression = TEACHABLE[name]
        fn = next(node for node in ast.parse((ROOT / module).read_text()).body
                  if isinstance(node, ast.FunctionDef) and node.name == name)
        signature = f"def {name}({ast.unparse(fn.args)})"
        parts.append(f"## `{name}` ({module})\n\n{equation}\n\n```python\n{signature}:\n"
                     f'    """{ast.get_docstring(fn)}"""\n```\n\nGraded by: `pytest -k "{expression}"`\n')
    return "\n".join(parts)


def test_outcomes(out, expression):
    """{test id: passed?} of the tests `pytest -k expression` selects in the copy `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", expression,
                        f"--junitxml={report}", "tests/"], cwd=out, capture_output=True, text=True)
        if not os.path.exists(report):
            fail(f"pytest did not run in {out}")
        outcomes = {}
        for case in ET.parse(report).getroot().iter("testcase"):
            test = f"{case.get('classname')}.{case.get('name')}"
            failed = case.find("failure") is not None or case.find("error") is not None
            if case.find("skipped") is None:
                outcomes[test] = not failed
    return outcomes


def check(out, names):
    """The copy's tests: each blanked function's all fail; every other listed function's all pass
    (one that fails needs a blanked function: said, with which)."""
    for name in names:
        outcomes = test_outcomes(out, TEACHABLE[name][2])
        passing = [test for test, passed in outcomes.items() if passed]
        if not outcomes or passing:
            fail(f"{name}: its tests do not fail when it is blanked ({len(passing)} of {len(outcomes)} pass: "
                 f"{', '.join(passing[:3]) or 'no test selected'})")
    others = [name for name in TEACHABLE if name not in names]
    outcomes = test_outcomes(out, " or ".join(TEACHABLE[name][2] for name in others))  # one run for all
    needs = []
    for name in others:
        words = TEACHABLE[name][2].lower().split(" or ")
        # pytest's -k rule: a word selects a test whose name contains it, ignoring case
        failed = [test for test, ok in outcomes.items() if not ok and any(w in test.lower() for w in words)]
        if failed:
            needs.append(name)
    return needs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1].strip())
    p.add_argument("out", nargs="?", help="the directory to write the assignment into (must not exist)")
    p.add_argument("--functions", help="comma list of the functions to blank")
    p.add_argument("--list", action="store_true", help="list the functions a course can blank")
    args = p.parse_args()
    if args.list:
        for name, (module, equation, expression) in TEACHABLE.items():
            print(f"{name:20} {module:10} pytest -k \"{expression}\"   # {equation}")
        return
    if not args.out or not args.functions:
        fail("give OUT and --functions (or --list)")
    names = [n.strip() for n in args.functions.split(",") if n.strip()]
    unknown = [n for n in names if n not in TEACHABLE]
    if unknown or not names:
        fail(f"--functions: unknown {', '.join(unknown) or 'empty list'}: use --list to see the functions")
    out = Path(args.out)
    if out.exists():
        fail(f"{out} already exists: pick a new directory")
    copy_repository(out)
    for name in names:
        module = out / TEACHABLE[name][0]
        module.write_text(blank(module.read_text(), name))
    (out / "ASSIGNMENT.md").write_text(assignment_text(names))
    try:
        needs = check(out, names)
    except SystemExit:
        shutil.rmtree(out)  # an assignment that does not grade is no assignment: none is left
        raise
    blanked = ", ".join(names)
    if needs:
        print(f"wrote {out} (ASSIGNMENT.md): {blanked} blanked and their tests fail; the tests of "
              f"{', '.join(needs)} fail too: they call a blanked function")
    else:
        print(f"wrote {out} (ASSIGNMENT.md): {blanked} blanked and their tests fail; every other listed "
              "function's tests pass")


if __name__ == "__main__":
    main()
