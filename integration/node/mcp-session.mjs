// A whole fork/exec/commit session against `branchctl mcp`, driven by the
// official MCP TypeScript SDK (@modelcontextprotocol/sdk, pinned in
// package.json) as the client: integration/mcp_test.go runs it once over
// stdio and once over streamable HTTP. Exits non-zero, saying why, on the
// first thing that is not as it should be.
//
//   node mcp-session.mjs stdio   (BRANCHBOX_CTL, BRANCHBOX_ADDRESS, BRANCHBOX_NAMESPACE, BRANCHBOX_SANDBOX)
//   node mcp-session.mjs http    (MCP_URL, MCP_TOKEN, MCP_IDLE_MS)

import assert from 'node:assert/strict';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const env = process.env;
const mode = process.argv[2];
let transport;
if (mode === 'stdio') {
  transport = new StdioClientTransport({
    command: env.BRANCHBOX_CTL,
    args: ['mcp', '--address', env.BRANCHBOX_ADDRESS, '--namespace', env.BRANCHBOX_NAMESPACE, '--sandbox', env.BRANCHBOX_SANDBOX],
    stderr: 'inherit',
  });
} else if (mode === 'ns') {
  // Scoped to the namespace only: tools take a sandbox argument.
  transport = new StdioClientTransport({
    command: env.BRANCHBOX_CTL,
    args: ['mcp', '--address', env.BRANCHBOX_ADDRESS, '--namespace', env.BRANCHBOX_NAMESPACE],
    stderr: 'inherit',
  });
} else if (mode === 'http') {
  const headers = env.MCP_TOKEN ? { Authorization: `Bearer ${env.MCP_TOKEN}` } : {};
  transport = new StreamableHTTPClientTransport(new URL(env.MCP_URL), { requestInit: { headers } });
} else {
  throw new Error(`usage: node mcp-session.mjs stdio|ns|http`);
}

const client = new Client({ name: 'branchbox-integration', version: '1.0.0' });
await client.connect(transport);
const log = (...a) => console.log(`[${mode}]`, ...a);

// idleCut is fetch through a proxy that ends a response when no byte of it
// came for ms: neither its headers nor a chunk of its body.
function idleCut(ms) {
  return async (url, init = {}) => {
    const cut = new AbortController();
    let timer = setTimeout(() => cut.abort(new Error(`no byte for ${ms} ms: cut`)), ms);
    const again = () => { clearTimeout(timer); timer = setTimeout(() => cut.abort(new Error(`no byte for ${ms} ms: cut`)), ms); };
    const signal = init.signal ? AbortSignal.any([init.signal, cut.signal]) : cut.signal;
    const res = await fetch(url, { ...init, signal });
    if (!res.body) {
      clearTimeout(timer);
      return res;
    }
    again();
    const reader = res.body.getReader();
    const body = new ReadableStream({
      async pull(ctl) {
        const { done, value } = await reader.read();
        if (done) {
          clearTimeout(timer);
          ctl.close();
          return;
        }
        again();
        ctl.enqueue(value);
      },
      cancel(reason) {
        clearTimeout(timer);
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

// call calls a tool that must succeed and returns its structured output.
async function call(name, args) {
  const res = await client.callTool({ name, arguments: args });
  if (res.isError) throw new Error(`${name} ${JSON.stringify(args)} failed: ${res.content?.[0]?.text}`);
  assert.ok(res.structuredContent, `${name}: no structured content`);
  log(name, JSON.stringify(args), '->', JSON.stringify(res.structuredContent).slice(0, 300));
  return res.structuredContent;
}

// fails calls a tool that must fail, with text that names kind and says
// what to do.
async function fails(name, args, kind, next) {
  const res = await client.callTool({ name, arguments: args });
  const text = res.content?.map((c) => c.text).join('\n') ?? '';
  assert.ok(res.isError, `${name} ${JSON.stringify(args)} should fail, got ${JSON.stringify(res)}`);
  if (kind) assert.match(text, new RegExp(`kind ${kind}`), text);
  if (next) assert.match(text, next, text);
  log(name, JSON.stringify(args), '-> error:', text.replace(/\n/g, ' | '));
  return text;
}

if (mode === 'ns') {
  const { tools } = await client.listTools();
  assert.ok(tools.some((t) => t.name === 'list_sandboxes'));
  const { sandboxes } = await call('list_sandboxes', {});
  assert.ok(sandboxes.some((s) => s.id === env.BRANCHBOX_SANDBOX), JSON.stringify(sandboxes));
  await fails('tree', {}, 'invalid-argument', /list_sandboxes/);
  await fails('tree', { sandbox: 'nosuch' }, 'not-found', /list_sandboxes/);
  const { branches } = await call('fork', { sandbox: env.BRANCHBOX_SANDBOX, count: 1 });
  assert.equal((await call('exec', { sandbox: env.BRANCHBOX_SANDBOX, branch: branches[0].id, command: 'echo hi' })).stdout, 'hi\n');
  await call('abort', { sandbox: env.BRANCHBOX_SANDBOX, branch: branches[0].id });
  await client.close();
  log('session ok');
  process.exit(0);
}

// The tools, each with an object input schema that names its required
// properties; scoped to one sandbox, there is no list_sandboxes.
const { tools } = await client.listTools();
const names = tools.map((t) => t.name).sort();
assert.deepEqual(names, ['abort', 'checkpoint', 'commit', 'delete_checkpoint', 'exec', 'fork', 'list_checkpoints', 'list_dir', 'logs', 'read_file', 'rollback', 'tree', 'write_file']);
for (const t of tools) {
  assert.equal(t.inputSchema.type, 'object', t.name);
  assert.ok(t.description && t.description.length > 20, t.name);
  assert.ok(t.outputSchema, `${t.name}: no output schema`);
}
assert.deepEqual(tools.find((t) => t.name === 'commit').inputSchema.required, ['branch']);
log('tools:', names.join(' '));

const { branches } = await call('fork', { count: 2 });
assert.equal(branches.length, 2);
const [b1, b2] = branches.map((b) => b.id);

await call('write_file', { branch: b1, path: '/answer', content: '42\n' });
assert.equal((await call('read_file', { branch: b1, path: '/answer' })).content, '42\n');
const ls = await call('list_dir', { branch: b1, path: '/' });
assert.ok(ls.entries.some((e) => e.name === 'answer' && e.type === 'file'));
const r = await call('exec', { branch: b1, command: 'cat /answer; echo err >&2; exit 3' });
assert.deepEqual([r.exit_code, r.stdout, r.stderr], [3, '42\n', 'err\n']);
const r2 = await call('exec', { branch: b2, args: ['sh', '-c', 'read x; echo $x > /answer; cat /answer'], stdin: 'wrong\n' });
assert.deepEqual([r2.exit_code, r2.stdout], [0, 'wrong\n']);

// A branch's keys, and their old names (docs/design.md#names).
const ck = await call('checkpoint', { branch: b1, name: 'c1' });
assert.deepEqual([ck.branch, ck.context], [b1, b1]);
await call('write_file', { branch: b1, path: '/answer', content: 'overwritten\n' });
const rb = await call('rollback', { branch: b1, name: 'c1' });
assert.deepEqual([rb.branch, rb.context], [b1, b1]);
assert.equal((await call('read_file', { branch: b1, path: '/answer' })).content, '42\n');

// The sandbox keeps at most 3 checkpoints (its annotation): the next is
// refused, saying which tools make room; listed and deleted through them.
await call('checkpoint', { branch: b1, name: 'c2' });
await call('checkpoint', { branch: b1, name: 'c3' });
await fails('checkpoint', { branch: b1, name: 'c4' }, 'resource-exhausted', /list_checkpoints, then delete_checkpoint/);
const { checkpoints } = await call('list_checkpoints', {});
assert.deepEqual(checkpoints.map((x) => [x.name, x.branch]).sort(), [['c1', b1], ['c2', b1], ['c3', b1]]);
assert.deepEqual(await call('delete_checkpoint', { name: 'c3' }), { deleted: 'c3' });
await call('checkpoint', { branch: b1, name: 'c4' });
await fails('delete_checkpoint', { name: 'c3' }, 'not-found');

// Errors an LLM can act on.
await fails('write_file', { branch: '0', path: '/answer', content: 'x' }, 'failed-precondition', /write in a branch/);
await fails('read_file', { branch: b1, path: '/nosuch' }, 'not-found', /call tree|list_dir/);
await fails('exec', { branch: '99', command: 'true' }, 'not-found', /call tree/);
await fails('exec', { branch: b1, command: 'sleep 30', timeout_seconds: 0.5 }, 'deadline-exceeded', /timeout_seconds/);
// A timeout ends what the command started too: a server in the background
// holding its output (whose wait would not end) is not left running.
await fails('exec', { branch: b1, command: 'sleep 31 & echo $! > /bg.pid', timeout_seconds: 0.5 }, 'deadline-exceeded', /timeout_seconds/);
assert.equal((await call('exec', { branch: b1, command: 'kill -0 $(cat /bg.pid) 2>/dev/null && echo running || echo gone' })).stdout, 'gone\n');
await fails('exec', { branch: b1 }, 'invalid-argument', /input schema/);
await fails('fork', { sandbox: 'some-other-sandbox' }, 'permission-denied', /scoped/);
await fails('commit', {}, undefined, /branch/); // the schema's required property

// A call the client cancels (the agent's user pressed stop: the SDK sends
// notifications/cancelled): its command is killed, not left running.
{
  const ac = new AbortController();
  const pending = client.callTool({ name: 'exec', arguments: { branch: b1, command: 'sleep 30 & echo $! > /cancelled.child; echo $$ > /cancelled.pid; wait' } }, undefined, { signal: ac.signal });
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  for (let i = 0; ; i++) {
    const rr = await call('exec', { branch: b1, command: 'cat /cancelled.pid 2>/dev/null || true' });
    if (rr.stdout !== '') break;
    assert.ok(i < 200, 'the command of the call to cancel never started');
    await sleep(50);
  }
  ac.abort();
  await assert.rejects(pending, (e) => e.name === 'AbortError' || /abort/i.test(String(e)));
  for (let i = 0; ; i++) {
    const rr = await call('exec', { branch: b1, command: 'kill -0 $(cat /cancelled.pid) 2>/dev/null || kill -0 $(cat /cancelled.child) 2>/dev/null && echo running || echo gone' });
    if (rr.stdout === 'gone\n') break;
    assert.ok(i < 200, 'the command of a cancelled call still runs 10 s later');
    await sleep(50);
  }
  log('cancelled exec: its command and its child were killed');
}

// A command that runs longer than the client's request timeout (the SDK's
// is 60 s by default; 2.5 s here) is waited for when the client restarts
// that timeout on progress: the server reports every second while it runs.
{
  const seen = [];
  const r = await client.callTool({ name: 'exec', arguments: { branch: b1, command: 'sleep 6; echo done' } }, undefined,
    { timeout: 2500, resetTimeoutOnProgress: true, onprogress: (p) => seen.push(p) });
  assert.equal(r.structuredContent?.stdout, 'done\n', JSON.stringify(r));
  assert.ok(seen.length >= 3 && seen.every((p, i) => i === 0 || p.progress > seen[i - 1].progress), JSON.stringify(seen));
  assert.match(seen[0].message, /^running for \d+s, 0 bytes of output$/);
  log('exec past the request timeout, kept alive by progress:', seen.length, 'notifications');
}

// Over HTTP, a call without a progress token through a proxy that cuts a
// response after a moment without bytes (nginx's proxy_read_timeout, a load
// balancer's idle timeout, undici's headersTimeout and bodyTimeout, 300 s,
// in Node's own fetch): the server's keep-alive comments on the event
// stream (--keepalive, 1 s in the test) keep it open; without them the
// response's headers waited for the result and the call failed.
if (mode === 'http' && env.MCP_IDLE_MS) {
  const idle = Number(env.MCP_IDLE_MS);
  const headers = env.MCP_TOKEN ? { Authorization: `Bearer ${env.MCP_TOKEN}` } : {};
  const proxied = new Client({ name: 'branchbox-integration-idle', version: '1.0.0' });
  await proxied.connect(new StreamableHTTPClientTransport(new URL(env.MCP_URL), { requestInit: { headers }, fetch: idleCut(idle) }));
  const r = await proxied.callTool({ name: 'exec', arguments: { branch: b1, command: `sleep ${(2 * idle) / 1000}; echo done` } }, undefined, { timeout: 60000 });
  assert.equal(r.structuredContent?.stdout, 'done\n', JSON.stringify(r));
  await proxied.close();
  log(`exec silent for ${2 * idle} ms through a fetch that cuts a response idle for ${idle} ms: done`);
}

const c = await call('commit', { branch: b1 });
assert.deepEqual(c.invalidated, [b2]);
await fails('exec', { branch: b2, command: 'true' }, 'stale', /call fork/);
await fails('commit', { branch: b2 }, 'stale', /lost/);
assert.equal((await call('read_file', { branch: '0', path: '/answer' })).content, '42\n');
assert.equal((await call('exec', { branch: '0', command: 'cat /answer' })).stdout, '42\n');

const { branches: [b3] } = await call('fork', {});
assert.equal((await call('logs', { branch: b3.id })).output, ''); // no command, no memory: nothing written
await fails('logs', { branch: '0' }, 'invalid-argument', /nerdctl logs/);
assert.deepEqual((await call('abort', { branch: b3.id })).aborted, [b3.id]);
const tree = await call('tree', {});
assert.deepEqual(tree.contexts, tree.branches);
const states = Object.fromEntries(tree.branches.map((x) => [x.id, x.state]));
assert.deepEqual([states['0'], states[b1], states[b2], states[b3.id]], ['live', 'committed', 'stale', 'aborted']);

await client.close();
log('session ok');
