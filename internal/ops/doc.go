// Package ops is what the HTTP API (httpapi) and the MCP server (mcpserver)
// do beyond the Go client, the same for both: the files of a branch, read
// and written through its init's root, and a process in any branch, the
// sandbox's own (an exec of its containerd task) or a branch's (the shim's).
package ops
