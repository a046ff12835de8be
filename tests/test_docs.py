"""The documentation against the code: docs/flags.md lists exactly the flags of train.py's and
eval.py's --help, README.md stays short with the paper's equation table near its top, every docs/
page is linked from it, every link between the pages leads to a file and heading that exist, and
every train.py or eval.py command the pages show parses, and the README lists the course kit's
functions. Fast: no model is loaded, nothing is run."""
import contextlib
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import eval as evaluation
import magrpo
import runs
import train

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
SCRIPTS = {"train.py": train.parse_args, "eval.py": evaluation.parse_args}
FLAG = re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]*)")  # -h, --num-generations; not top-p or 1e-5
CODE_FLAG = re.compile(r"`(--?[a-z][a-z0-9-]*)")  # a code span that starts with a flag: `--k 1,3`

# -----------------------------------------------------------------------------
# docs/flags.md against --help


def help_flags(parse_args):
    """The option strings that `--help` prints, read from its options section."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        parse_args(["--help"])
    assert exit_info.value.code == 0
    flags = set()
    for line in out.getvalue().split("options:", 1)[1].split("\n"):
        # "  -h, --help   show ...", "  --env ENV   one of ...": a help text's next lines are indented more
        match = re.match(r"  (-[^ ].*?)(?:  |$)", line)
        if match:
            for option in match.group(1).split(", "):
                flags.add(option.split(" ")[0])
    return flags


def flags_section(script):
    """docs/flags.md's section of `script`: from its heading to the next."""
    parts = re.split(r"^## ", (DOCS / "flags.md").read_text(), flags=re.MULTILINE)
    found = [part for part in parts if part.split("\n", 1)[0].strip() == script]
    assert len(found) == 1, f"docs/flags.md: want one section '## {script}', found {len(found)}"
    return found[0]


def table_flags(section):
    """The flags named in the first column of the section's table rows, in order."""
    flags = []
    for line in section.split("\n"):
        if line.startswith("| `-"):
            flags += FLAG.findall(line.split("|")[1])
    return flags


def test_help_flags_are_read():
    # The reader of the help text must find the flags we know of, or the checks below prove nothing.
    flags = help_flags(train.parse_args)
    assert {"-h", "--help", "--env", "--num-generations", "--lora-r", "--resume"} <= flags
    assert "--agents" in help_flags(evaluation.parse_args) and "--agents" not in flags


@pytest.mark.parametrize("script", SCRIPTS)
def test_flags_md_lists_every_flag_of_help(script):
    documented = table_flags(flags_section(script))
    actual = help_flags(SCRIPTS[script])
    assert not actual - set(documented), f"docs/flags.md, {script}: missing {actual - set(documented)}"
    assert not set(documented) - actual, f"docs/flags.md, {script}: not a flag: {set(documented) - actual}"
    assert len(documented) == len(set(documented)), f"docs/flags.md, {script}: a flag listed twice"


def named_flags(section):
    """The flags a section names: its table's flag column, and each code span that starts with one
    (`--agents`) in the defaults, help texts and notes. Plain text is prose: a help text may well say
    "clip to [-c, c]"."""
    return set(table_flags(section)) | set(CODE_FLAG.findall(section))


def test_named_flags_reads_the_flag_column_and_code_spans_only():
    section = ("| flag | default | what it does |\n|---|---|---|\n"
               "| `--clip` | `--c-default` | clip each advantage to [-c, c] (-c: the low end); `--std` |\n")
    assert named_flags(section) == {"--clip", "--c-default", "--std"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_flags_md_names_only_real_flags(script):
    # The help texts and notes too: a flag they name as code must be one of the script's.
    unknown = named_flags(flags_section(script)) - help_flags(SCRIPTS[script])
    assert not unknown, f"docs/flags.md, {script}: no such flag {unknown}"

# -----------------------------------------------------------------------------
# README.md: short, the paper first, every page linked; links between the pages


def test_config_fields_are_train_flags_and_the_sampling_ones_eval_flags():
    """magrpo.py says which Config fields are whose flags: every one train.py's, eval.SAMPLING_FIELDS eval.py's."""
    import dataclasses
    import eval as evaluation
    import magrpo
    import train
    fields = [f.name for f in dataclasses.fields(magrpo.Config)]
    assert set(fields) <= set(vars(train.parse_args([])))
    assert set(fields) & set(vars(evaluation.parse_args([]))) == set(evaluation.SAMPLING_FIELDS)
    assert "eval.SAMPLING_FIELDS" in (ROOT / "magrpo.py").read_text()


def test_readme_is_short():
    assert len(README.read_text()) <= 25_000


def test_equation_table_in_first_third_of_readme():
    text = README.read_text()
    heading = text.find("\n## The paper, equation by equation")
    assert heading >= 0, "README.md has no section 'The paper, equation by equation'"
    table = text.find("\n| paper |", heading)
    assert 0 <= table < len(text) / 3, f"the equation table starts at {table} of {len(text)} characters"


def relative_links(page):
    """The markdown links of `page` that are not URLs -> (file, anchor or ""); a link to a heading
    of the same page has the page as its file."""
    links = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        links.append((page.parent / file if file else page, anchor))
    return links


def anchors(page):
    """The anchors of the page's headings, as GitHub makes them; code blocks skipped."""
    found, fence = set(), None
    for line in page.read_text().split("\n"):
        marks = re.match(r"\s*(`{3,})", line)
        if marks and fence is None:
            fence = marks.group(1)
        elif marks and line.strip() == marks.group(1) and len(marks.group(1)) >= len(fence):
            fence = None  # (a shorter fence inside a longer one belongs to the block)
        elif fence is None and re.match(r"#+ ", line):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_every_docs_page_is_linked_from_readme():
    linked = {file.resolve() for file, _ in relative_links(README)}
    pages = sorted(DOCS.iterdir())
    assert pages, "docs/ is empty"
    unlinked = [page.name for page in pages if page.resolve() not in linked]
    assert not unlinked, f"docs/ pages not linked from README.md: {unlinked}"


def test_every_link_leads_somewhere():
    for page in PAGES:
        for file, anchor in relative_links(page):
            where = f"{page.relative_to(ROOT)}: link to {file.relative_to(ROOT)}#{anchor}"
            assert file.exists(), f"{where}: no such file"
            if anchor:
                assert file.suffix == ".md" and anchor in anchors(file), f"{where}: no such heading"


def test_docs_cite_the_paper_not_project_files():
    for page in PAGES:
        assert "SPEC.md" not in page.read_text(), f"{page.name} cites SPEC.md"

# -----------------------------------------------------------------------------
# The commands the pages show


def split_at(words, separator):
    """A list of words cut into the runs between separators."""
    pieces = [[]]
    for word in words:
        if word == separator:
            pieces.append([])
        else:
            pieces[-1].append(word)
    return pieces


def commands(page):
    """(script, its arguments) of each train.py / eval.py command in the page's bash code blocks
    (`python train.py ...`, `torchrun ... train.py ...`); a line ending in a backslash goes on,
    `&&` separates commands, `#` starts a comment."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").split("\n"):
            for command in split_at(shlex.split(line, comments=True), "&&"):
                for script in SCRIPTS:
                    if script in command and command[0] in ("python", "torchrun"):
                        found.append((script, command[command.index(script) + 1:]))
    return found


def test_commands_are_found():
    found = commands(README)
    assert ("train.py", []) in found
    assert ("train.py", ["--num-turns", "2", "--out", "out2"]) in found


def test_the_outputs_of_the_commands_shown_are_ignored_by_git():
    # A reader who runs the pages' commands in a clone must not see their runs and reports as files
    # to commit. git itself reads .gitignore (--no-index: whether or not such a path exists).
    # train.py's --out is a directory, eval.py's a file: git tells them apart by the trailing slash.
    outputs = {"out/"}  # train.py's default --out
    for page in PAGES:
        for script, argv in commands(page):
            slash = "/" if script == "train.py" else ""
            outputs.update(argv[i + 1] + slash for i, word in enumerate(argv[:-1]) if word == "--out")
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout (a course's copy)")
    for path in sorted(outputs):
        p = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True)
        assert p.returncode == 0, f"{path} (a command's --out) is not in .gitignore: {p.stderr.decode()}"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_commands_in_the_docs_parse(page):
    # Each command's flags exist and its step settings are valid (magrpo.Config checks them);
    # nothing is loaded, so a command for a GPU or a hub model is checked too.
    for script, argv in commands(page):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                runs.config_from_flags(SCRIPTS[script](argv))
        except (SystemExit, ValueError) as e:
            why = err.getvalue().strip() or str(e)
            pytest.fail(f"{page.name}: python {script} {shlex.join(argv)}: {why}")


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_abbreviated_flag_is_an_error_not_another_flag(script):
    # argparse takes a unique prefix for the flag it begins by default: a typo such as --num-gen would
    # then set --num-generations silently (and a page's command would pass the check above).
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        SCRIPTS[script](["--num-gen" if script == "train.py" else "--num-samp", "3"])
    assert exit_info.value.code == 2 and "unrecognized arguments" in err.getvalue()


# -----------------------------------------------------------------------------
# The course's functions: one list, the kit's


def test_the_readme_lists_the_kits_blankable_functions_and_where_they_live():
    import make_assignment
    text = " ".join(README.read_text().split())
    listed = text.split("course kit's list (`python tests/make_assignment.py --list`):", 1)[1]
    listed = listed.split(". The suite", 1)[0]
    named = {}
    for names, module in re.findall(r"((?:`\w+`,? )+)\((\w+\.py)\)", listed):
        for name in re.findall(r"`(\w+)`", names):
            named[name] = module
    assert named == {name: spec[0] for name, spec in make_assignment.TEACHABLE.items()}

# -----------------------------------------------------------------------------
# Each list of choices has one source (magrpo.Config.CHOICES and runs.SPELLINGS, envs.ENVS); the docs'
# tables and the benchmarks follow it, so a new mode or env that is not documented fails here.


def choices_of(name):
    """Config's values of a setting, with the other names it takes (--advantage std, TRL's loss types)."""
    spellings = tuple(spelling for owner, spelling in runs.SPELLINGS if owner == name)
    return magrpo.Config.CHOICES[name] + spellings


def flags_row(script, flag):
    rows = [line for line in flags_section(script).split("\n") if line.startswith(f"| `{flag}` |")]
    assert len(rows) == 1, f"docs/flags.md, {script}: want one row for {flag}"
    return rows[0]


def test_each_list_of_choices_has_one_source_that_the_docs_and_benchmarks_follow():
    import envs
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import bench_advantages
    finally:
        sys.path.remove(str(ROOT / "tests"))
    # README's table of Eq. 1's baselines: one row per --advantage value, no other.
    section = README.read_text().split("| `--advantage` | A of joint action", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE)
    assert sorted(rows) == sorted(choices_of("advantage")), "README's --advantage table"
    # The benchmark of the baseline family runs every group baseline (a critic is docs/critic.md's bench).
    assert set(bench_advantages.MODES) == set(choices_of("advantage")) - {"critic"}
    for script in SCRIPTS:
        for name in magrpo.Config.CHOICES:
            if "--" + name.replace("_", "-") not in help_flags(SCRIPTS[script]):
                continue
            row = flags_row(script, "--" + name.replace("_", "-"))
            missing = [value for value in choices_of(name) if not re.search(rf"\b{value}\b", row)]
            assert not missing, f"docs/flags.md, {script}, --{name.replace('_', '-')}: {missing} not listed"
        listed = re.search(r"one of ([\w, ]+?), or your own", flags_row(script, "--env")).group(1).split(", ")
        assert listed == sorted(envs.ENVS), f"docs/flags.md, {script}, --env"


def test_the_readme_import_table_is_the_code_s_and_goes_one_way():
    import ast
    section = README.read_text().split("| module | imports of ours |", 1)[1].split("\n\n", 1)[0]
    table = {}
    for line in section.strip().split("\n")[1:]:
        names, imports = (cell.strip() for cell in line.strip("|").split("|"))
        for name in names.split(", "):
            table[name] = set() if imports == "none" else set(imports.split(", "))
    modules = {path.stem for path in ROOT.glob("*.py")}
    assert set(table) == modules, f"README's import table: modules {set(table) ^ modules}"
    order = list(table)
    for name in modules:
        found = set()
        for node in ast.walk(ast.parse((ROOT / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
        found &= modules
        assert found == table[name], f"README's import table, {name}: the code imports {sorted(found)}"
        # One way: a module imports only modules listed above it.
        later = {other for other in found if order.index(other) >= order.index(name)}
        assert not later, f"{name} imports {later}, listed at or below it"
