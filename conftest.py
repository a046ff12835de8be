"""pytest's root: this file makes the repository root importable, so `pytest` and `python -m pytest`
both work from here, and orders the suite so that the unit tests of each function run first and
the end-to-end runs last: when a course blanks a function, the first failures name it."""


def pytest_collection_modifyitems(items):
    def rank(item):
        return 2 if item.get_closest_marker("slow") else 1 if item.get_closest_marker("integration") else 0
    items.sort(key=rank)  # stable: within a rank, the files' own order
