// A call whose server stops (SIGTERM) while its command runs, driven by
// the MCP TypeScript SDK over streamable HTTP: integration/mcp_test.go
// (TestMCPServerStopKills) stops the server once the command runs, and
// reads the call's answer that this prints.
//
//   node mcp-stop.mjs   (MCP_URL)

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const client = new Client({ name: 'branchbox-integration-stop', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(new URL(process.env.MCP_URL)));
const { structuredContent: forked } = await client.callTool({ name: 'fork', arguments: {} });
console.log('forked', forked.branches[0].id);
try {
  const r = await client.callTool({ name: 'exec', arguments: { branch: forked.branches[0].id, command: 'sleep 779' } }, undefined, { timeout: 120000 });
  console.log('answer', JSON.stringify(r));
} catch (e) {
  console.log('failed', e.message);
}
