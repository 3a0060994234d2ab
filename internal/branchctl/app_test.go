//go:build linux

package branchctl

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestArrange: flags may follow a command's positional arguments (up to
// "--"), and the command line after "--" is left alone.
func TestArrange(t *testing.T) {
	app := newApp(&invocation{})
	for _, tc := range []struct{ in, want string }{
		{"fork sb -n 3", "fork -n 3 -- sb"},
		{"fork sb -n 3 --seal=freeze -- sleep -n 1", "fork -n 3 --seal=freeze -- sb -- sleep -n 1"},
		{"-n k8s.io --json tree sb", "-n k8s.io --json tree -- sb"},
		{"exec sb/1 -t --env A=1 -- sh -c x --json", "exec -t --env A=1 -- sb/1 -- sh -c x --json"},
		{"self fork -n 2 --json", "self fork -n 2 --json"},
		{"self exec 1 -d -- true", "self exec -d -- 1 -- true"},
		{"checkpoint ls sb --json", "checkpoint --json -- ls sb"},
		{"ls", "ls"},
		{"frobnicate -x", "frobnicate -x"},
		{"fork sb -x -n 2", "fork -x -n 2 -- sb"},
		// --memory is a memory fork; with a size it is the old spelling
		// of --memory-limit.
		{"fork sb --memory -n 2", "fork --memory -n 2 -- sb"},
		{"fork --memory sb", "fork --memory -- sb"},
		{"fork sb --memory 256m", "fork --memory-limit 256m -- sb"},
		{"fork sb --memory=1g -n 2", "fork --memory-limit=1g -n 2 -- sb"},
		{"fork sb --memory=true", "fork --memory=true -- sb"},
	} {
		got := strings.Join(arrange(app, strings.Fields(tc.in)), " ")
		if got != tc.want {
			t.Errorf("arrange(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestGlobals: a global flag after the command wins over one before it,
// which wins over the environment, which wins over the default.
func TestGlobals(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want globals
	}{
		{"", []string{"ls"}, globals{address: defaultAddress, namespace: "default"}},
		{"envns", []string{"ls"}, globals{address: defaultAddress, namespace: "envns"}},
		{"envns", []string{"-n", "top", "ls"}, globals{address: defaultAddress, namespace: "top"}},
		{"envns", []string{"-n", "top", "--json", "ls", "--namespace", "cmd"}, globals{address: defaultAddress, namespace: "cmd", json: true}},
		{"", []string{"-a", "/x.sock", "ls", "--json"}, globals{address: "/x.sock", namespace: "default", json: true}},
		{"envns", []string{"fork", "sb", "-n", "3"}, globals{address: defaultAddress, namespace: "envns"}},
		{"envns", []string{"-n", "top", "fork", "sb", "-n", "3"}, globals{address: defaultAddress, namespace: "top"}},
	} {
		t.Setenv("CONTAINERD_NAMESPACE", tc.env)
		t.Setenv("CONTAINERD_ADDRESS", "")
		var got globals
		inv := &invocation{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
		app := newApp(inv)
		for _, c := range app.Commands {
			c.Action = func(c *cli.Context) error { got = globalsOf(c); return nil }
		}
		if err := app.Run(append([]string{"branchctl"}, arrange(app, tc.args)...)); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got != tc.want {
			t.Errorf("env %q %v: %+v, want %+v", tc.env, tc.args, got, tc.want)
		}
	}
}

// TestUsageErrors: bad flags and unknown commands exit 2 with a hint.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"fork", "sb", "-x"}, "branchctl fork: flag provided but not defined: -x"},
		{[]string{"frobnicate"}, `branchctl: unknown command "frobnicate"`},
		{[]string{"fork", "sb", "-n", "many"}, `invalid value "many" for flag -n`},
		{[]string{"completion", "tcsh"}, "want bash, zsh or fish"},
	} {
		var out, errOut bytes.Buffer
		code := Run(t.Context(), tc.args, nil, &out, &errOut, nil)
		if code != 2 || !strings.Contains(errOut.String(), tc.want) || !strings.Contains(errOut.String(), "hint: see `branchctl help`") {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errOut.String(), tc.want)
		}
	}
	var out, errOut bytes.Buffer
	if code := Run(t.Context(), []string{"fork", "--help"}, nil, &out, &errOut, nil); code != 0 || !strings.Contains(out.String(), "--seal value") {
		t.Errorf("fork --help: exit %d, %q", code, out.String())
	}
}

// TestCompletion: the shell's completion (urfave/cli's
// --generate-bash-completion, as the script of `branchctl completion bash`
// asks) offers commands, subcommands and a command's flags.
func TestCompletion(t *testing.T) {
	for _, tc := range []struct {
		line, want, not string
	}{
		{"branchctl --generate-bash-completion", "checkpoint\n", ""},
		{"branchctl self --generate-bash-completion", "rollback\n", ""},
		{"branchctl fork sb --se --generate-bash-completion", "--seal\n", "--from"},
		{"branchctl fork sb -n 2 -- --generate-bash-completion", "", "--seal"},
		{"branchctl exec sb/1 -- rm -x --generate-bash-completion", "", ""},
	} {
		old := os.Args
		os.Args = strings.Fields(tc.line) // urfave/cli reads the word before the flag there
		var out, errOut bytes.Buffer
		code := Run(t.Context(), os.Args[1:], nil, &out, &errOut, nil)
		os.Args = old
		if !strings.Contains(out.String(), tc.want) || (tc.not != "" && strings.Contains(out.String(), tc.not)) {
			t.Errorf("%s: %q; want %q and not %q", tc.line, out.String(), tc.want, tc.not)
		}
		// Completing runs nothing: no command, no error.
		if code != 0 || errOut.Len() > 0 {
			t.Errorf("%s: exit %d, stderr %q", tc.line, code, errOut.String())
		}
	}
	var out bytes.Buffer
	if code := Run(t.Context(), []string{"completion", "bash"}, nil, &out, &bytes.Buffer{}, nil); code != 0 || !strings.Contains(out.String(), "complete -o bashdefault -o default -F _branchctl_complete branchctl") {
		t.Errorf("completion bash: %d %q", code, out.String())
	}
}

// TestOnlyFlagsOf: dropping the flags of the commands a run does not run
// changes nothing it prints: help, usage errors, completion. (Not fish's
// completion, which onlyFlagsOf leaves alone: urfave/cli's fish generator
// recurses forever through its shared help command once an earlier app of
// the same process has set it up.)
func TestOnlyFlagsOf(t *testing.T) {
	lines := []string{"", "--help", "-h", "help", "help fork", "h fork", "fork --help", "fork -h", "fork --help=true",
		"push --help", "serve -h", "self --help", "self fork --help", "self help fork", "checkpoint --help",
		"checkpoint ls --help", "checkpoint help", "completion bash", "completion zsh", "completion tcsh",
		"frobnicate", "fork sb -x", "fork sb -n many", "-n x fork --bogus", "--json fork sb --bogus", "self fork --bogus",
		"checkpoint --bogus", "speculate --bogus", "exec sb/1 -t --env A=1 --bogus", "fork sb --seal help --bogus",
		"branchctl --generate-bash-completion", "branchctl fork sb --se --generate-bash-completion"}
	out := func(line string) string {
		var o, e bytes.Buffer
		code := Run(t.Context(), strings.Fields(line), nil, &o, &e, nil)
		return fmt.Sprintf("exit %d\n%s\n--- stderr\n%s", code, o.String(), e.String())
	}
	for _, line := range lines {
		trimFlags = false
		want := out(line)
		trimFlags = true
		if got := out(line); got != want {
			t.Errorf("%q: with onlyFlagsOf\n%s\nwithout\n%s", line, got, want)
		}
	}
	app := newApp(&invocation{})
	onlyFlagsOf(app, []string{"-n", "ns", "fork", "sb", "--seal", "freeze"})
	for _, c := range app.Commands {
		if (len(c.Flags) > 0) != (c.Name == "fork") {
			t.Errorf("after onlyFlagsOf(fork ...), %s has %d flags", c.Name, len(c.Flags))
		}
	}
}
