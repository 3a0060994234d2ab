//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// heavy are the packages whose initialisation was half of branchctl's
// start and that only the heavy commands need (branchctl-full's).
var heavy = regexp.MustCompile(`^github.com/branchbox/branchbox/(client/oci|httpapi|mcpserver|internal/ops)$|^github.com/containerd/containerd/v2/(client|pkg/shim)$|^github.com/(modelcontextprotocol|google/jsonschema-go|distribution|klauspost/compress|google/go-cmp)/|^go.opentelemetry.io/|^encoding/gob$`)

// TestLinksNoHeavyPackage: branchctl links none of the heavy commands'
// libraries, and branchctl-full links them (or the test would check
// nothing).
func TestLinksNoHeavyPackage(t *testing.T) {
	for pkg, want := range map[string]bool{".": false, "../branchctl-full": true} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		var hits []string
		for _, p := range strings.Fields(string(out)) {
			if heavy.MatchString(p) {
				hits = append(hits, p)
			}
		}
		if (len(hits) > 0) != want {
			t.Errorf("%s links %d heavy packages, want them %v: %v", pkg, len(hits), want, hits)
		}
	}
}

// build builds branchctl and branchctl-full as make does into a
// temporary directory: their paths.
func build(t *testing.T) (light, full string) {
	t.Helper()
	dir := t.TempDir()
	light, full = filepath.Join(dir, "light", "branchctl"), filepath.Join(dir, "full", "branchctl-full")
	for out, pkg := range map[string]string{light: ".", full: "../branchctl-full"} {
		cmd := exec.Command("go", "build", "-tags", "urfave_cli_no_docs,grpcnotrace", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
	}
	return light, full
}

// runBin runs bin with args and PATH: its exit status, stdout and stderr.
func runBin(t *testing.T, bin, path string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PATH="+path, "CONTAINERD_ADDRESS=/nonexistent/containerd.sock")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %v: %v", bin, args, err)
	}
	return code, out.String(), errOut.String()
}

// TestHandoff: branchctl's help covers the heavy commands; running one
// runs branchctl-full in its place, found beside branchctl or on PATH,
// with the same arguments, output and exit status; without it, the error
// names it.
func TestHandoff(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries")
	}
	light, full := build(t)
	fullDir := filepath.Dir(full)

	// Help and usage errors are branchctl's own: the one table.
	code, _, errOut := runBin(t, light, "")
	if code != 2 || !strings.Contains(errOut, "push") || !strings.Contains(errOut, "serve") {
		t.Errorf("branchctl: exit %d, help %q; want 2 and every command", code, errOut)
	}
	code, out, _ := runBin(t, light, "", "push", "--help")
	if code != 0 || !strings.Contains(out, "--plain-http") || !strings.Contains(out, `(default: "/etc/containerd/certs.d")`) {
		t.Errorf("push --help without branchctl-full: exit %d, %q", code, out)
	}
	code, _, errOut = runBin(t, light, "", "pull", "--bogus")
	if code != 2 || !strings.Contains(errOut, "branchctl pull: flag provided but not defined: -bogus") {
		t.Errorf("pull --bogus: exit %d, stderr %q; want 2", code, errOut)
	}

	// Without branchctl-full: an error that names it, as text and JSON.
	code, _, errOut = runBin(t, light, "", "save", "sb")
	if code != 1 || !strings.Contains(errOut, "branchctl save: this command is in branchctl-full, which was not found beside "+light+" nor on PATH") {
		t.Errorf("save without branchctl-full: exit %d, stderr %q", code, errOut)
	}
	code, out, _ = runBin(t, light, "", "--json", "save", "sb")
	var je struct {
		Error struct{ Kind, Message string }
	}
	if code != 1 || json.Unmarshal([]byte(out), &je) != nil || je.Error.Kind != "failed-precondition" || !strings.Contains(je.Error.Message, "branchctl-full") {
		t.Errorf("--json save without branchctl-full: exit %d, %q", code, out)
	}

	// branchctl-full on PATH, then beside branchctl: cmdSave's own usage
	// check answers, which only branchctl-full has.
	want := `branchctl save: want save SANDBOX[/BRANCH] FILE, got ["sb"]`
	code, _, errOut = runBin(t, light, fullDir, "save", "sb")
	if code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("save with branchctl-full on PATH: exit %d, stderr %q; want 1 and %q", code, errOut, want)
	}
	beside := filepath.Join(filepath.Dir(light), "branchctl-full")
	if err := os.Link(full, beside); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runBin(t, light, "", "--json", "save", "sb")
	if code != 1 || json.Unmarshal([]byte(out), &je) != nil || je.Error.Kind != "invalid-argument" || !strings.Contains(je.Error.Message, "want save SANDBOX[/BRANCH] FILE") {
		t.Errorf("--json save with branchctl-full beside: exit %d, %q", code, out)
	}

	// A branchctl-full that is branchctl itself would exec itself forever.
	if err := os.Remove(beside); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(light, beside); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runBin(t, light, "", "load", "x.tar")
	if code != 1 || !strings.Contains(errOut, "is this branchctl itself") {
		t.Errorf("load with branchctl as branchctl-full: exit %d, stderr %q", code, errOut)
	}
}
