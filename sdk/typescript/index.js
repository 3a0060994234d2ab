// @branchbox/sdk: the TypeScript (JavaScript) client of branchbox's HTTP
// API, `branchctl serve`. Plain ESM with hand-written declarations
// (index.d.ts): no build step, no dependencies, node's http only.
// docs/sdk-typescript.md.

import http from 'node:http';
import https from 'node:https';

export const DEFAULT_SOCKET = '/run/branchbox/api.sock';

/** An error the server reported, with branchctl --json's kind. */
export class BranchboxError extends Error {
  constructor(kind, message, hint, status) {
    super(hint ? `${message} (hint: ${hint})` : message);
    this.name = 'BranchboxError';
    this.kind = kind;
    this.hint = hint;
    this.status = status;
  }
}

/** The branch lost: a sibling's commit invalidated it. */
export class StaleError extends BranchboxError {
  constructor(...a) {
    super(...a);
    this.name = 'StaleError';
  }
}

function toError(status, body) {
  let e;
  try {
    e = JSON.parse(body).error;
  } catch {
    return new BranchboxError('unknown', `HTTP ${status}: ${String(body).slice(0, 200)}`, undefined, status);
  }
  const C = e.kind === 'stale' ? StaleError : BranchboxError;
  return new C(e.kind, e.message, e.hint, status);
}

const enc = encodeURIComponent;

// Requests sent again when the server hung up before answering: doing them
// twice is doing them once.
const IDEMPOTENT = new Set(['GET', 'HEAD', 'PUT', 'DELETE']);

// The branches of a fork's or tree's answer: "branches", or "contexts", the
// key's old name, from a server before the rename.
const branchesOf = (doc) => doc.branches ?? doc.contexts;

// A checkpoint's or rollback's answer with its branch under "branch", also
// from a server before the rename, which has it only under "context" (a key
// that goes in the release after next).
const withBranch = (doc) => (doc.branch === undefined && doc.context !== undefined ? { ...doc, branch: doc.context } : doc);

export class Client {
  /**
   * @param {{socket?: string, url?: string, token?: string, namespace?: string, ca?: string|Buffer}} [opts]
   */
  constructor(opts = {}) {
    this.namespace = opts.namespace ?? 'default';
    this.token = opts.token;
    if (opts.url && opts.socket) throw new TypeError('give url or socket, not both');
    if (opts.url) {
      const u = new URL(opts.url);
      if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new TypeError(`url must be http: or https:, got ${opts.url}`);
      this._base = { protocol: u.protocol, hostname: u.hostname, port: u.port, prefix: u.pathname.replace(/\/$/, '') };
      this._mod = u.protocol === 'https:' ? https : http;
      this._agent = new this._mod.Agent({ keepAlive: true, ca: opts.ca });
    } else {
      this._base = { socketPath: opts.socket ?? DEFAULT_SOCKET, prefix: '' };
      this._mod = http;
      this._agent = new http.Agent({ keepAlive: true });
    }
  }

  /** Close the connections kept alive. */
  close() {
    this._agent.destroy();
  }

  _ns() {
    return `/v1/namespaces/${enc(this.namespace)}`;
  }

  // _request sends a request and resolves with the response once its
  // status is in; an error status rejects with its body's error. A server
  // that hangs up before the status (its idle timeout closing a kept-alive
  // connection as the request came, or a server stopping) gets a read
  // again, once, on a new connection; a request that changes something
  // is not sent again (it may be done) and rejects with unavailable.
  _request(method, path, body, ctype, signal, again = true) {
    const { prefix, ...base } = this._base;
    const headers = {};
    if (ctype) headers['Content-Type'] = ctype;
    if (body) headers['Content-Length'] = Buffer.byteLength(body);
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    return new Promise((resolve, reject) => {
      const req = this._mod.request({ ...base, agent: this._agent, method, path: prefix + path, headers, signal }, (res) => {
        if (res.statusCode >= 300) {
          const chunks = [];
          res.on('data', (c) => chunks.push(c));
          res.on('end', () => reject(toError(res.statusCode, Buffer.concat(chunks).toString())));
          res.on('error', reject);
          return;
        }
        resolve(res);
      });
      req.on('error', (err) => {
        if (/** @type {any} */ (err).code !== 'ECONNRESET' || signal?.aborted) {
          reject(err);
        } else if (!IDEMPOTENT.has(method)) {
          reject(new BranchboxError('unavailable', `${method} ${path}: the server hung up before its answer (${err.message}): it may have done it; look before doing it again (tree, checkpoints)`));
        } else if (again && req.reusedSocket) {
          resolve(this._request(method, path, body, ctype, signal, false));
        } else {
          reject(err);
        }
      });
      req.end(body);
    });
  }

  async _call(method, path, doc, signal) {
    const res = await this._request(method, path, doc === undefined ? undefined : JSON.stringify(doc), doc === undefined ? undefined : 'application/json', signal);
    const chunks = [];
    for await (const c of res) chunks.push(c);
    const buf = Buffer.concat(chunks);
    return (res.headers['content-type'] ?? '').startsWith('application/json') ? JSON.parse(buf.toString()) : buf;
  }

  async _raw(method, path, data) {
    const res = await this._request(method, path, data, 'application/octet-stream');
    const chunks = [];
    for await (const c of res) chunks.push(c);
    return JSON.parse(Buffer.concat(chunks).toString());
  }

  // _lines yields the JSON lines of a streamed response.
  async *_lines(method, path, doc, signal) {
    const res = await this._request(method, path, doc === undefined ? undefined : JSON.stringify(doc), doc === undefined ? undefined : 'application/json', signal);
    let buf = '';
    try {
      for await (const c of res) {
        buf += c.toString();
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (line) yield JSON.parse(line);
        }
      }
    } finally {
      res.destroy();
    }
  }

  /** The namespace's sandboxes (branchctl ls). */
  async sandboxes() {
    return (await this._call('GET', `${this._ns()}/sandboxes`)).sandboxes;
  }

  /** Make and start a sandbox from an image. */
  async createSandbox(opts) {
    await this._call('POST', `${this._ns()}/sandboxes`, opts);
    return new Sandbox(this, opts.id);
  }

  /** A sandbox by its id, a unique id prefix, or its name. */
  sandbox(name) {
    return new Sandbox(this, name);
  }

  /** Make a sandbox of an image push made, its checkpoints restored. */
  async pull(opts) {
    return (await this._call('POST', `${this._ns()}/pull`, opts)).pull;
  }

  /** The namespace's containerd events until signal aborts; topic '/branch/' keeps the branch events. */
  async *events(opts = {}) {
    const q = opts.topic ? `?topic=${enc(opts.topic)}` : '';
    for await (const ev of this._lines('GET', `${this._ns()}/events${q}`, undefined, opts.signal)) {
      if (!ev.keepalive) yield ev; // the server's keep-alive, while no event comes
    }
  }
}

export class Sandbox {
  constructor(client, name) {
    this.client = client;
    this.name = name;
  }

  _path(rest = '') {
    return `${this.client._ns()}/sandboxes/${enc(this.name)}${rest}`;
  }

  /** The sandbox itself, branch "0". */
  get root() {
    return new Branch(this, '0');
  }

  branch(id) {
    return new Branch(this, String(id));
  }

  /** Make branches of the sandbox (or of opts.parent). Aborting
   * opts.signal before the answer disconnects: the server aborts the
   * branches the fork made. */
  async fork(opts = {}) {
    const { signal, ...doc } = opts;
    const out = await this.client._call('POST', this._path('/fork'), { count: 1, ...doc }, signal);
    return branchesOf(out).map((c) => new Branch(this, c.id, c));
  }

  async tree() {
    return branchesOf(await this.client._call('GET', this._path('/tree')));
  }

  async checkpoint(name, branch, opts = {}) {
    const doc = { name, ...opts };
    if (branch !== undefined) doc.branch = String(branch);
    return withBranch((await this.client._call('POST', this._path('/checkpoints'), doc)).checkpoint);
  }

  async checkpoints() {
    return (await this.client._call('GET', this._path('/checkpoints'))).checkpoints.map(withBranch);
  }

  async deleteCheckpoint(name) {
    await this.client._call('DELETE', this._path(`/checkpoints/${enc(name)}`));
  }

  async rollback(name, branch) {
    return withBranch((await this.client._call('POST', this._path('/rollback'), branch === undefined ? { name } : { name, branch: String(branch) })).rollback);
  }

  async push(opts) {
    return (await this.client._call('POST', this._path('/push'), opts)).push;
  }

  /** Kill the sandbox (its branches with it) and delete it. */
  async remove() {
    await this.client._call('DELETE', this._path());
  }
}

export class Branch {
  constructor(sandbox, id, info) {
    this.sandbox = sandbox;
    this.id = id;
    this.info = info;
  }

  _path(rest) {
    return this.sandbox._path(`/branches/${enc(this.id)}${rest}`);
  }

  /**
   * Run args in the branch: an async iterable of {stdout} and {stderr}
   * chunks as they come, then {exit}. An error line throws.
   */
  async *execStream(args, opts = {}) {
    const { signal, ...rest } = opts;
    for await (const ev of this.sandbox.client._lines('POST', this._path('/exec'), { args, ...rest }, signal)) {
      if (ev.running !== undefined) continue; // the server's keep-alive
      if (ev.error) {
        const C = ev.error.kind === 'stale' ? StaleError : BranchboxError;
        throw new C(ev.error.kind, ev.error.message, ev.error.hint);
      }
      yield ev;
    }
  }

  /**
   * Run args in the branch with its standard input open: write to it and
   * end it while its output comes (the request and the response stream at
   * once). Iterate the returned object for {stdout}, {stderr}, {exit}, or
   * call wait() for the whole result.
   */
  execInteractive(args, opts = {}) {
    const c = this.sandbox.client;
    const { signal, ...rest } = opts;
    const { prefix, ...base } = c._base;
    const headers = { 'Content-Type': 'application/x-ndjson' };
    if (c.token) headers.Authorization = `Bearer ${c.token}`;
    const req = c._mod.request({ ...base, agent: c._agent, method: 'POST', path: prefix + this._path('/exec'), headers, signal });
    const response = new Promise((resolve, reject) => {
      req.on('response', (res) => {
        if (res.statusCode >= 300) {
          const chunks = [];
          res.on('data', (d) => chunks.push(d));
          res.on('end', () => reject(toError(res.statusCode, Buffer.concat(chunks).toString())));
          return;
        }
        resolve(res);
      });
      req.on('error', reject);
    });
    response.catch(() => {}); // surfaced by iteration or wait()
    req.write(`${JSON.stringify({ args, ...rest })}\n`);
    async function* events() {
      const res = await response;
      let buf = '';
      try {
        for await (const chunk of res) {
          buf += chunk.toString();
          let i;
          while ((i = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, i);
            buf = buf.slice(i + 1);
            if (!line) continue;
            const ev = JSON.parse(line);
            if (ev.running !== undefined) continue; // the server's keep-alive
            if (ev.error) {
              const C = ev.error.kind === 'stale' ? StaleError : BranchboxError;
              throw new C(ev.error.kind, ev.error.message, ev.error.hint);
            }
            yield ev;
          }
        }
      } finally {
        res.destroy();
      }
    }
    const it = events();
    return {
      /** Write to the process's standard input. */
      write(data) {
        req.write(`${JSON.stringify({ stdin: String(data) })}\n`);
      },
      /** Close its standard input. */
      end() {
        req.end(`${JSON.stringify({ eof: true })}\n`);
      },
      [Symbol.asyncIterator]() {
        return it;
      },
      /** Close stdin if still open, and wait for the whole result. */
      async wait() {
        if (!req.writableEnded) this.end();
        let stdout = '';
        let stderr = '';
        let exit;
        for await (const ev of it) {
          if (ev.stdout !== undefined) stdout += ev.stdout;
          else if (ev.stderr !== undefined) stderr += ev.stderr;
          else if (ev.exit) exit = ev.exit;
        }
        if (!exit) throw new BranchboxError('unknown', `exec ${JSON.stringify(args)}: the stream ended without an exit status`);
        return { ...exit, stdout, stderr };
      },
    };
  }

  /** Run args in the branch and wait: {exitCode, stdout, stderr, oomKilled, exitedAt, branchEnded}. */
  async exec(args, opts = {}) {
    let stdout = '';
    let stderr = '';
    let exit;
    for await (const ev of this.execStream(args, opts)) {
      if (ev.stdout !== undefined) stdout += ev.stdout;
      else if (ev.stderr !== undefined) stderr += ev.stderr;
      else if (ev.exit) exit = ev.exit;
    }
    if (!exit) throw new BranchboxError('unknown', `exec ${JSON.stringify(args)}: the stream ended without an exit status`);
    return { ...exit, stdout, stderr };
  }

  /** A file's bytes, as the branch's processes see it. */
  async readFile(path) {
    return this.sandbox.client._call('GET', this._path(`/files?path=${enc(path)}`));
  }

  /** Replace (or create) a file; its directory must exist. */
  async writeFile(path, data, opts = {}) {
    const mode = opts.mode === undefined ? '' : `&mode=${opts.mode.toString(8)}`;
    const body = typeof data === 'string' ? Buffer.from(data) : Buffer.from(data);
    return (await this.sandbox.client._raw('PUT', this._path(`/files?path=${enc(path)}${mode}`), body)).written;
  }

  async listDir(path) {
    return (await this.sandbox.client._call('GET', this._path(`/dir?path=${enc(path)}`))).entries;
  }

  /** Make the branch's changes its parent's; the first commit wins (a loser throws StaleError). */
  async commit() {
    return (await this.sandbox.client._call('POST', this._path('/commit'))).commit;
  }

  /** What the branch's command (fork's args), or a memory branch's processes, wrote to stdout and stderr: its last 1-2 MiB. */
  async logs() {
    return this.sandbox.client._call('GET', this._path('/logs'));
  }

  async abort() {
    return (await this.sandbox.client._call('POST', this._path('/abort'))).abort.aborted;
  }
}

/**
 * Fork one branch per attempt, run each attempt then test in its branch,
 * all at once, and commit the first whose test exits 0 (its siblings are
 * invalidated by that commit). Resolves with the winner (or null) and
 * each attempt's test result (null where the attempt failed or lost).
 */
export async function bestOfN(sandbox, attempts, test, opts = {}) {
  const kids = await sandbox.fork({ count: attempts.length });
  const results = new Array(kids.length).fill(null);
  let winner = null;
  await Promise.all(kids.map(async (b, i) => {
    try {
      if ((await b.exec(attempts[i], opts)).exitCode !== 0) return;
      const r = await b.exec(test, opts);
      results[i] = r;
      if (r.exitCode !== 0 || winner) return;
      winner = b; // claimed before the await: one commit is tried
      await b.commit();
    } catch (e) {
      if (winner === b) winner = null;
      // A sibling's commit kills this branch: whatever its calls then
      // say (stale, or a process that could not start), it lost.
      if (!(e instanceof StaleError) && !(winner && winner !== b)) throw e;
    }
  }));
  if (!winner) {
    await Promise.all(kids.map((b) => b.abort().catch(() => {})));
  }
  return { winner, results };
}
