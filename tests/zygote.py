"""The tests' warm starter: one process per test worker imports what the slow tier's processes import (torch,
transformers, scipy, pandas, MLflow, sentence-transformers, raysent; not Ray) once, and forks a child for each of
them, which runs with the caller's arguments, folder, environment, standard streams and niceness, as a fresh
process would. A fresh process pays 5-7 CPU-s for Python's start and those imports before it does anything
(docs/testing.md, "The warm starter"); a forked one starts with them done. Its clients:

* the session Ray's workers (Tune trials, Ray Train workers and controllers): Ray starts each as
  ``python -S tests/zygote.py --worker SOCKET default_worker.py ARGS`` (``runtime_env`` ``py_executable``, which Ray
  documents for running workers under another command), and the child runs ``default_worker.py ARGS``. Ray is not
  imported here: its library reads settings such as the worker's job once, as it is loaded (a worker forked with it
  loaded stops at "Check failed: !job_id_env.empty()");
* `raysent` commands of slow tests (``conftest.run_cli``) and of doc blocks (a shim first on the block's PATH runs
  ``python -S tests/zygote.py --client SOCKET .venv/bin/raysent ARGS``), and Python doc blocks.

The child is a process of its own (its own process group): its exit status, output and files, and a Ray it starts
and stops, are a fresh process's. What a fresh process would do differently is what is decided as modules are
imported: the imports themselves (the fast tier, whose promise not to import Ray is checked in its processes, never
comes here; nor does tests/cli/test_cheap_errors.py, which times first errors), and settings read at import
(:data:`IMPORT_TIME_ENV`): a request whose environment differs from the starter's in one of those is answered
"fallback", and the client starts a fresh process. tests/test_zygote.py checks a command, a block and a worker.

Server: ``python tests/zygote.py SOCKET [SESSION]`` (``conftest.WarmStarter.start``; the Ray session it serves
only names it on its command line). Client: :func:`run`, :func:`through_starter`.
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import struct
import sys
import time

# read as modules are imported (torch's OpenMP runtime, Hugging Face's hub and cache settings, Python's own, the
# temporary folder: raysent.orphans keeps its markers below it): a command whose environment differs from the
# starter's in one of these runs as a fresh process
IMPORT_TIME_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "PYTHONHASHSEED", "PYTHONWARNINGS",
                   "PYTHONDONTWRITEBYTECODE", "HOME", "XDG_CACHE_HOME", "TMPDIR", "TEMP", "TMP", "HF_HOME",
                   "HF_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE",
                   "SENTENCE_TRANSFORMERS_HOME", "TORCH_HOME", "TOKENIZERS_PARALLELISM")
FDS = 3  # stdin, stdout, stderr


def _send(sock: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    payload = struct.pack("!I", len(data)) + data
    sent = sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]) if fds else 0
    if sent < len(payload):  # (sending nothing to a peer that has read it all and closed would fail)
        sock.sendall(payload[sent:])


def _recv(sock: socket.socket) -> tuple[dict | None, list[int]]:
    fds = array.array("i")
    msg, anc, _, _ = sock.recvmsg(1 << 20, socket.CMSG_LEN(FDS * fds.itemsize))
    if not msg:
        return None, []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    while len(msg) < 4:
        more = sock.recv(4 - len(msg))
        if not more:
            return None, list(fds)
        msg += more
    (size,) = struct.unpack("!I", msg[:4])
    body = msg[4:]
    while len(body) < size:
        more = sock.recv(size - len(body))
        if not more:
            return None, list(fds)
        body += more
    return json.loads(body), list(fds)


# --------------------------------------------------------------------------- the server
def _warm() -> None:
    """What the commands and Ray's workers import, less Ray: its library reads some settings once, as it is
    loaded (the job a worker belongs to, the raylet's pid), so each process loads it with its own environment."""
    import mlflow
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import pandas  # noqa: F401
    import scipy.stats  # noqa: F401
    import sentence_transformers  # noqa: F401
    import torch  # noqa: F401
    import transformers.models.bert.modeling_bert  # noqa: F401

    import raysent.cli
    import raysent.cli.suite
    import raysent.cli.train
    import raysent.cli.tune
    import raysent.tune.driver
    import raysent.tune.trial  # noqa: F401

    assert "ray" not in sys.modules, "the warm starter must not load Ray"


def _child(request: dict, fds: list[int], close: list[socket.socket]) -> None:
    """In the forked child: become the command's process, run it, exit as Python would (threads joined, atexit
    handlers run). Never returns."""
    code = 1
    try:
        for s in close:
            s.close()
        os.setpgid(0, 0)
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        for name in ("SIGINT", "SIGTERM", "SIGCHLD", "SIGPIPE"):
            signal.signal(getattr(signal, name), signal.default_int_handler if name == "SIGINT" else
                          signal.SIG_IGN if name == "SIGPIPE" else signal.SIG_DFL)
        # as Python opens them: stdout line by line on a terminal, written through with PYTHONUNBUFFERED, else in
        # blocks; stderr line by line
        import io

        unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115

        def binary(fd: int):
            raw = io.FileIO(fd, "w", closefd=False)
            return raw if unbuffered else io.BufferedWriter(raw)

        sys.stdout = io.TextIOWrapper(binary(1), encoding="utf-8", line_buffering=os.isatty(1),
                                      write_through=unbuffered)
        sys.stderr = io.TextIOWrapper(binary(2), encoding="utf-8", errors="backslashreplace", line_buffering=True,
                                      write_through=unbuffered)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        try:
            os.setpriority(os.PRIO_PROCESS, 0, request.get("nice", 0))  # Ray starts its workers at a niceness
        except OSError:  # below the starter's, which takes a privilege
            pass
        # a fresh interpreter puts PYTHONPATH's folders first on sys.path
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
        sys.path[0:0] = extra
        import random

        import numpy as np

        random.seed()  # a fresh process draws its own (the starter's state is every child's otherwise)
        np.random.seed()
        if request["kind"] == "worker":  # a Ray worker: default_worker.py ARGS, as `python default_worker.py ARGS`
            import runpy

            sys.argv = list(request["argv"])
            sys.path[0:0] = [os.path.dirname(sys.argv[0])]
            try:
                runpy.run_path(sys.argv[0], run_name="__main__")
                code = 0
            except SystemExit as exc:
                code = _exit_status(exc)
        elif request["kind"] == "cli":
            sys.argv = ["raysent", *request["argv"]]
            from raysent.cli import main

            try:
                code = main(request["argv"]) or 0
            except SystemExit as exc:
                code = _exit_status(exc)
        else:
            sys.argv = ["-c"]
            sys.path[0:0] = [""]
            import builtins
            import traceback

            try:
                exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
                code = 0
            except SystemExit as exc:
                code = _exit_status(exc)
            except BaseException as exc:  # as the interpreter: the traceback from the code on, exit 1
                traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
                code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit
            import threading

            threading._shutdown()  # type: ignore[attr-defined]  # as at interpreter exit: non-daemon threads joined
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _exit_status(exc: SystemExit) -> int:
    """The status ``sys.exit(x)`` ends Python with: x when an int, 0 for None, else 1 with x printed to stderr."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def serve(path: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]  # tests/ is no command's path
    own = dict(os.environ)  # as the imports see it
    _warm()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    children: dict[int, socket.socket] = {}  # pid -> the client's connection
    clients: dict[socket.socket, int] = {}
    parent = os.getppid()
    while True:
        if os.getppid() != parent:  # the test worker is gone
            for pid in children:
                _kill_group(pid)
            return
        ready, _, _ = select.select([server, *clients], [], [], 0.2)
        for s in ready:
            if s is server:
                conn, _ = server.accept()
                request, fds = _recv(conn)
                if request is None or any(request["env"].get(k) != own.get(k) for k in IMPORT_TIME_ENV):
                    for fd in fds:
                        os.close(fd)
                    if request is not None:
                        _send(conn, {"fallback": True})
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(request, fds, [server, conn, *clients])
                for fd in fds:
                    os.close(fd)
                _send(conn, {"pid": pid})
                children[pid], clients[conn] = conn, pid
            else:  # a client went away (killed on a timeout): its command goes too
                if not s.recv(1):
                    pid = clients.pop(s)
                    _kill_group(pid)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is None:
                continue
            clients.pop(conn, None)
            try:
                _send(conn, {"status": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()


def _kill_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        time.sleep(0.5)


# --------------------------------------------------------------------------- the client
class Fallback(Exception):
    """The starter cannot run this request as a fresh process would (it is not up, or the request's environment
    differs in a setting read at import): run it as a fresh process."""


def run(path: str, request: dict, fds: tuple[int, int, int], timeout: float | None = None) -> int:
    """Run ``request`` in a child of the starter at ``path`` with ``fds`` as its standard streams; its exit code
    (a signal: minus its number). SIGINT and SIGTERM sent here go to the child. Raises :class:`Fallback` when the
    starter cannot run it, ``TimeoutError`` after ``timeout`` seconds (the child killed)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise Fallback from None
    try:
        _send(sock, {**request, "nice": os.getpriority(os.PRIO_PROCESS, 0)}, list(fds))
        started, _ = _recv(sock)
        if started is None or "pid" not in started:
            raise Fallback
        pid = started["pid"]

        def forward(sig, _frame):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass

        old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)} if _in_main_thread() else {}
        try:
            sock.settimeout(timeout)
            try:
                done, _ = _recv(sock)
            except TimeoutError:
                _kill_group(pid)
                raise
            if done is None:
                raise RuntimeError("the warm starter closed the connection before the command ended")
            return int(done["status"])
        finally:
            for s, h in old.items():
                signal.signal(s, h)
    finally:
        sock.close()


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _exit_code(code: int) -> int:
    return code if code >= 0 else 128 - code


def through_starter(kind: str, path: str, args: list[str], fresh: list[str]) -> int:
    """``args`` run as ``kind`` by the starter at ``path`` with this process's folder, environment and streams; its
    exit status. When the starter cannot, this process becomes ``fresh + args`` instead."""
    try:
        return _exit_code(run(path, {"kind": kind, "argv": args, "cwd": os.getcwd(), "env": dict(os.environ)},
                              (0, 1, 2)))
    except Fallback:
        os.execv(fresh[0], [*fresh, *args])


if __name__ == "__main__":
    if sys.argv[1] == "--client":  # --client SOCKET EXECUTABLE ARGS: the `raysent` of a doc block's PATH
        sys.exit(through_starter("cli", sys.argv[2], sys.argv[4:], [sys.argv[3]]))
    if sys.argv[1] == "--worker":  # --worker SOCKET default_worker.py ARGS: Ray's runtime_env py_executable
        sys.exit(through_starter("worker", sys.argv[2], sys.argv[3:], [sys.executable]))
    serve(sys.argv[1])  # further arguments (the Ray session it serves) only name it on its command line
