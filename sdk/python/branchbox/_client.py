"""The client: one HTTP/JSON call per operation, errors as BranchboxError."""

import concurrent.futures
import http.client
import json
import select
import socket as _socket
import threading
import urllib.parse

DEFAULT_SOCKET = "/run/branchbox/api.sock"


class BranchboxError(Exception):
    """An error the server reported: kind is branchctl --json's kind
    (not-found, invalid-argument, failed-precondition, stale,
    resource-exhausted, permission-denied, ...), hint what to do."""

    def __init__(self, kind, message, hint=None, status=None):
        super().__init__(message + (" (hint: %s)" % hint if hint else ""))
        self.kind = kind
        self.message = message
        self.hint = hint
        self.status = status


class StaleError(BranchboxError):
    """The branch lost: a sibling's commit invalidated it."""


def _error(status, body):
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return BranchboxError("unknown", "HTTP %d: %s" % (status, body[:200].decode("utf-8", "replace")), status=status)
    cls = StaleError if e.get("kind") == "stale" else BranchboxError
    return cls(e.get("kind", "unknown"), e.get("message", ""), e.get("hint"), status)


# The scope (_Scope) of the call the thread runs, if any.
_current = threading.local()


class _Scope:
    """The connections one call uses, for another thread to cut: aio's
    cancel of an awaited call ends it as a client that leaves does (the
    server kills its command, aborts its fork's branches)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._conns = []
        self._aborted = False

    def run(self, fn, *args, **kwargs):
        _current.scope = self
        try:
            return fn(*args, **kwargs)
        finally:
            _current.scope = None

    def add(self, c):
        with self._lock:
            if self._aborted:
                raise BranchboxError("canceled", "the call was cancelled before it was sent")
            self._conns.append(c)

    def abort(self):
        with self._lock:
            self._aborted = True
            conns = list(self._conns)
        for c in conns:
            sock = c.sock
            if sock is not None:
                try:
                    sock.shutdown(_socket.SHUT_RDWR)
                except OSError:
                    pass


# Requests sent again when the server hung up before answering: doing
# them twice is doing them once.
_IDEMPOTENT = ("GET", "HEAD", "PUT", "DELETE")


def _dropped(c):
    """Whether kept-alive connection c was closed by the server (or has
    something to read, which no answer waits for): readable at once."""
    if c.sock is None:
        return False
    try:
        r, _, _ = select.select([c.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)


def _abandon(c):
    """Close connection c, left in the middle of a request or its answer
    (a timeout, an interrupt): it could not carry another request, and
    its close tells the server the client left, which ends the call there
    (a command is killed, a fork's branches aborted)."""
    c.close()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self):
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        if self.timeout is not None:
            s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


class ExecResult:
    """How a process ended, with its whole output."""

    def __init__(self, exit_code, stdout, stderr, oom_killed=False, exited_at=None, branch_ended=None):
        self.exit_code = exit_code
        self.stdout = stdout
        self.stderr = stderr
        self.oom_killed = oom_killed
        self.exited_at = exited_at
        # Set when the process was killed because its branch ended
        # (another branch's commit made it stale, or it was aborted): why.
        self.branch_ended = branch_ended

    @property
    def ok(self):
        return self.exit_code == 0

    def __repr__(self):
        return "ExecResult(exit_code=%r, stdout=%r, stderr=%r)" % (self.exit_code, self.stdout, self.stderr)


class Client:
    """A connection to `branchctl serve`: its unix socket (socket=), or a
    URL (url="https://host:port") with a bearer token (token=). Every call
    is in namespace (a containerd namespace)."""

    def __init__(self, url=None, socket=None, token=None, namespace="default", timeout=None, ssl_context=None):
        if url is not None and socket is not None:
            raise ValueError("give url or socket, not both")
        if url is None and socket is None:
            socket = DEFAULT_SOCKET
        self.namespace = namespace
        self._socket = socket
        self._token = token
        self._timeout = timeout
        self._ssl = ssl_context
        if url is not None:
            u = urllib.parse.urlsplit(url)
            if u.scheme not in ("http", "https"):
                raise ValueError("url must be http:// or https://, got %r" % url)
            self._scheme, self._netloc, self._prefix = u.scheme, u.netloc, u.path.rstrip("/")
        else:
            self._scheme, self._netloc, self._prefix = "unix", None, ""
        # One connection per thread, kept alive between calls; close()
        # closes them all.
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns = []

    def close(self):
        """Close the connections this client keeps alive."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- transport -------------------------------------------------------

    def _conn(self, fresh=False):
        c = getattr(self._local, "conn", None)
        if c is None or fresh:
            if c is not None:
                c.close()
            if self._scheme == "unix":
                c = _UnixConnection(self._socket, self._timeout)
            elif self._scheme == "https":
                c = http.client.HTTPSConnection(self._netloc, timeout=self._timeout, context=self._ssl)
            else:
                c = http.client.HTTPConnection(self._netloc, timeout=self._timeout)
            self._local.conn = c
            with self._lock:
                self._conns.append(c)
        return c

    def _send(self, method, path, body=None, ctype=None, stream=False):
        headers = {}
        if ctype:
            headers["Content-Type"] = ctype
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        for attempt in (0, 1):
            # A stream holds its connection until read to the end: it
            # gets one of its own. A kept-alive connection the server
            # has closed (its idle timeout) is left before sending.
            if stream:
                c = self._stream_conn()
            else:
                c = self._conn(fresh=attempt > 0)
                if _dropped(c):
                    c = self._conn(fresh=True)
            scope = getattr(_current, "scope", None)
            if scope is not None:
                if c.sock is None:
                    c.connect()  # a socket for abort to cut
                scope.add(c)
            try:
                c.request(method, self._prefix + path, body=body, headers=headers)
            except (BrokenPipeError, ConnectionResetError):
                # Closed under the request: nothing of it was taken.
                c.close()
                if attempt or stream:
                    raise
                continue
            except BaseException:
                _abandon(c)
                raise
            try:
                resp = c.getresponse()
                break
            except (http.client.RemoteDisconnected, ConnectionResetError) as e:
                # The server took the request and hung up (it stopped,
                # or closed the connection just then). A request that
                # changes something is not sent again: it may be done.
                c.close()
                if method not in _IDEMPOTENT:
                    raise BranchboxError("unavailable", "%s %s: the server hung up before its answer (%s): it may have done it; "
                                         "look before doing it again (tree, checkpoints)" % (method, path, e)) from e
                if attempt or stream:
                    raise
            except BaseException:
                _abandon(c)
                raise
        if resp.status >= 300:
            try:
                data = resp.read()
            except BaseException:
                _abandon(c)
                raise
            if stream:
                c.close()
            raise _error(resp.status, data)
        return resp, c

    def _stream_conn(self):
        if self._scheme == "unix":
            return _UnixConnection(self._socket, self._timeout)
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._netloc, timeout=self._timeout, context=self._ssl)
        return http.client.HTTPConnection(self._netloc, timeout=self._timeout)

    def _call(self, method, path, doc=None, raw=None):
        body, ctype = None, None
        if doc is not None:
            body, ctype = json.dumps(doc).encode(), "application/json"
        elif raw is not None:
            body, ctype = raw, "application/octet-stream"
        resp, c = self._send(method, path, body, ctype)
        try:
            data = resp.read()
        except BaseException:
            _abandon(c)
            raise
        if resp.getheader("Content-Type", "").startswith("application/json"):
            return json.loads(data)
        return data

    def _stream(self, method, path, doc=None):
        body = json.dumps(doc).encode() if doc is not None else None
        resp, conn = self._send(method, path, body, "application/json" if body else None, stream=True)
        try:
            while True:
                line = resp.readline()
                if not line:
                    return
                yield json.loads(line)
        finally:
            conn.close()

    def _ns(self):
        return "/v1/namespaces/" + urllib.parse.quote(self.namespace, safe="")

    # -- sandboxes -------------------------------------------------------

    def sandboxes(self):
        """The namespace's sandboxes (branchctl ls), as dicts."""
        return self._call("GET", self._ns() + "/sandboxes")["sandboxes"]

    def create_sandbox(self, id, image, args=None, env=None, socket=False, pull=False, plain_http=False):
        """Make and start a sandbox from an image."""
        doc = {"id": id, "image": image}
        if args:
            doc["args"] = list(args)
        if env:
            doc["env"] = list(env)
        if socket:
            doc["socket"] = True
        if pull:
            doc["pull"] = True
        if plain_http:
            doc["plainHttp"] = True
        self._call("POST", self._ns() + "/sandboxes", doc)
        return Sandbox(self, id)

    def sandbox(self, name):
        """The sandbox named by its id, a unique id prefix, or its name."""
        return Sandbox(self, name)

    def pull(self, ref, sandbox, args=None, start=True, plain_http=False, user=None, secret=None):
        """Make a sandbox of an image push made, its checkpoints restored."""
        doc = {"ref": ref, "sandbox": sandbox}
        if args:
            doc["args"] = list(args)
        if not start:
            doc["noStart"] = True
        _registry(doc, plain_http, user, secret)
        self._call("POST", self._ns() + "/pull", doc)
        return Sandbox(self, sandbox)

    def events(self, topic=None):
        """The namespace's containerd events, as dicts, until the caller
        stops iterating; topic="/branch/" keeps the branch events."""
        q = "?topic=" + urllib.parse.quote(topic) if topic else ""
        # Without the server's keep-alive lines (sent while no event comes).
        return (ev for ev in self._stream("GET", self._ns() + "/events" + q) if "keepalive" not in ev)


def _branches(doc):
    """The branches of a fork's or tree's answer: "branches", or
    "contexts", the key's old name, from a server before the rename."""
    return doc["branches"] if "branches" in doc else doc["contexts"]


def _with_branch(doc):
    """A checkpoint's or rollback's answer with its branch under "branch",
    also from a server before the rename, which has it only under
    "context" (a key that goes in the release after next)."""
    if "branch" not in doc and "context" in doc:
        doc["branch"] = doc["context"]
    return doc


def _registry(doc, plain_http, user, secret):
    if plain_http:
        doc["plainHttp"] = True
    if user:
        doc["user"] = user
    if secret:
        doc["secret"] = secret


class Sandbox:
    """A sandbox: its branches, checkpoints and images."""

    def __init__(self, client, name):
        self.client = client
        self.name = name

    def _path(self, rest=""):
        return self.client._ns() + "/sandboxes/" + urllib.parse.quote(self.name, safe="") + rest

    @property
    def root(self):
        """The sandbox itself, branch "0"."""
        return Branch(self, "0")

    def branch(self, id):
        return Branch(self, str(id))

    def fork(self, count=1, parent=None, from_checkpoint=None, seal=None, net=None, memory=None, cpus=None, pids=None, args=None,
             with_memory=None):
        """Make count branches of the sandbox (or of branch parent), each
        with its own copy-on-write rootfs and processes. memory is the
        branches' limit in bytes; with_memory=True forks the running
        processes too (a memory fork; with from_checkpoint, the
        checkpoint's)."""
        doc = {"count": count}
        for k, v in (("parent", parent), ("from", from_checkpoint), ("seal", seal), ("net", net),
                     ("memory", memory), ("cpus", cpus), ("pids", pids), ("args", args), ("with_memory", with_memory)):
            if v is not None:
                doc[k] = list(v) if k == "args" else (str(v) if k == "parent" else v)
        out = self.client._call("POST", self._path("/fork"), doc)
        return [Branch(self, c["id"], c) for c in _branches(out)]

    def tree(self):
        """Every branch, ended ones included (branchctl tree), as dicts."""
        return _branches(self.client._call("GET", self._path("/tree")))

    def checkpoint(self, name, branch=None, with_memory=False):
        """Record a branch's files as name; with_memory=True its running
        processes too."""
        doc = {"name": name}
        if branch is not None:
            doc["branch"] = str(branch)
        if with_memory:
            doc["with_memory"] = True
        return _with_branch(self.client._call("POST", self._path("/checkpoints"), doc)["checkpoint"])

    def checkpoints(self):
        return [_with_branch(c) for c in self.client._call("GET", self._path("/checkpoints"))["checkpoints"]]

    def delete_checkpoint(self, name):
        self.client._call("DELETE", self._path("/checkpoints/" + urllib.parse.quote(name, safe="")))

    def rollback(self, name, branch=None):
        doc = {"name": name}
        if branch is not None:
            doc["branch"] = str(branch)
        return _with_branch(self.client._call("POST", self._path("/rollback"), doc)["rollback"])

    def push(self, ref, branch=None, checkpoint=None, plain_http=False, user=None, secret=None):
        doc = {"ref": ref}
        if branch is not None:
            doc["branch"] = str(branch)
        if checkpoint is not None:
            doc["checkpoint"] = checkpoint
        _registry(doc, plain_http, user, secret)
        return self.client._call("POST", self._path("/push"), doc)["push"]

    def remove(self):
        """Kill the sandbox (its branches with it) and delete it."""
        self.client._call("DELETE", self._path())


class Branch:
    """A branch of a sandbox, or the sandbox itself ("0")."""

    def __init__(self, sandbox, id, info=None):
        self.sandbox = sandbox
        self.id = id
        self.info = info or {}

    def __repr__(self):
        return "Branch(%r/%s)" % (self.sandbox.name, self.id)

    def _path(self, rest):
        return self.sandbox._path("/branches/" + urllib.parse.quote(self.id, safe="") + rest)

    def exec_stream(self, args, env=None, cwd=None, stdin=None, timeout=None):
        """Run args in the branch; yield ("stdout", text), ("stderr",
        text) as output comes, then ("exit", status dict). A process that
        ran into an error (its timeout) raises BranchboxError."""
        doc = {"args": list(args)}
        if env:
            doc["env"] = list(env)
        if cwd:
            doc["cwd"] = cwd
        if stdin is not None:
            doc["stdin"] = stdin if isinstance(stdin, str) else stdin.decode()
        if timeout:
            doc["timeout"] = timeout
        for ev in self.sandbox.client._stream("POST", self._path("/exec"), doc):
            if "stdout" in ev:
                yield "stdout", ev["stdout"]
            elif "stderr" in ev:
                yield "stderr", ev["stderr"]
            elif "exit" in ev:
                yield "exit", ev["exit"]
            elif "error" in ev:
                e = ev["error"]
                raise BranchboxError(e.get("kind", "unknown"), e.get("message", ""), e.get("hint"))

    def exec_interactive(self, args, env=None, cwd=None, timeout=None):
        """Run args with its standard input open: an Interactive to write()
        to and end(), whose iteration yields ("stdout"|"stderr", text) as
        the output comes and then ("exit", status); wait() gives the whole
        ExecResult. The request and the response stream at once."""
        doc = {"args": list(args)}
        if env:
            doc["env"] = list(env)
        if cwd:
            doc["cwd"] = cwd
        if timeout:
            doc["timeout"] = timeout
        return Interactive(self.sandbox.client, self._path("/exec"), doc, args)

    def exec(self, args, env=None, cwd=None, stdin=None, timeout=None):
        """Run args in the branch and wait: an ExecResult."""
        out, err, st = [], [], None
        for kind, v in self.exec_stream(args, env=env, cwd=cwd, stdin=stdin, timeout=timeout):
            if kind == "stdout":
                out.append(v)
            elif kind == "stderr":
                err.append(v)
            else:
                st = v
        if st is None:
            raise BranchboxError("unknown", "exec %r: the stream ended without an exit status" % (args,))
        return ExecResult(st["exitCode"], "".join(out), "".join(err), st.get("oomKilled", False), st.get("exitedAt"), st.get("branchEnded"))

    def read_file(self, path):
        """A file's bytes, as the branch's processes see it."""
        return self.sandbox.client._call("GET", self._path("/files?path=" + urllib.parse.quote(path)))

    def write_file(self, path, data, mode=None):
        """Replace (or create) a file; its directory must exist."""
        if isinstance(data, str):
            data = data.encode()
        q = "/files?path=" + urllib.parse.quote(path)
        if mode is not None:
            q += "&mode=%o" % mode
        return self.sandbox.client._call("PUT", self._path(q), raw=data)["written"]

    def list_dir(self, path):
        """A directory's entries: dicts of name, type, size, mode, modified."""
        return self.sandbox.client._call("GET", self._path("/dir?path=" + urllib.parse.quote(path)))["entries"]

    def commit(self):
        """Make the branch's changes its parent's. The first commit wins;
        its siblings are invalidated (a loser raises StaleError). Returns
        {"parent": branch, "invalidated": [ids]}."""
        return self.sandbox.client._call("POST", self._path("/commit"))["commit"]

    def logs(self):
        """What the branch's command (fork's args), or a memory branch's
        processes, wrote to stdout and stderr: its last 1-2 MiB, as bytes."""
        return self.sandbox.client._call("GET", self._path("/logs"))

    def abort(self):
        """Kill and discard the branch; returns the ids aborted."""
        return self.sandbox.client._call("POST", self._path("/abort"))["abort"]["aborted"]


class Interactive:
    """A process started by Branch.exec_interactive."""

    def __init__(self, client, path, doc, args):
        self._args = args
        c = client._stream_conn()
        # A chunked request written by hand: http.client sends a body
        # whole before it reads a response, and here the body (stdin) goes
        # on while the response (the output) comes.
        c.putrequest("POST", client._prefix + path)
        c.putheader("Content-Type", "application/x-ndjson")
        c.putheader("Transfer-Encoding", "chunked")
        if client._token:
            c.putheader("Authorization", "Bearer " + client._token)
        c.endheaders()
        self._conn = c
        # The socket itself: http.client lets go of it when the response
        # says Connection: close (the server's, for an interactive exec),
        # and would send later chunks on a new connection.
        self._sock = c.sock
        self._ended = False
        self._line(doc)
        resp = c.getresponse()
        if resp.status >= 300:
            data = resp.read()
            c.close()
            raise _error(resp.status, data)
        self._resp = resp

    def _line(self, doc):
        data = (json.dumps(doc) + "\n").encode()
        self._sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def write(self, data):
        """Write to the process's standard input."""
        if isinstance(data, bytes):
            data = data.decode()
        self._line({"stdin": data})

    def end(self):
        """Close its standard input."""
        if not self._ended:
            self._ended = True
            try:
                self._line({"eof": True})
                self._sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                # The process ended first (it read what it needed and
                # exited) and the server closed the request: its input
                # is over anyway, and its answer is there to read.
                pass

    def __iter__(self):
        try:
            while True:
                line = self._resp.readline()
                if not line:
                    return
                ev = json.loads(line)
                if "stdout" in ev:
                    yield "stdout", ev["stdout"]
                elif "stderr" in ev:
                    yield "stderr", ev["stderr"]
                elif "exit" in ev:
                    yield "exit", ev["exit"]
                elif "error" in ev:
                    e = ev["error"]
                    cls = StaleError if e.get("kind") == "stale" else BranchboxError
                    raise cls(e.get("kind", "unknown"), e.get("message", ""), e.get("hint"))
        finally:
            self._resp.close()
            self._sock.close()

    def wait(self):
        """Close stdin if still open, and wait for the whole ExecResult."""
        self.end()
        out, err, st = [], [], None
        for kind, v in self:
            if kind == "stdout":
                out.append(v)
            elif kind == "stderr":
                err.append(v)
            else:
                st = v
        if st is None:
            raise BranchboxError("unknown", "exec %r: the stream ended without an exit status" % (self._args,))
        return ExecResult(st["exitCode"], "".join(out), "".join(err), st.get("oomKilled", False), st.get("exitedAt"), st.get("branchEnded"))


def best_of_n(sandbox, attempts, test, timeout=None):
    """Fork one branch per attempt (a command list), run each attempt and
    then test in its branch, all at once, and commit the first branch
    whose test exits 0; the rest are invalidated by that commit. Returns
    (branch, results): the winner (None if none passed) and each branch's
    ExecResult of its test (None where its attempt failed)."""
    kids = sandbox.fork(len(attempts))
    results = [None] * len(kids)
    winner = None
    lock = threading.Lock()

    def run(i):
        nonlocal winner
        b = kids[i]
        try:
            if b.exec(attempts[i], timeout=timeout).exit_code != 0:
                return
            r = b.exec(test, timeout=timeout)
        except StaleError:
            return  # another branch won first
        except BranchboxError:
            # A sibling's commit kills this branch: whatever its calls
            # then say (a process that could not start), it lost.
            if winner is not None:
                return
            raise
        results[i] = r
        if r.exit_code != 0:
            return
        with lock:
            if winner is not None:
                return
            try:
                b.commit()
            except StaleError:
                return
            winner = b

    with concurrent.futures.ThreadPoolExecutor(len(kids)) as pool:
        list(pool.map(run, range(len(kids))))
    if winner is None:
        for b in kids:
            try:
                b.abort()
            except BranchboxError:
                pass
    return winner, results
