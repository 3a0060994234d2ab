//go:build linux

package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/branchbox/branchbox/internal/daemons"
)

// makeInstall runs `make install` with the given variables, without
// rebuilding the binaries (make test has just built them).
func makeInstall(t *testing.T, vars ...string) {
	t.Helper()
	// bin/ named relative to the clone, as the Makefile names it (make
	// splits a target at a space, and the clone's path may have one).
	bin := daemons.BinDirFromEnv()
	rel := filepath.Base(bin)
	args := []string{"-C", filepath.Dir(bin), "BIN=" + rel,
		"-o", filepath.Join(rel, "containerd-branch-snapshotter"),
		"-o", filepath.Join(rel, "containerd-shim-branch-v1"),
		"-o", filepath.Join(rel, "containerd-shim-branch-v1-runtime"),
		"-o", filepath.Join(rel, "containerd-shim-branch-v1-init"),
		"-o", filepath.Join(rel, "branchctl"),
		"-o", filepath.Join(rel, "branchctl-full"), "install"}
	out, err := exec.Command("make", append(args, vars...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("make install %v: %v\n%s", vars, err, out)
	}
}

// TestMakeInstall checks `make install` against docs/node-setup.md: with
// DESTDIR the files land under it at the PREFIX paths the guide names, the
// unit runs the installed snapshotter with the guide's root and socket,
// and systemd-analyze accepts the unit as installed.
func TestMakeInstall(t *testing.T) {
	dest := t.TempDir()
	makeInstall(t, "DESTDIR="+dest, "PREFIX=/usr/local")
	bin := daemons.BinDirFromEnv()
	want := map[string]string{ // installed path -> what it is a copy of ("" if rendered)
		"/usr/local/bin/containerd-branch-snapshotter":                         filepath.Join(bin, "containerd-branch-snapshotter"),
		"/usr/local/bin/containerd-shim-branch-v1":                             filepath.Join(bin, "containerd-shim-branch-v1"),
		"/usr/local/bin/containerd-shim-branch-v1-runtime":                     filepath.Join(bin, "containerd-shim-branch-v1-runtime"),
		"/usr/local/bin/containerd-shim-branch-v1-init":                        filepath.Join(bin, "containerd-shim-branch-v1-init"),
		"/usr/local/bin/branchctl":                                             filepath.Join(bin, "branchctl"),
		"/usr/local/bin/branchctl-full":                                        filepath.Join(bin, "branchctl-full"),
		"/usr/local/bin/criu":                                                  filepath.Join(bin, "criu"),
		"/usr/local/share/bash-completion/completions/branchctl":               "",
		"/usr/local/lib/systemd/system/containerd-branch-snapshotter.service":  "",
		"/usr/local/lib/systemd/system/containerd.service.d/10-branchbox.conf": filepath.Join(filepath.Dir(bin), "hack", "systemd", "containerd-branchbox.conf"),
		"/usr/local/share/branchbox/containerd-config.toml":                    filepath.Join(filepath.Dir(bin), "docs", "containerd-config.toml"),
		"/usr/local/share/branchbox/runtimeclass.yaml":                         filepath.Join(filepath.Dir(bin), "docs", "runtimeclass.yaml"),
	}
	var found []string
	_ = filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			found = append(found, strings.TrimPrefix(p, dest))
		}
		return nil
	})
	if len(found) != len(want) {
		t.Errorf("installed %v, want exactly %d files", found, len(want))
	}
	for path, src := range want {
		fi, err := os.Stat(filepath.Join(dest, path))
		if err != nil {
			t.Errorf("not installed: %v", err)
			continue
		}
		if strings.Contains(path, "/bin/") && fi.Mode().Perm() != 0o755 {
			t.Errorf("%s mode %v, want 0755", path, fi.Mode().Perm())
		}
		if src != "" && !sameContent(t, filepath.Join(dest, path), src) {
			t.Errorf("%s differs from %s", path, src)
		}
	}
	guide, err := os.ReadFile(filepath.Join(filepath.Dir(bin), "docs", "node-setup.md"))
	if err != nil {
		t.Fatal(err)
	}
	for path := range want {
		if !strings.Contains(string(guide), path) {
			t.Errorf("docs/node-setup.md does not say where %s goes", path)
		}
	}
	if c := readFile(t, filepath.Join(dest, "/usr/local/share/bash-completion/completions/branchctl")); !strings.Contains(string(c), "complete -o bashdefault -o default -F _branchctl_complete branchctl") {
		t.Errorf("installed bash completion is not branchctl's:\n%s", c)
	}
	unit, err := os.ReadFile(filepath.Join(dest, "/usr/local/lib/systemd/system/containerd-branch-snapshotter.service"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"ExecStart=/usr/local/bin/containerd-branch-snapshotter --root /var/lib/containerd-branch-snapshotter --address /run/containerd-branch-snapshotter/snapshotter.sock",
		"RequiredBy=containerd.service",
	} {
		if !strings.Contains(string(unit), line) {
			t.Errorf("installed unit lacks %q:\n%s", line, unit)
		}
	}
	if strings.Contains(string(unit), "@") {
		t.Errorf("installed unit has an unreplaced placeholder:\n%s", unit)
	}
	// The socket the unit serves is the one the containerd config names.
	if !strings.Contains(string(readFile(t, filepath.Join(dest, "/usr/local/share/branchbox/containerd-config.toml"))), `address = "/run/containerd-branch-snapshotter/snapshotter.sock"`) {
		t.Error("the installed containerd config does not name the unit's socket")
	}

	// systemd's own check, on an install whose paths exist as written
	// (PREFIX inside a temporary directory, no DESTDIR): it parses every
	// directive and checks that ExecStart is executable. It reports
	// problems on its output even when it exits 0.
	prefix := t.TempDir()
	makeInstall(t, "PREFIX="+prefix)
	// A stand-in containerd.service next to the drop-in gets it parsed too.
	if err := os.WriteFile(filepath.Join(prefix, "lib/systemd/system/containerd.service"), []byte("[Service]\nExecStart=/bin/true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"containerd-branch-snapshotter.service", "containerd.service"} {
		cmd := exec.Command("systemd-analyze", "verify", "--man=no", filepath.Join(prefix, "lib/systemd/system", f))
		out, err := cmd.CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) != 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", f, err, out)
		}
	}
	if !strings.Contains(string(readFile(t, filepath.Join(prefix, "lib/systemd/system/containerd-branch-snapshotter.service"))), "ExecStart="+prefix+"/bin/containerd-branch-snapshotter ") {
		t.Errorf("unit installed with PREFIX=%s does not run %s/bin/containerd-branch-snapshotter", prefix, prefix)
	}
	// The CRI handler runs the shim by path: the one installed.
	if !strings.Contains(string(readFile(t, filepath.Join(prefix, "share/branchbox/containerd-config.toml"))), `runtime_path = "`+prefix+`/bin/containerd-shim-branch-v1"`) {
		t.Errorf("containerd config installed with PREFIX=%s does not run the shim at %s/bin/containerd-shim-branch-v1", prefix, prefix)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameContent(t *testing.T, a, b string) bool {
	return bytes.Equal(readFile(t, a), readFile(t, b))
}
