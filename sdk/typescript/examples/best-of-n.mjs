#!/usr/bin/env node
// @ts-check
// Best of N with branchbox: a sandbox whose test fails is forked into 4
// branches, each tries a fix and runs the test, and the first whose test
// passes is committed into the sandbox (its siblings are invalidated).
//
//   BRANCHBOX_IMAGE=docker.io/branchbox/busybox:test node examples/best-of-n.mjs
//   BRANCHBOX_URL=https://node:8443 BRANCHBOX_TOKEN=... BRANCHBOX_NAMESPACE=agents node examples/best-of-n.mjs
//
// It makes its own sandbox and removes it at the end. Plain JavaScript
// that node 20 runs as it is; the tests type-check it (// @ts-check)
// against the SDK's declarations with tsc.

import { Client, bestOfN } from '@branchbox/sdk';

// The project: a calculator with an off-by-one bug, and its test.
const CALC = 'echo $(( $1 + $2 + 1 ))\n';
const TEST = '[ "$(sh /calc.sh 2 3)" = 5 ]\n';
// Four candidate fixes; only one is right.
const FIXES = ['+ 2', '- 2', '+ 0', '* 1 + 1'];

/** @param {NodeJS.ProcessEnv} env */
export async function main(env) {
  // A socket given wins over a URL.
  const client = new Client({
    socket: env.BRANCHBOX_SOCKET,
    url: env.BRANCHBOX_SOCKET ? undefined : env.BRANCHBOX_URL,
    token: env.BRANCHBOX_TOKEN,
    namespace: env.BRANCHBOX_NAMESPACE ?? 'default',
  });
  const sb = await client.createSandbox({
    id: env.BRANCHBOX_SANDBOX ?? 'best-of-n-ts',
    image: env.BRANCHBOX_IMAGE ?? 'docker.io/branchbox/busybox:test',
    args: ['sleep', '1000000'],
  });
  try {
    await sb.root.writeFile('/calc.sh', CALC);
    await sb.root.writeFile('/test.sh', TEST);
    console.log('before:', (await sb.root.exec(['sh', '/test.sh'])).exitCode, '(the test fails)');
    const attempts = FIXES.map((f) => ['sh', '-c', `echo 'echo $(( $1 + $2 ${f} ))' > /calc.sh`]);
    const start = performance.now();
    const { winner, results } = await bestOfN(sb, attempts, ['sh', '/test.sh']);
    const took = performance.now() - start;
    results.forEach((r, i) => {
      const what = !r ? '-' : r.exitCode === 137 ? 'killed (SIGKILL): a sibling committed first' : `exit ${r.exitCode}`;
      console.log(`attempt ${i}: fix ${JSON.stringify(FIXES[i])} test ${what}`);
    });
    if (!winner) {
      console.log('no fix passed');
      return 1;
    }
    console.log(`committed branch ${winner.id} in ${took.toFixed(0)} ms`);
    const after = await sb.root.exec(['sh', '/test.sh']);
    console.log('after:', after.exitCode, (await sb.root.readFile('/calc.sh')).toString().trim());
    return 0;
  } finally {
    await sb.remove();
    client.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  process.exitCode = await main(process.env);
}
