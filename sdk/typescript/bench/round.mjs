// One fork+exec+commit round per line read from stdin ("round"), through
// the TypeScript SDK; prints "ok" after each. integration/sdk_bench_test.go
// times the rounds (BenchmarkSDKRound); the process stays up between them,
// as an agent's would.

import readline from 'node:readline';

import { Client } from '@branchbox/sdk';

const c = new Client({ socket: process.env.BRANCHBOX_SOCKET, namespace: process.env.BRANCHBOX_NAMESPACE });
const sb = c.sandbox(process.env.BRANCHBOX_SANDBOX ?? '');
for await (const line of readline.createInterface({ input: process.stdin })) {
  if (line.trim() !== 'round') break;
  const [k] = await sb.fork({ count: 1 });
  const r = await k.exec(['true']);
  if (r.exitCode !== 0) throw new Error(`exec: ${JSON.stringify(r)}`);
  await k.commit();
  process.stdout.write('ok\n');
}
c.close();
