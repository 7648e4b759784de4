"""``python -m cifar10_dist`` processes forked from one interpreter that imported torch, Ignite and the package
once: what a test's CLI process would spend its first ~5 s of a core on (on a 2-core machine, most of a short
run). Each is still a process of its own, run as ``python -m`` runs it (``runpy``, ``__main__``, its own
arguments, environment, folder, import path, stdin/stdout/stderr, session and exit status); only the imports are
done before it starts. ``tests/conftest.py`` decides when a test gets a fresh interpreter instead. A served process
that spawns workers forks the forkserver it starts from itself, as it is when it starts it, instead of starting an
interpreter that imports torch again (``_forkserver_forked_or_spawned``).

The server (``python -m tests.cli_server ADDRESS``) takes one request per connection on a UNIX socket: the
arguments, environment and folder as JSON, with the three standard streams' file descriptors attached (and, from
the stand-in python, a fourth: its network namespace, which the child joins, as a new interpreter started there
would be in it: the nodes of tests/test_two_hosts.py, each in a namespace of its own); it answers the child's
pid, then its exit status when it ends, or ``refused`` and the variables that differ when the environment
differs from its own in a variable read at import time (the child would not be what a new interpreter is), or
``moved ADDRESS`` when the only difference is a hash seed (PYTHONHASHSEED): the server started with that seed,
on first use, forks it. It stops when its stdin (a pipe from the test process) closes, and its seeded servers
with it. Clients: ``Server.start`` (the tests' ``run_forked``/``start_forked``) and ``run_served`` (the stand-in
``python`` of tests/served_python, for job scripts).

Every served child has its server's hash seed (Python's string hashing, set when an interpreter starts), and so
has every worker its forkserver spawns, as in a real spawned run, whose workers are forked from one forkserver
too. Peers started apart from each other get seeds of their own in real use, and a set they iterate in a
different order could make them disagree; the tests whose peers start apart therefore give each its own seed:
the srun tasks of test_launch_modes, the tasks of a multi-task step of the stand-in srun (tests/fake_slurm/srun),
the nodes of test_two_hosts, and torchrun's workers (torchrun, forked too, starts them as the stand-in python, its
PYTHON_EXEC): the first peer has this server's random seed, each other one a seed of its own (its rank + 1),
forked by the server of that seed. A stand-in ends as its served process ended, by the same signal: test_faults
kills a served torchrun worker, and torchrun sees its child killed by SIGKILL. The GPU checks' torchrun workers
are new interpreters, torchrun's own children (as a user runs them). tests/test_cli.py checks that a
served spawned run and a fresh one end with bit-identical weights and the same metrics, and that a served
process ends as a new interpreter does (``run_then_exit``: all but Python's teardown)."""

from __future__ import annotations

import ctypes
import gc
import io
import json
import multiprocessing.util
import os
import random
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

# what a CLI run imports (the forkserver's preload list, below, plus the command line itself and what a run imports
# when it starts: its launcher, its checks, the data's augmentations and the checkpoints' serialization), and
# scikit-learn where it is installed: it sets KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK when imported, and a test
# process that imported it (an in-process tune's parameter importances, through Optuna) would send them to a
# server without them
PRELOADED_HERE = (
    "cifar10_dist.cli",
    "cifar10_dist.runs",
    "cifar10_dist.launch.spawn",
    "cifar10_dist.preflight",
    "torchvision.transforms.v2",
    "torch.utils.serialization",
    "tensorboard.plugins.hparams.metadata",
    "sklearn",
)
# variables that torch, OpenMP and Python read when they start (PYTHONPATH aside: the child's import path is set
# from it): a process whose values differ from the server's needs an interpreter of its own
IMPORT_TIME_VARIABLES = ("TORCH", "PYTORCH", "OMP_", "MKL", "KMP_", "CUDA", "PYTHON")
# of those, the ones read only when used: the import path (set in the child), torchrun's interpreter for its
# workers, what torchrun gives its workers (read by the elastic agent's helpers and process groups), and whether
# torchrun's rendezvous shares its store with the workers (read when it rendezvouses)
READ_WHEN_USED = (
    "PYTHONPATH",
    "PYTHON_EXEC",
    "TORCHELASTIC_",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
)
# the modules a served process runs as ``python -m``: the command line, torchrun, the per-step benchmark (in a
# process of its own: it adapts torch to the peer's code) and pytest (a run of the GPU checks without a GPU)
SERVED_MODULES = ("cifar10_dist", "torch.distributed.run", "benchmarks.recipes", "pytest")
# what a stand-in python passes on to the process it asked for (what srun and the job scripts send)
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
# how multiprocessing starts a forkserver: the command it runs, and the function it runs it with
FORKSERVER_COMMAND = "from multiprocessing.forkserver import main"
CLONE_NEWNET = 0x40000000  # setns(2): the namespace is a network namespace
_spawnv_passfds = multiprocessing.util.spawnv_passfds


def differing_at_import(env: dict[str, str] | os._Environ, other: dict[str, str] | os._Environ) -> str | None:
    """The first variable read at import time on which two environments disagree (None: they agree)."""
    return next(
        (
            key
            for key in sorted({*env, *other})
            if key.startswith(IMPORT_TIME_VARIABLES)
            and not key.startswith(READ_WHEN_USED)
            and env.get(key) != other.get(key)
        ),
        None,
    )


def same_at_import(env: dict[str, str] | os._Environ, other: dict[str, str] | os._Environ) -> bool:
    """Whether two environments agree on every variable read at import time."""
    return differing_at_import(env, other) is None


def _preload() -> None:
    from cifar10_dist.launch import start_method

    for name in (*PRELOADED_HERE, *start_method.PRELOADED):
        try:
            __import__(name)
        except ImportError:
            pass


def serve(address: str) -> dict[str, Any]:
    """Answer requests until stdin closes (then exit); in each forked child, return its request."""
    base_path = sys.path[1 + len(_import_path(os.environ)) :]  # what follows PYTHONPATH in every interpreter
    started_with = dict(os.environ)
    _preload()
    # what the imports set (torch's inductor: TORCHINDUCTOR_CACHE_DIR, unless given), as they would in a new
    # interpreter started with a request's environment
    set_by_imports = {key: value for key, value in os.environ.items() if started_with.get(key) != value}
    multiprocessing.util.spawnv_passfds = _forkserver_forked_or_spawned  # what every child inherits
    gc.freeze()  # the imports' objects: not walked by each child's collections, nor copied on their write
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(16)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stop")
    seeded: dict[str, Server] = {}  # a server of each hash seed asked for, started on first use, ends with this one
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "stop":  # (its seeded servers' stdin closes with it; nothing to tear down)
                os._exit(0)
            if key.data == "accept":
                connection, _ = listener.accept()
                message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 4)
                request = json.loads(message)
                wanted = {**set_by_imports, **request["env"]}
                pid = os.fork() if same_at_import(wanted, os.environ) else None
                if pid == 0:
                    selector.close()
                    listener.close()
                    connection.close()
                    for server in seeded.values():  # (their ends of the seeded servers' pipes)
                        server.process.stdin.close()
                        server.process.stdout.close()
                    return _become_child(request, fds, base_path)
                for fd in fds:
                    os.close(fd)
                if pid is None:
                    connection.send(_elsewhere(wanted, started_with, Path(address).parent, seeded))
                    connection.close()
                    continue
                connection.send(str(pid).encode())
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, connection))
            else:  # a child ended: its exit status to its client
                pid, connection = key.data
                selector.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    connection.send(str(os.waitstatus_to_exitcode(status)).encode())
                except OSError:
                    pass  # the client went away
                connection.close()


def _import_path(env: dict[str, str] | os._Environ) -> list[str]:
    """PYTHONPATH's entries as Python puts them on sys.path (absolute; an empty entry is the current folder)."""
    value = env.get("PYTHONPATH", "")
    return [os.path.abspath(entry) for entry in value.split(os.pathsep)] if value else []


def _elsewhere(wanted: dict[str, str], started_with: dict[str, str], folder: Path, seeded: dict[str, Server]) -> bytes:
    """The answer to a request this server cannot fork: ``moved ADDRESS``, a server started with the hash seed
    it asks for (PYTHONHASHSEED, its only difference; started on first use), else ``refused`` and the variables
    that differ."""
    differing = sorted(
        key for key in {*wanted, *os.environ} if not same_at_import({key: wanted.get(key)}, {key: os.environ.get(key)})
    )
    seed = wanted.get("PYTHONHASHSEED", "")
    if differing != ["PYTHONHASHSEED"] or not seed.isdigit():
        return b"refused " + " ".join(differing).encode()
    if seed not in seeded:
        seeded[seed] = Server({**started_with, "PYTHONHASHSEED": seed}, folder, f"seed-{seed}")
    return b"moved " + seeded[seed].address.encode()


def _become_child(request: dict[str, Any], fds: list[int], base_path: list[str]) -> dict[str, Any]:
    """This process as a fresh ``python -m cifar10_dist ARGS`` would be set up (a fourth descriptor: the network
    namespace of the process that asked, joined where it is not this one's)."""
    if request["new_session"]:
        os.setsid()
    if len(fds) == 4:
        _join_network_namespace(fds.pop())
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:] = [os.getcwd(), *_import_path(os.environ), *base_path]
    sys.argv[:] = ["-m", *request["args"]]
    if request.get("unbuffered"):  # python -u: text written through to the descriptor at once
        for name, fd in (("stdout", 1), ("stderr", 2)):
            stream = getattr(sys, name)
            raw = io.FileIO(fd, "w", closefd=False)
            setattr(sys, name, io.TextIOWrapper(raw, stream.encoding, stream.errors, write_through=True))
    random.seed()  # as a fresh interpreter's: seeded from the OS, not the server's state
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    return request


def _join_network_namespace(fd: int) -> None:
    """Enter the network namespace open at ``fd`` (``ip netns exec``'s, where a stand-in python was started: a new
    interpreter there would be in it), unless it is this process's own."""
    if os.fstat(fd).st_ino != os.stat("/proc/self/ns/net").st_ino:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the asking process's network namespace failed")
    os.close(fd)


def _forkserver_forked_or_spawned(path: str, args: list[str], passfds: list[int]) -> int:
    """What multiprocessing starts a forkserver with (``util.spawnv_passfds``), in a served process: the
    forkserver is forked from this process, whose imports (the forkserver's preload list among them) are done,
    instead of a new interpreter that imports them again (about 5 s of a core per spawned run). As a started one,
    it keeps this process's group, environment and folder, holds only the descriptors passed to it and the
    standard streams, and starts with the signal handlers a new interpreter has. Anything else is spawned."""
    if FORKSERVER_COMMAND not in args[-1]:
        return _spawnv_passfds(path, args, passfds)
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        _keep_only_descriptors({0, 1, 2, *map(int, passfds)})
        _signal_handlers_of_a_new_interpreter()
        from multiprocessing import forkserver

        forkserver._forkserver._lock = threading.Lock()  # held by the thread that forked this process
        exec(args[-1], {})  # multiprocessing's own command: forkserver.main(...)
        code = 0
    except SystemExit as stop:  # how the forkserver ends when its last client is gone
        code = stop.code if isinstance(stop.code, int) else 0
    except BaseException:
        traceback.print_exc()  # as an interpreter would, then exit 1
    finally:
        os._exit(code)  # not the served process's exit handlers


def _keep_only_descriptors(kept: set[int]) -> None:
    start = 0
    for fd in sorted(kept):
        if start < fd:  # os.closerange(0, 0) would close every descriptor (Python 3.11 on Linux)
            os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX"))


def _signal_handlers_of_a_new_interpreter() -> None:
    """exec resets every caught signal to its default (ignored ones stay ignored); Python then catches SIGINT
    unless it is ignored."""
    for number in signal.valid_signals():
        try:
            if callable(signal.getsignal(number)):
                signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL, SIGSTOP and signals Python cannot handle
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class ServedProcess:
    """The part of ``subprocess.Popen`` the tests use, for a process forked by the server."""

    def __init__(self, args: list[str], connection: socket.socket, answer: bytes, stdout: Any, stderr: Any) -> None:
        self.args = args
        if answer.startswith(b"refused"):
            raise RuntimeError(
                "the CLI server refused an environment that conftest.require_servable accepted (it differs "
                f"in {answer[8:].decode() or '?'})"
            )
        self.pid = int(answer)
        self.returncode: int | None = None
        self.stdout, self.stderr = stdout, stderr
        self._connection = connection
        self._readers: list[threading.Thread] = []
        self._read: dict[str, str | None] = {}

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        if self._status(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        if not self._readers:
            self._read = {name: None for name in ("stdout", "stderr")}  # (None: not a pipe of ours)
            self._readers = [
                threading.Thread(target=self._read_all, args=(name,), daemon=True)
                for name in ("stdout", "stderr")
                if getattr(self, name) is not None
            ]
            for reader in self._readers:
                reader.start()
        for reader in self._readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(timeout)
        return self._read["stdout"], self._read["stderr"]

    def send_signal(self, signal_number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal_number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _read_all(self, name: str) -> None:
        stream = getattr(self, name)
        self._read[name] = stream.read()
        stream.close()

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            if select.select([self._connection], [], [], timeout)[0]:
                self.returncode = int(self._connection.recv(64))
                self._connection.close()
        return self.returncode


class Server:
    """One server per test process, started on first use."""

    def __init__(self, env: dict[str, str], folder: Path, name: str = "cli-server") -> None:
        self.folder = folder
        self.address = str(folder / f"{name}.sock")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_server", self.address],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the CLI server did not start (exit {self.process.wait()})")

    def start(
        self,
        args: list[str],
        env: dict[str, str],
        cwd: Path | None,
        new_session: bool,
        module: str = "cifar10_dist",
        stderr: int | None = None,
    ) -> ServedProcess:
        """``python -m MODULE ARGS`` (a module of SERVED_MODULES) forked by this server; its stdout a pipe, and its
        stderr a pipe too unless ``stderr`` names a descriptor to give it (a terminal, say)."""
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe() if stderr is None else (None, os.dup(stderr))
        stdin = os.open(os.devnull, os.O_RDONLY)
        request = {
            "module": module,
            "args": args,
            "env": env,
            "cwd": str(cwd or Path.cwd()),
            "new_session": new_session,
        }
        connection, answer = ask(self.address, request, [stdin, stdout_write, stderr_write])
        for fd in (stdin, stdout_write, stderr_write):
            os.close(fd)
        return ServedProcess(
            [sys.executable, "-m", module, *args],
            connection,
            answer,
            os.fdopen(stdout_read, "r"),
            None if stderr_read is None else os.fdopen(stderr_read, "r"),
        )

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)


def ask(address: str, request: dict[str, Any], fds: list[int]) -> tuple[socket.socket, bytes]:
    """Send a request with its descriptors to the server at ``address``, and to the one it names where it answers
    ``moved`` (a server of the hash seed asked for): the connection and the answer (a pid, or ``refused``)."""
    while True:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        connection.connect(address)
        socket.send_fds(connection, [json.dumps(request).encode()], fds)
        answer = connection.recv(4096)
        if not answer.startswith(b"moved "):
            return connection, answer
        connection.close()
        address = answer[len(b"moved ") :].decode()


def run_served(args: list[str], address: str | None) -> int | None:
    """For a stand-in ``python``: ``[-u] -m MODULE ARGS`` (a module of SERVED_MODULES) forked by the server at
    ``address`` with this process's environment, folder and standard streams, in a session of its own; the
    signals of PASSED_ON that reach this process are passed on to it. A torchrun worker without a hash seed is
    given RANK + 1 from rank 1 on (rank 0 keeps the server's random one: new interpreters' seeds differ from rank
    to rank). Its exit code (negative: minus the signal that ended it), or None where this is another command or no
    server is named. Where the server refuses this environment or does not answer, one line on stderr names why, and
    the code is 2: a test that meant a forked process never gets a new interpreter without a word."""
    unbuffered = args[:1] == ["-u"]
    command = args[1:] if unbuffered else args
    if not address or len(command) < 2 or command[0] != "-m" or command[1] not in SERVED_MODULES:
        return None
    env = dict(os.environ)
    rank = int(env["RANK"]) if env.get("RANK", "").isdigit() else 0
    if "TORCHELASTIC_RUN_ID" in env and rank > 0 and "PYTHONHASHSEED" not in env:
        env["PYTHONHASHSEED"] = str(rank + 1)
    request = {
        "module": command[1],
        "args": command[2:],
        "env": env,
        "cwd": os.getcwd(),
        "new_session": True,
        "unbuffered": unbuffered,
    }
    network = os.open("/proc/self/ns/net", os.O_RDONLY)  # (this process's network namespace, for the child's)
    try:
        connection, answer = ask(address, request, [0, 1, 2, network])
    except OSError as error:
        return not_served(f"the CLI server at {address} does not answer ({error})")
    finally:
        os.close(network)
    if answer == b"":
        return not_served(f"the CLI server at {address} closed the connection without an answer")
    if answer.startswith(b"refused"):
        differing = answer[len(b"refused ") :].decode() or "?"
        return not_served(
            f"the CLI server cannot serve this environment: it differs from the server's in {differing}, read when "
            "Python or torch starts (give the server's value, or run the test's command with run_new_interpreter)"
        )
    pid = int(answer)
    for number in PASSED_ON:
        signal.signal(number, lambda received, _: os.kill(pid, received))
    return int(connection.recv(64))


def not_served(why: str) -> int:
    """A stand-in python's one line when its command cannot be forked by the server, and its exit code."""
    print(f"tests/served_python: {why}", file=sys.stderr)
    return 2


def run_then_exit(module: str) -> None:
    """``python -m MODULE`` in a served child, ended as Python ends it (the exit status of an exception, a
    SystemExit or a Ctrl-C; threads joined, exit handlers run, standard streams flushed), except for the teardown
    that follows: freeing every object the server imported would write to, and so copy, most of the pages the
    child shares with it (most of a short run's CPU time in the kernel, and much of its user time)."""
    import atexit
    import runpy

    interrupted = False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        code = _system_exit_code(stop)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 130, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # (Python's own first step at exit: non-daemon threads)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # (Python's status when its streams cannot be flushed at exit)
    if interrupted:  # as Python ends after an unhandled KeyboardInterrupt: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _system_exit_code(stop: SystemExit) -> int:
    """The exit status Python gives a SystemExit: its code (None: 0), else its text on stderr and 1."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    served = serve(sys.argv[1])
    run_then_exit(served.get("module", "cifar10_dist"))
