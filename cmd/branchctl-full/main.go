//go:build linux

// Command branchctl-full is branchctl with the heavy commands' code linked
// in: serve (the HTTP API), mcp (the MCP server), and push, pull, save and
// load (OCI images through containerd's client and a registry). branchctl
// execs it for those commands, with its command line, environment and
// stdio unchanged, so that branchctl itself does not pay for their
// libraries' initialisation on every start (internal/branchctl/heavy.go);
// run directly, it is the whole branchctl, every command included.
package main

import (
	"context"
	"os"

	"github.com/branchbox/branchbox/internal/branchctl"
)

// actions are the heavy commands' actions (branchctl.HeavyCommands).
var actions = branchctl.Actions{
	"serve": cmdServe, "mcp": cmdMCP,
	"push": cmdPush, "pull": cmdPull, "save": cmdSave, "load": cmdLoad,
}

func main() {
	os.Exit(branchctl.Run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr, actions))
}
