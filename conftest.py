"""pytest's root: this file makes the repository root importable, so `pytest` and `python -m pytest`
both work from here, and orders the suite so that the unit tests of each function run first and
the end-to-end runs last: when a course blanks a function, the first failures name it."""
import os

# Unit tests by module, in the dependency order of the code (sandbox <- rewards <- envs, magrpo
# before what uses it): a blanked function fails first in its own module's tests, not in a later
# module's test that happens to call it.
FILE_ORDER = ["test_sandbox.py", "test_rewards.py", "test_magrpo.py", "test_envs.py", "test_eval.py",
              "test_team.py", "test_lora.py", "test_train.py"]


def pytest_collection_modifyitems(items):
    def rank(item):
        kind = 2 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("integration") else 0
        name = os.path.basename(str(item.path))
        return kind, FILE_ORDER.index(name) if name in FILE_ORDER else len(FILE_ORDER)
    items.sort(key=rank)  # stable: within a rank, the file's own order
