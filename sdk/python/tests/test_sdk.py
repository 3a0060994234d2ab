"""The Python SDK against a real `branchctl serve` (integration/sdk_test.go
runs it, with BRANCHBOX_SOCKET, BRANCHBOX_URL, BRANCHBOX_TOKEN,
BRANCHBOX_NAMESPACE and BRANCHBOX_IMAGE set)."""

import asyncio
import contextlib
import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import branchbox  # noqa: E402

ENV = os.environ
NS = ENV["BRANCHBOX_NAMESPACE"]
IMAGE = ENV["BRANCHBOX_IMAGE"]


def unix():
    return branchbox.Client(socket=ENV["BRANCHBOX_SOCKET"], namespace=NS)


def tls():
    return ssl.create_default_context(cafile=ENV["BRANCHBOX_CA"])


def tcp():
    return branchbox.Client(url=ENV["BRANCHBOX_URL"], token=ENV["BRANCHBOX_TOKEN"], namespace=NS, ssl_context=tls())


@contextlib.contextmanager
def _fake(handler, **client_args):
    """A client of a fake server on loopback that handler answers."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with branchbox.Client(url="http://127.0.0.1:%d" % srv.server_address[1], namespace=NS, **client_args) as c:
            yield c
    finally:
        srv.shutdown()
        srv.server_close()


class _OldServer(http.server.BaseHTTPRequestHandler):
    """A `branchctl serve` from before the rename: its documents have
    their branches only under the keys "contexts" and "context"."""

    protocol_version = "HTTP/1.1"
    answers = {
        ("POST", "/fork"): {"contexts": [{"id": "1", "state": "live"}]},
        ("GET", "/tree"): {"contexts": [{"id": "0", "state": "live"}, {"id": "1", "state": "live"}]},
        ("POST", "/checkpoints"): {"checkpoint": {"name": "c", "context": "1"}},
        ("GET", "/checkpoints"): {"checkpoints": [{"name": "c", "context": "1"}]},
        ("POST", "/rollback"): {"rollback": {"context": "1", "checkpoint": "c", "seconds": 0.1}},
    }

    def _answer(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        doc = self.answers.get((self.command, "/" + self.path.rsplit("/", 1)[-1]))
        body = json.dumps(doc).encode()
        self.send_response(200 if doc else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


class OldServerTest(unittest.TestCase):
    """The SDK reads a server from before the rename (deprecated keys)."""

    def test_old_keys(self):
        with _fake(_OldServer) as c:
            sb = c.sandbox("sb")
            self.assertEqual([b.id for b in sb.fork(1)], ["1"])
            self.assertEqual([n["id"] for n in sb.tree()], ["0", "1"])
            self.assertEqual(sb.checkpoint("c", branch=1)["branch"], "1")
            self.assertEqual([ck["branch"] for ck in sb.checkpoints()], ["1"])
            self.assertEqual(sb.rollback("c", branch=1)["branch"], "1")


class _HangUpServer(http.server.BaseHTTPRequestHandler):
    """Answers a GET /tree and then closes the connection (as a server's
    idle timeout does); takes a POST /fork, counts it and hangs up
    without an answer (a server that dies while it forks)."""

    protocol_version = "HTTP/1.1"
    forks = 0

    def do_GET(self):
        body = json.dumps({"branches": [{"id": "0", "state": "live"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).forks += 1
        self.close_connection = True

    def log_message(self, *args):
        pass


class _SlowServer(http.server.BaseHTTPRequestHandler):
    """Answers a GET /tree, after 300 ms if its path says slow."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if "slow" in self.path:
            time.sleep(0.3)
        body = json.dumps({"branches": [{"id": "0", "state": "live"}]}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True

    def log_message(self, *args):
        pass


class ReadTimeoutTest(unittest.TestCase):
    """A call whose read timeout passes leaves its thread able to call
    again: the connection, left waiting for that answer, refused every
    later request of the thread (CannotSendRequest)."""

    def test_next_call(self):
        with _fake(_SlowServer, timeout=0.1) as c:
            with self.assertRaises(TimeoutError):
                c.sandbox("slow").tree()
            self.assertEqual(len(c.sandbox("sb").tree()), 1)


class HangUpTest(unittest.TestCase):
    """A request on a kept-alive connection the server has closed goes on
    a new one; a fork the server took and hung up on is not sent again
    (it would fork twice): the error says it may have been done."""

    def test_hang_ups(self):
        with _fake(_HangUpServer) as c:
            sb = c.sandbox("sb")
            self.assertEqual(len(sb.tree()), 1)
            time.sleep(0.2)  # the server has closed the connection
            self.assertEqual(len(sb.tree()), 1)
            time.sleep(0.2)
            with self.assertRaises(branchbox.BranchboxError) as cm:
                sb.fork(1)
            self.assertEqual(cm.exception.kind, "unavailable")
            self.assertIn("may have", str(cm.exception))
            self.assertEqual(_HangUpServer.forks, 1)


class SDKTest(unittest.TestCase):
    def setUp(self):
        self.c = unix()
        self.sb = self.c.create_sandbox("py-" + self._testMethodName[5:].replace("_", "-"), IMAGE, args=["sleep", "1000000"])

    def tearDown(self):
        self.sb.remove()
        self.c.close()

    def test_fork_exec_commit(self):
        kids = self.sb.fork(2)
        self.assertEqual(len(kids), 2)
        a, b = kids
        a.write_file("/answer", "from a\n", mode=0o600)
        self.assertEqual(a.read_file("/answer"), b"from a\n")
        names = {e["name"]: e for e in a.list_dir("/")}
        self.assertEqual(names["answer"]["type"], "file")
        self.assertEqual(names["answer"]["mode"], "0600")
        with self.assertRaises(branchbox.BranchboxError) as cm:
            b.read_file("/answer")
        self.assertEqual(cm.exception.kind, "not-found")

        # Output streams as it comes, then the exit status.
        events = list(a.exec_stream(["sh", "-c", "echo one; sleep 0.2; echo two >&2; exit 4"]))
        self.assertEqual(events[-1][0], "exit")
        self.assertEqual(events[-1][1]["exitCode"], 4)
        self.assertEqual("".join(v for k, v in events if k == "stdout"), "one\n")
        self.assertEqual("".join(v for k, v in events if k == "stderr"), "two\n")
        r = a.exec(["sh", "-c", "read x; echo got $x"], stdin="hi\n")
        self.assertEqual((r.exit_code, r.stdout), (0, "got hi\n"))

        # A command given at fork: its output from the branch's log.
        (cmd,) = self.sb.fork(1, args=["sh", "-c", "echo from the command; exec sleep 1000000"])
        deadline = time.monotonic() + 10
        while cmd.logs() != b"from the command\n" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(cmd.logs(), b"from the command\n")
        cmd.abort()

        res = a.commit()
        self.assertEqual(res["invalidated"], [b.id])
        with self.assertRaises(branchbox.StaleError) as cm:
            b.exec(["true"])
        self.assertEqual(cm.exception.kind, "stale")
        self.assertIn("fork again", cm.exception.hint)
        self.assertEqual(self.sb.root.read_file("/answer"), b"from a\n")
        states = {c["id"]: c["state"] for c in self.sb.tree()}
        self.assertEqual((states[a.id], states[b.id]), ("committed", "stale"))

    def test_timeout_and_leaving_end_what_it_started(self):
        (b,) = self.sb.fork(1)

        def gone(pidfile):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                r = b.exec(["sh", "-c", "kill -0 $(cat %s) 2>/dev/null && echo running || echo gone" % pidfile])
                if r.stdout == "gone\n":
                    return
                time.sleep(0.05)
            self.fail("%s still runs" % pidfile)

        # A timeout: the shell, and the process it put in the background.
        with self.assertRaises(branchbox.BranchboxError) as cm:
            b.exec(["sh", "-c", "sleep 3301 & echo $! > /bg; sleep 3302"], timeout=1)
        self.assertEqual(cm.exception.kind, "deadline-exceeded")
        gone("/bg")
        # A stream left early (the generator closed): the connection goes,
        # and with it the command and what it started.
        stream = b.exec_stream(["sh", "-c", "sleep 3303 & echo $! > /left; echo started; wait"])
        self.assertEqual(next(stream), ("stdout", "started\n"))
        stream.close()
        gone("/left")

    def test_read_timeout_in_a_fork(self):
        # A client whose read timeout passes while the server forks: the
        # call raises, and the server aborts what the fork made (the
        # connection is closed: the server sees the client leave). The
        # timeouts are below a fork's time: an answer that crosses the
        # timeout is made and lost, and nothing can tell the server.
        timed_out = 0
        for t in (0.0005, 0.001, 0.0015):
            c = branchbox.Client(socket=ENV["BRANCHBOX_SOCKET"], namespace=NS, timeout=t)
            try:
                for k in c.sandbox(self.sb.name).fork(2):
                    k.abort()
            except TimeoutError:
                timed_out += 1
            c.close()
        self.assertGreater(timed_out, 0)
        for _ in range(100):
            live = [n["id"] for n in self.sb.tree() if n["state"] == "live" and n["id"] != "0"]
            if not live:
                break
            time.sleep(0.1)
        self.assertEqual(live, [])

    def test_read_timeout_in_a_checkpoint(self):
        # As a fork's: a client whose read timeout passes while the server
        # makes a checkpoint raises, and the checkpoint is not kept (a
        # listing in the moment before the server sees the client gone may
        # show it); then a retry under its name is made. Before, it was
        # kept: listed for good, and the retry refused "already exists".
        timed_out = 0
        for i, t in enumerate((0.0005, 0.001, 0.0015)):
            name = "cut-%d" % i
            c = branchbox.Client(socket=ENV["BRANCHBOX_SOCKET"], namespace=NS, timeout=t)
            try:
                c.sandbox(self.sb.name).checkpoint(name)
                made = True
            except TimeoutError:
                timed_out += 1
                made = False
            c.close()
            deadline = time.monotonic() + 5
            while True:
                listed = name in [ck["name"] for ck in self.sb.checkpoints()]
                if listed == made or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            self.assertEqual(listed, made, name)
            if not made:
                self.sb.checkpoint(name)
        self.assertGreater(timed_out, 0)

    def test_silent_command_under_a_read_timeout(self):
        # A client with a read timeout (2.5 s) runs a command that writes
        # nothing for longer (4 s): the server's keep-alive lines (every
        # 1 s here, --keepalive) hold the stream open, and the SDK skips
        # them. Without them the read timed out and the command was killed.
        (b,) = self.sb.fork(1)
        with branchbox.Client(socket=ENV["BRANCHBOX_SOCKET"], namespace=NS, timeout=2.5) as c:
            r = c.sandbox(self.sb.name).branch(b.id).exec(["sh", "-c", "sleep 4; echo done"])
            self.assertEqual((r.exit_code, r.stdout), (0, "done\n"))
            lines = list(c._stream("POST", b._path("/exec"), {"args": ["sleep", "2.5"]}))
        running = [ev["running"] for ev in lines if "running" in ev]
        self.assertGreaterEqual(len(running), 2, lines)
        self.assertEqual(running, sorted(running), lines)
        self.assertIn("exit", lines[-1])

    def test_interactive(self):
        (b,) = self.sb.fork(1)
        p = b.exec_interactive(["sh", "-c", 'while read l; do echo "got $l"; done; echo done'])
        p.write("a\n")
        it = iter(p)
        # The answer to the first line comes before the input ends.
        self.assertEqual(next(it), ("stdout", "got a\n"))
        p.write("b\n")
        p.end()
        rest = list(it)
        self.assertEqual("".join(v for k, v in rest if k == "stdout"), "got b\ndone\n")
        self.assertEqual(rest[-1][1]["exitCode"], 0)
        q = self.sb.root.exec_interactive(["sh", "-c", 'read x; echo "root got $x"'])
        q.write("y\n")
        r = q.wait()
        self.assertEqual((r.exit_code, r.stdout), (0, "root got y\n"))

    def test_checkpoint_rollback_abort(self):
        self.sb.root.write_file("/v", "1")
        ck = self.sb.checkpoint("one")
        # The branch under its key and under its old one, "context".
        self.assertEqual((ck["branch"], ck["context"]), ("0", "0"))
        self.sb.root.write_file("/v", "2")
        self.assertEqual([c["name"] for c in self.sb.checkpoints()], ["one"])
        rb = self.sb.rollback("one")
        self.assertEqual((rb["branch"], rb["context"]), ("0", "0"))
        self.assertEqual(self.sb.root.read_file("/v"), b"1")
        (k,) = self.sb.fork(1, from_checkpoint="one", seal="ro")
        self.assertEqual(k.read_file("/v"), b"1")
        # The sandbox is sealed while it has a branch.
        with self.assertRaises(branchbox.BranchboxError) as cm:
            self.sb.root.write_file("/v", "3")
        self.assertEqual(cm.exception.kind, "failed-precondition")
        self.assertEqual(k.abort(), [k.id])
        self.sb.delete_checkpoint("one")
        self.assertEqual(self.sb.checkpoints(), [])
        # With memory: the sandbox's processes too, forked from later.
        ck = self.sb.checkpoint("mem", with_memory=True)
        self.assertGreater(ck["memory_bytes"], 0)
        (m,) = self.sb.fork(1, from_checkpoint="mem", with_memory=True)
        self.assertTrue(m.info.get("memoryFork"))
        self.assertEqual(m.abort(), [m.id])
        # The sandbox itself rolled back to it: its processes replaced,
        # its files the checkpoint's, its task running on.
        self.sb.root.write_file("/v", "later")
        self.sb.rollback("mem")
        self.assertEqual(self.sb.root.read_file("/v"), b"1")
        r = self.sb.root.exec_interactive(["sh", "-c", "echo alive"]).wait()
        self.assertEqual((r.exit_code, r.stdout), (0, "alive\n"))
        self.sb.delete_checkpoint("mem")

    def test_errors_and_tokens(self):
        with self.assertRaises(branchbox.BranchboxError) as cm:
            self.c.sandbox("nosuch").fork(1)
        self.assertEqual((cm.exception.kind, cm.exception.status), ("not-found", 404))
        with self.assertRaises(branchbox.BranchboxError) as cm:
            self.sb.fork(0)
        self.assertEqual(cm.exception.kind, "invalid-argument")
        # Over TCP (TLS) with the token; without it, refused.
        with tcp() as t:
            self.assertIn(self.sb.name, [s["id"] for s in t.sandboxes()])
        with self.assertRaises(branchbox.BranchboxError) as cm, branchbox.Client(url=ENV["BRANCHBOX_URL"], namespace=NS, ssl_context=tls()) as anon:
            anon.sandboxes()
        self.assertEqual((cm.exception.kind, cm.exception.status), ("permission-denied", 401))

    def test_threads_share_a_client(self):
        kids = self.sb.fork(4)
        out = [None] * 4

        def run(i):
            out[i] = kids[i].exec(["sh", "-c", "echo %d" % i]).stdout

        ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(out, ["%d\n" % i for i in range(4)])

    def test_events(self):
        got = []
        ready = threading.Event()

        def watch():
            it = self.c.events(topic="/branch/")
            ready.set()
            for ev in it:
                got.append(ev["topic"])
                if ev["topic"] == "/branch/fork":
                    return

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        ready.wait()
        # Quiet for longer than the server's keep-alive (1 s here): its
        # lines are not events (ev["topic"] would fail on one).
        time.sleep(2.5)
        self.sb.fork(1)
        t.join(20)
        self.assertIn("/branch/fork", got)


class AsyncTest(unittest.IsolatedAsyncioTestCase):
    async def test_async_fork_exec_commit(self):
        from branchbox import aio

        c = aio.Client(socket=ENV["BRANCHBOX_SOCKET"], namespace=NS)
        sb = await c.create_sandbox("py-async", IMAGE, args=["sleep", "1000000"])
        try:
            kids = await sb.fork(3)
            # The branches run at once; the one whose test passes is kept.
            results = await asyncio.gather(*(k.exec(["sh", "-c", "echo %d > /n; [ %d = 1 ]" % (i, i)]) for i, k in enumerate(kids)))
            self.assertEqual([r.exit_code for r in results], [1, 0, 1])
            chunks = [kv async for kv in kids[1].exec_stream(["sh", "-c", "echo a; echo b >&2"])]
            self.assertEqual(chunks[-1][0], "exit")
            self.assertEqual("".join(v for k, v in chunks if k == "stdout"), "a\n")
            res = await kids[1].commit()
            self.assertEqual(sorted(res["invalidated"]), sorted([kids[0].id, kids[2].id]))
            self.assertEqual(await sb.root.read_file("/n"), b"1\n")
            with self.assertRaises(branchbox.StaleError):
                await kids[0].exec(["true"])
            winner, _ = await aio.best_of_n(sb, [["true"], ["false"]], ["true"])
            self.assertIsNotNone(winner)
        finally:
            await sb.remove()
            c.close()


class AsyncCancelTest(unittest.IsolatedAsyncioTestCase):
    """An awaited call cancelled (asyncio.wait_for's timeout, a task's
    cancel) ends what it asked for, as a client that leaves does: the
    command is killed, the fork's branches aborted. Its worker thread
    went on: the command ran to its end and the branches stayed, with
    nobody knowing them."""

    async def test_cancel_ends_the_call(self):
        from branchbox import aio

        c = aio.Client(socket=ENV["BRANCHBOX_SOCKET"], namespace=NS)
        sb = await c.create_sandbox("py-async-cancel", IMAGE, args=["sleep", "1000000"])
        try:
            (b,) = await sb.fork(1)
            with self.assertRaises(asyncio.TimeoutError):
                await asyncio.wait_for(b.exec(["sh", "-c", "exec sleep 4328"]), 1)
            cancelled = 0
            # Below a fork's time (an answer that crosses the cancel is
            # made and lost: test_read_timeout_in_a_fork).
            for delay in (0, 0.0005, 0.001, 0.002):
                try:
                    kids = await asyncio.wait_for(sb.fork(2), delay)
                except asyncio.TimeoutError:
                    cancelled += 1
                    continue
                for k in kids:  # answered before the timeout: known, so aborted here
                    await k.abort()
            self.assertGreater(cancelled, 0)

            def settled():
                ps = b._inner.exec(["ps", "-o", "args"]).stdout
                live = [n["id"] for n in sb._inner.tree() if n["state"] == "live" and n["id"] not in ("0", b.id)]
                return ps, live

            for _ in range(100):
                ps, live = await asyncio.to_thread(settled)
                if "sleep 4328" not in ps and not live:
                    break
                await asyncio.sleep(0.1)
            self.assertNotIn("sleep 4328", ps)
            self.assertEqual(live, [])
        finally:
            await sb.remove()
            c.close()


class ExampleTest(unittest.TestCase):
    def test_best_of_n_example(self):
        here = os.path.dirname(os.path.abspath(__file__))
        p = subprocess.run([sys.executable, os.path.join(here, "..", "examples", "best_of_n.py"),
                            "--socket", ENV["BRANCHBOX_SOCKET"], "--namespace", NS, "--image", IMAGE],
                           capture_output=True, text=True, timeout=300)
        sys.stderr.write(p.stdout + p.stderr)
        self.assertEqual(p.returncode, 0)
        self.assertIn("committed branch", p.stdout)
        self.assertIn("after: 0 echo $(( $1 + $2 + 0 ))", p.stdout)


if __name__ == "__main__":
    unittest.main()
