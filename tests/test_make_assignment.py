"""The course kit (tests/make_assignment.py): a copy of the repository with functions blanked, whose
tests then fail while every other listed function's pass. Runs the kit for real on two functions."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIT = [sys.executable, str(ROOT / "tests" / "make_assignment.py")]
pytestmark = pytest.mark.slow  # it runs pytest on the copy (a minute or two)


def kit(*args):
    return subprocess.run([*KIT, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_list_names_each_function_with_its_grading_command():
    out = kit("--list").stdout
    for name in ("sample_token", "decode_step", "completion_logprobs", "group_advantages", "policy_loss",
                 "node_return", "pass_at_k", "extract_function"):
        assert f'pytest -k "{name}' in out, name


def test_two_functions_blanked_fail_their_tests_and_the_rest_pass(tmp_path):
    out = tmp_path / "assignment"
    p = kit(str(out), "--functions", "group_advantages,policy_loss")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "group_advantages, policy_loss blanked" in p.stdout and p.stdout.count("\n") == 1
    magrpo = (out / "magrpo.py").read_text()
    assert 'raise NotImplementedError("group_advantages: ' in magrpo
    assert 'raise NotImplementedError("policy_loss: ' in magrpo
    assert "centered = rewards - rewards.mean" not in magrpo  # the body is gone, its docstring kept
    assert "Eq. 1 over the last dim" in magrpo
    assignment = (out / "ASSIGNMENT.md").read_text()
    assert 'pytest -k "group_advantages"' in assignment and "Eq. 2" in assignment
    graded = subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", "policy_loss", "tests/test_magrpo.py"],
                            cwd=out, capture_output=True, text=True, timeout=600)
    assert graded.returncode != 0 and "NotImplementedError" in graded.stdout


@pytest.mark.parametrize("args, why", [
    (["--functions", "no_such_function"], "unknown no_such_function"),
    (["--functions", ""], "--functions"),
])
def test_bad_input_is_one_line(tmp_path, args, why):
    p = kit(str(tmp_path / "out"), *args)
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and why in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_directory_is_refused(tmp_path):
    p = kit(str(tmp_path), "--functions", "group_advantages")
    assert p.returncode != 0 and "already exists" in p.stderr and p.stderr.count("\n") == 1


def test_a_function_whose_tests_pass_blanked_is_refused(tmp_path):
    """The check itself: a copy where group_advantages is NOT blanked passes its tests, which the kit
    must call out (an assignment whose tests cannot fail grades nothing)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import make_assignment
    make_assignment.copy_repository(tmp_path)
    with pytest.raises(SystemExit) as stop:
        make_assignment.check(tmp_path, ["group_advantages"])
    assert "group_advantages: its tests do not fail when it is blanked" in str(stop.value.code)
