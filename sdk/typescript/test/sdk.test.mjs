// @ts-check
// The TypeScript SDK against a real `branchctl serve`
// (integration/sdk_test.go runs it with node --test, with
// BRANCHBOX_SOCKET, BRANCHBOX_URL, BRANCHBOX_TOKEN, BRANCHBOX_NAMESPACE and
// BRANCHBOX_IMAGE set).

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { after, before, describe, test } from 'node:test';

import { BranchboxError, Client, StaleError } from '@branchbox/sdk';
import { main as bestOfNExample } from '../examples/best-of-n.mjs';

const env = process.env;
const NS = env.BRANCHBOX_NAMESPACE ?? 'default';
const IMAGE = env.BRANCHBOX_IMAGE ?? '';

/** @param {() => Promise<unknown>} fn @param {string} kind */
async function rejectsWith(fn, kind) {
  await assert.rejects(fn, (/** @type {any} */ e) => {
    assert.ok(e instanceof BranchboxError, `${e}`);
    assert.equal(e.kind, kind, e.message);
    return true;
  });
}

describe('branchbox SDK', () => {
  const c = new Client({ socket: env.BRANCHBOX_SOCKET, namespace: NS });
  after(() => c.close());

  test('fork, files, exec, commit', async () => {
    const sb = await c.createSandbox({ id: 'ts-fork', image: IMAGE, args: ['sleep', '1000000'] });
    try {
      const [a, b] = await sb.fork({ count: 2 });
      await a.writeFile('/answer', 'from a\n', { mode: 0o600 });
      assert.equal((await a.readFile('/answer')).toString(), 'from a\n');
      const entry = (await a.listDir('/')).find((e) => e.name === 'answer');
      assert.deepEqual([entry?.type, entry?.mode], ['file', '0600']);
      await rejectsWith(() => b.readFile('/answer'), 'not-found');

      // Output streams as it comes, then the exit status; the server's
      // keep-alive lines (after 1 s without output here) are not events.
      const events = [];
      for await (const ev of a.execStream(['sh', '-c', 'echo one; sleep 2.5; echo two >&2; exit 4'])) events.push(ev);
      assert.ok(events.every((e) => ['stdout', 'stderr', 'exit'].includes(Object.keys(e).join())), JSON.stringify(events));
      const last = events.at(-1);
      assert.ok(last && 'exit' in last && last.exit.exitCode === 4, JSON.stringify(events));
      const out = events.map((e) => ('stdout' in e ? e.stdout : '')).join('');
      const err = events.map((e) => ('stderr' in e ? e.stderr : '')).join('');
      assert.deepEqual([out, err], ['one\n', 'two\n']);
      const r = await a.exec(['sh', '-c', 'read x; echo got $x; echo e >&2; exit 2'], { stdin: 'hi\n' });
      assert.deepEqual([r.exitCode, r.stdout, r.stderr], [2, 'got hi\n', 'e\n']);

      // A command given at fork: its output from the branch's log.
      const [cmd] = await sb.fork({ count: 1, args: ['sh', '-c', 'echo from the command; exec sleep 1000000'] });
      for (const until = Date.now() + 10000; (await cmd.logs()).toString() !== 'from the command\n' && Date.now() < until; ) {
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.equal((await cmd.logs()).toString(), 'from the command\n');
      await cmd.abort();

      const res = await a.commit();
      assert.deepEqual(res.invalidated, [b.id]);
      await assert.rejects(() => b.exec(['true']), StaleError);
      assert.equal((await sb.root.readFile('/answer')).toString(), 'from a\n');
      const states = Object.fromEntries((await sb.tree()).map((x) => [x.id, x.state]));
      assert.deepEqual([states[a.id], states[b.id]], ['committed', 'stale']);
    } finally {
      await sb.remove();
    }
  });

  test('interactive exec: input written while output comes', async () => {
    const sb = await c.createSandbox({ id: 'ts-interactive', image: IMAGE, args: ['sleep', '1000000'] });
    try {
      const [b] = await sb.fork();
      const p = b.execInteractive(['sh', '-c', 'while read l; do echo "got $l"; done; echo done']);
      p.write('a\n');
      const it = p[Symbol.asyncIterator]();
      // The answer to the first line comes before the input ends.
      const first = await it.next();
      assert.deepEqual(first.value, { stdout: 'got a\n' });
      // Quiet for longer than the server's keep-alive (1 s here).
      await new Promise((r) => setTimeout(r, 2500));
      p.write('b\n');
      p.end();
      let out = '';
      let exit;
      for (let r = await it.next(); !r.done; r = await it.next()) {
        assert.ok(['stdout', 'exit'].includes(Object.keys(r.value).join()), JSON.stringify(r.value));
        if ('stdout' in r.value) out += r.value.stdout;
        if ('exit' in r.value) exit = r.value.exit;
      }
      assert.equal(out, 'got b\ndone\n');
      assert.equal(exit?.exitCode, 0);
      // In the sandbox itself too, with wait().
      const q = sb.root.execInteractive(['sh', '-c', 'read x; echo "root got $x"']);
      q.write('y\n');
      const r = await q.wait();
      assert.deepEqual([r.exitCode, r.stdout], [0, 'root got y\n']);
    } finally {
      await sb.remove();
    }
  });

  test('checkpoint, rollback, abort, errors', async () => {
    const sb = await c.createSandbox({ id: 'ts-ck', image: IMAGE, args: ['sleep', '1000000'] });
    try {
      await sb.root.writeFile('/v', '1');
      const one = await sb.checkpoint('one');
      // The branch under its key and under its old one, context.
      assert.deepEqual([one.branch, one.context], ['0', '0']);
      await sb.root.writeFile('/v', '2');
      const rb = await sb.rollback('one');
      assert.deepEqual([rb.branch, rb.context], ['0', '0']);
      assert.equal((await sb.root.readFile('/v')).toString(), '1');
      const [k] = await sb.fork({ from: 'one' });
      await rejectsWith(() => sb.root.writeFile('/v', '3'), 'failed-precondition');
      assert.deepEqual(await k.abort(), [k.id]);
      await sb.deleteCheckpoint('one');
      assert.deepEqual(await sb.checkpoints(), []);
      // With memory: the sandbox's processes too, forked from later.
      const ck = await sb.checkpoint('mem', undefined, { with_memory: true });
      assert.ok((ck.memory_bytes ?? 0) > 0);
      const [m] = await sb.fork({ from: 'mem', with_memory: true });
      assert.equal(m.info?.memoryFork, true);
      assert.deepEqual(await m.abort(), [m.id]);
      // The sandbox itself rolled back to it: its processes replaced, its
      // files the checkpoint's, its task running on.
      await sb.root.writeFile('/v', 'later');
      await sb.rollback('mem');
      assert.equal((await sb.root.readFile('/v')).toString(), '1');
      const r = await sb.root.exec(['sh', '-c', 'echo alive']);
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, 'alive\n');
      await sb.deleteCheckpoint('mem');
      await rejectsWith(() => c.sandbox('nosuch').fork(), 'not-found');
      await rejectsWith(() => sb.fork({ count: 0 }), 'invalid-argument');
    } finally {
      await sb.remove();
    }
  });

  test('TCP (TLS) with a token; without one, refused', async () => {
    const ca = readFileSync(env.BRANCHBOX_CA ?? '');
    assert.ok(env.BRANCHBOX_URL?.startsWith('https://'));
    const t = new Client({ url: env.BRANCHBOX_URL, token: env.BRANCHBOX_TOKEN, namespace: NS, ca });
    const anon = new Client({ url: env.BRANCHBOX_URL, namespace: NS, ca });
    try {
      assert.ok(Array.isArray(await t.sandboxes()));
      await assert.rejects(() => anon.sandboxes(), (/** @type {any} */ e) => e.kind === 'permission-denied' && e.status === 401);
    } finally {
      t.close();
      anon.close();
    }
  });

  test('events', async () => {
    const sb = await c.createSandbox({ id: 'ts-ev', image: IMAGE, args: ['sleep', '1000000'] });
    const ac = new AbortController();
    try {
      const seen = (async () => {
        for await (const ev of c.events({ topic: '/branch/', signal: ac.signal })) {
          assert.equal(typeof ev.topic, 'string', JSON.stringify(ev)); // no keep-alive line
          if (ev.topic === '/branch/fork') return ev;
        }
      })();
      // Quiet for longer than the server's keep-alive (1 s here).
      await new Promise((r) => setTimeout(r, 2500));
      await sb.fork();
      const ev = await seen;
      assert.equal(ev?.topic, '/branch/fork');
    } finally {
      ac.abort();
      await sb.remove();
    }
  });

  // A fork whose signal aborts it before the answer makes no branch: the
  // server sees the client leave and aborts what the fork made.
  test('a fork aborted by its signal', async () => {
    const sb = await c.createSandbox({ id: 'ts-fork-abort', image: IMAGE, args: ['sleep', '1000000'] });
    try {
      let aborted = 0;
      for (const ms of [0, 1, 2, 3]) {
        try {
          for (const k of await sb.fork({ count: 2, signal: AbortSignal.timeout(ms) })) await k.abort();
        } catch (e) {
          assert.ok(['AbortError', 'TimeoutError'].includes(/** @type {any} */ (e).name), `${e}`);
          aborted++;
        }
      }
      assert.ok(aborted > 0, 'no fork was aborted');
      /** @type {string[]} */
      let live = [];
      for (const until = Date.now() + 10000; Date.now() < until; await new Promise((r) => setTimeout(r, 100))) {
        live = (await sb.tree()).filter((n) => n.state === 'live' && n.id !== '0').map((n) => n.id);
        if (live.length === 0) break;
      }
      assert.deepEqual(live, []);
    } finally {
      await sb.remove();
    }
  });

  test('the best-of-N example', async () => {
    assert.equal(await bestOfNExample({ ...env, BRANCHBOX_SANDBOX: 'ts-best-of-n' }), 0);
  });
});

/**
 * Runs fn with a client of a fake server on loopback that handler answers.
 * @param {import('node:http').RequestListener} handler
 * @param {(c: Client) => Promise<void>} fn
 */
async function withFake(handler, fn) {
  const srv = createServer(handler);
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve(undefined)));
  const addr = /** @type {import('node:net').AddressInfo} */ (srv.address());
  const c = new Client({ url: `http://127.0.0.1:${addr.port}`, namespace: NS });
  try {
    await fn(c);
  } finally {
    c.close();
    srv.close();
  }
}

// A `branchctl serve` from before the rename: its documents have their
// branches only under the keys contexts and context.
test('a server from before the rename', async () => {
  /** @type {Record<string, unknown>} */
  const answers = {
    'POST /fork': { contexts: [{ id: '1', state: 'live' }] },
    'GET /tree': { contexts: [{ id: '0', state: 'live' }, { id: '1', state: 'live' }] },
    'POST /checkpoints': { checkpoint: { name: 'c', context: '1' } },
    'GET /checkpoints': { checkpoints: [{ name: 'c', context: '1' }] },
    'POST /rollback': { rollback: { context: '1', checkpoint: 'c', seconds: 0.1 } },
  };
  const answer = (/** @type {import('node:http').IncomingMessage} */ req, /** @type {import('node:http').ServerResponse} */ res) => {
    req.resume();
    req.on('end', () => {
      const doc = answers[`${req.method} /${(req.url ?? '').split('/').pop()}`];
      res.writeHead(doc ? 200 : 404, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify(doc ?? null));
    });
  };
  await withFake(answer, async (old) => {
    const sb = old.sandbox('sb');
    assert.deepEqual((await sb.fork()).map((b) => b.id), ['1']);
    assert.deepEqual((await sb.tree()).map((b) => b.id), ['0', '1']);
    assert.equal((await sb.checkpoint('c', '1')).branch, '1');
    assert.deepEqual((await sb.checkpoints()).map((ck) => ck.branch), ['1']);
    assert.equal((await sb.rollback('c', '1')).branch, '1');
  });
});

// A server that hangs up on the second request of each connection, as one
// whose idle timeout closes a kept-alive connection as a request comes:
// a read is sent again on a new connection; a fork is not (it may have
// been done: forking again would fork twice), and says so.
test('a server that hangs up', async () => {
  let posts = 0;
  const hangUp = (/** @type {import('node:http').IncomingMessage} */ req, /** @type {import('node:http').ServerResponse} */ res) => {
    const sock = /** @type {any} */ (req.socket);
    sock.requests = (sock.requests ?? 0) + 1;
    if (req.method === 'POST') posts++;
    if (sock.requests > 1) {
      req.socket.destroy();
      return;
    }
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ branches: [{ id: '0', state: 'live' }] }));
    });
  };
  await withFake(hangUp, async (c) => {
    const sb = c.sandbox('sb');
    assert.equal((await sb.tree()).length, 1);
    assert.equal((await sb.tree()).length, 1);
    await assert.rejects(() => sb.fork(), (/** @type {any} */ e) => {
      assert.ok(e instanceof BranchboxError, `${e}`);
      assert.equal(e.kind, 'unavailable');
      assert.match(e.message, /may have done it/);
      return true;
    });
    assert.equal(posts, 1);
  });
});
