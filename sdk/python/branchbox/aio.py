"""asyncio over the sync client: the same objects and methods, awaitable.

Each call runs the sync client's in a worker thread, which it is safe to
share between; streams (exec_stream, events) become async iterators fed
by a thread. A call cancelled (asyncio.wait_for's timeout, a task's
cancel) cuts its connection, which ends it as a client that leaves does:
the server kills its command, aborts the branches of its fork. No
dependency but the standard library.

    from branchbox import aio
    c = aio.Client(socket="/run/branchbox/api.sock")
    sb = c.sandbox("agent")
    kids = await sb.fork(4)
    results = await asyncio.gather(*(k.exec(["make", "test"]) for k in kids))
"""

import asyncio
import functools
import threading

from . import _client

# Methods that return an iterator: wrapped as async iterators.
_STREAMS = {"exec_stream", "events"}
# Methods and properties that return objects without a call to the
# server: wrapped at once, not in a thread.
_LOCAL = {"sandbox", "branch", "root", "close"}


def _wrap(v):
    if isinstance(v, (_client.Client, _client.Sandbox, _client.Branch)):
        return _Async(v)
    if isinstance(v, list) and v and isinstance(v[0], _client.Branch):
        return [_Async(b) for b in v]
    return v


async def _aiter(make):
    """Iterate a sync iterator in a thread, handing items to the loop. An
    iteration left (cancelled, or a break) cuts the stream's connection
    at once: the server ends what it streams."""
    loop = asyncio.get_running_loop()
    q = asyncio.Queue()
    done = object()
    stop = threading.Event()
    scope = _client._Scope()

    def feed():
        for item in make():
            if stop.is_set():
                break
            loop.call_soon_threadsafe(q.put_nowait, (item, None))

    def run():
        try:
            scope.run(feed)
        except BaseException as e:  # handed to the loop, raised there
            loop.call_soon_threadsafe(q.put_nowait, (None, e))
            return
        loop.call_soon_threadsafe(q.put_nowait, (done, None))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        while True:
            item, err = await q.get()
            if err is not None:
                raise err
            if item is done:
                return
            yield item
    finally:
        stop.set()
        scope.abort()


class _Async:
    """An async view of a Client, Sandbox or Branch."""

    def __init__(self, inner):
        self._inner = inner

    def __repr__(self):
        return "aio." + repr(self._inner)

    def __getattr__(self, name):
        v = getattr(self._inner, name)
        if not callable(v):
            return _wrap(v)
        if name in _LOCAL:
            return lambda *a, **k: _wrap(v(*a, **k))
        if name in _STREAMS:
            return lambda *a, **k: _aiter(lambda: v(*a, **k))

        async def call(*a, **k):
            scope = _client._Scope()
            fut = asyncio.get_running_loop().run_in_executor(None, functools.partial(scope.run, v, *a, **k))
            try:
                return _wrap(await asyncio.shield(fut))
            except asyncio.CancelledError:
                # The call ends as a client that leaves: the thread's
                # connection is cut, and its error is not wanted.
                scope.abort()
                fut.add_done_callback(_undo)
                raise

        return call


def _undo(fut):
    """The end of a call cancelled: a fork answered all the same (its
    answer came as the cancel did) has its branches aborted, which nobody
    else knows of; any error is not wanted."""
    if fut.cancelled() or fut.exception() is not None:
        return
    v = fut.result()
    if isinstance(v, list) and all(isinstance(b, _client.Branch) for b in v):
        threading.Thread(target=lambda: [_abort(b) for b in v], daemon=True).start()


def _abort(b):
    try:
        b.abort()
    except _client.BranchboxError:
        pass  # gone already, or stale


def Client(*args, **kwargs):
    """An async client: branchbox.Client's arguments."""
    return _Async(_client.Client(*args, **kwargs))


async def best_of_n(sandbox, attempts, test, timeout=None):
    """branchbox.best_of_n, awaited: the winner (async) or None, and each
    attempt's test result."""
    winner, results = await asyncio.to_thread(_client.best_of_n, sandbox._inner, attempts, test, timeout)
    return _wrap(winner), results
