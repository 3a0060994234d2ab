// Package mcpserver is branchbox's MCP server, `branchctl mcp`: the branch
// operations as Model Context Protocol tools (fork, exec, read_file,
// write_file, list_dir, commit, abort, tree, checkpoint, rollback, and
// list_sandboxes when not scoped to one sandbox), on the official Go SDK
// (github.com/modelcontextprotocol/go-sdk), over stdio or streamable HTTP.
//
// A server is scoped by its command line to one containerd namespace and,
// optionally, one sandbox. Each tool has a JSON schema (inferred from its
// input and output types); errors come back as tool errors whose text
// says the kind (branchctl --json's), what happened, and what to call
// next.
package mcpserver
