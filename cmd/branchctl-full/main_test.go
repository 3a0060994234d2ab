//go:build linux

package main

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/client/oci"
	"github.com/branchbox/branchbox/httpapi"
	"github.com/branchbox/branchbox/internal/branchctl"
	"github.com/branchbox/branchbox/mcpserver"
)

// TestActions: branchctl-full has an action for every heavy command and
// for nothing else (a light command's action is branchctl's).
func TestActions(t *testing.T) {
	var have []string
	for name := range actions {
		have = append(have, name)
	}
	want := branchctl.HeavyCommands()
	sort.Strings(have)
	sort.Strings(want)
	if !slices.Equal(have, want) {
		t.Errorf("actions for %v, heavy commands %v", have, want)
	}
}

// TestDefaults: the heavy commands' flag defaults in the command table,
// which does not link client/oci nor httpapi, are theirs.
func TestDefaults(t *testing.T) {
	for cmd, wants := range map[string][]string{
		"push":  {fmt.Sprintf("registry host configuration directory (default: %q)", oci.DefaultHostsDir)},
		"serve": {fmt.Sprintf("(default: %q)", oci.DefaultHostsDir), fmt.Sprintf("(default: %d)", httpapi.DefaultMaxBody), fmt.Sprintf("concurrent execs per client (default: %d)", httpapi.DefaultMaxExecs), fmt.Sprintf("concurrent event streams per client (default: %d)", httpapi.DefaultMaxStreams), fmt.Sprintf("(0: never) (default: %s)", httpapi.DefaultKeepAlive), `(default: "/run/branchbox/api.sock")`},
		"mcp":   {fmt.Sprintf("(0: never) (default: %s)", mcpserver.DefaultKeepAlive)},
	} {
		var out bytes.Buffer
		if code := branchctl.Run(t.Context(), []string{cmd, "--help"}, nil, &out, &bytes.Buffer{}, actions); code != 0 {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		for _, w := range wants {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s --help lacks %q:\n%s", cmd, w, out.String())
			}
		}
	}
}
