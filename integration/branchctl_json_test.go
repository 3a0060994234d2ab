//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// schema is the subset of JSON Schema docs/branchctl.schema.json uses.
type schema struct {
	Ref                  string             `json:"$ref"`
	Type                 string             `json:"type"`
	Required             []string           `json:"required"`
	Properties           map[string]*schema `json:"properties"`
	AdditionalProperties *bool              `json:"additionalProperties"`
	Items                *schema            `json:"items"`
	Enum                 []string           `json:"enum"`
	Defs                 map[string]*schema `json:"$defs"`
}

func loadSchema(t *testing.T) *schema {
	t.Helper()
	data, err := os.ReadFile("../docs/branchctl.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var s schema
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("docs/branchctl.schema.json: %v", err)
	}
	return &s
}

// validate checks v against s (definitions from root), naming the first
// mismatch by its path.
func (root *schema) validate(s *schema, v any, path string) error {
	if s.Ref != "" {
		def := root.Defs[strings.TrimPrefix(s.Ref, "#/$defs/")]
		if def == nil {
			return fmt.Errorf("%s: unknown $ref %s", path, s.Ref)
		}
		return root.validate(def, v, path)
	}
	switch s.Type {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: want an object, got %T", path, v)
		}
		for _, r := range s.Required {
			if _, ok := m[r]; !ok {
				return fmt.Errorf("%s: no %q", path, r)
			}
		}
		for k, x := range m {
			p, ok := s.Properties[k]
			if !ok {
				if s.AdditionalProperties != nil && !*s.AdditionalProperties {
					return fmt.Errorf("%s: unexpected %q", path, k)
				}
				continue
			}
			if err := root.validate(p, x, path+"."+k); err != nil {
				return err
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: want an array, got %T", path, v)
		}
		for i, x := range a {
			if s.Items != nil {
				if err := root.validate(s.Items, x, fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: want a string, got %T", path, v)
		}
		if len(s.Enum) > 0 && !contains(s.Enum, str) {
			return fmt.Errorf("%s: %q is not one of %v", path, str, s.Enum)
		}
	case "integer", "number":
		f, ok := v.(float64)
		if !ok {
			return fmt.Errorf("%s: want a number, got %T", path, v)
		}
		if s.Type == "integer" && f != float64(int64(f)) {
			return fmt.Errorf("%s: want an integer, got %v", path, f)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: want a boolean, got %T", path, v)
		}
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// oneDocument decodes out as exactly one JSON document.
func oneDocument(out string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(out))
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("not JSON: %v", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("more than one JSON document")
	}
	return v, nil
}

// TestBranchctlJSON runs every command of branchctl with --json on a
// success and on an error, and checks that each writes exactly one JSON
// document to stdout that docs/branchctl.schema.json accepts: the
// command's definition on success, "error" (and a non-zero exit) on error.
func TestBranchctlJSON(t *testing.T) {
	root := loadSchema(t)
	for name, def := range root.Defs {
		if def.Type == "" && def.Ref == "" {
			t.Fatalf("schema definition %s has no type", name)
		}
	}
	ctx, env, _ := sandboxCtxEnv(t)
	dir := t.TempDir()
	tar := filepath.Join(dir, "sb.tar")
	seen := map[string]bool{}
	// check runs branchctl ARGS --json; want is its exit code (-1: any
	// but 0, an error).
	check := func(def string, want int, args ...string) map[string]any {
		t.Helper()
		seen[args[0]] = true
		// --json right after the command: before any "--".
		out, errOut, code := branchctl(t, ctx, env, "", append([]string{args[0], "--json"}, args[1:]...)...)
		v, err := oneDocument(out)
		if err != nil {
			t.Fatalf("branchctl %v --json: %v\nstdout: %q\nstderr: %q", args, err, out, errOut)
		}
		if (want >= 0 && code != want) || (want < 0 && code == 0) {
			t.Fatalf("branchctl %v --json: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, out, errOut)
		}
		if want < 0 {
			def = "error"
		}
		if err := root.validate(root.Defs[def], v, "$"); err != nil {
			t.Fatalf("branchctl %v --json: does not match $defs/%s: %v\n%s", args, def, err, out)
		}
		m, _ := v.(map[string]any)
		return m
	}
	// Successes, in an order that leaves something for the next.
	check("sandboxes", 0, "ls")
	check("branches", 0, "fork", "sb", "-n", "3")
	ex := check("exec", 3, "exec", "sb/1", "--", "sh", "-c", "echo out; echo err >&2; echo x > /f; exit 3")
	if ex["stdout"] != "out\n" || ex["stderr"] != "err\n" || ex["exitCode"] != float64(3) {
		t.Errorf("exec --json: %v; want its output and exit code in the document", ex)
	}
	check("branches", 0, "tree", "sb")
	logs := check("logs", 0, "logs", "sb/3")
	if logs["output"] != "" {
		t.Errorf("logs --json of a branch without a command: %v; want an empty output", logs)
	}
	check("abort", 0, "abort", "sb/3")
	// A branch's keys, and their old names (docs/design.md#names).
	sameBranch := func(what string, m map[string]any, want string) {
		if m["branch"] != want || m["context"] != want {
			t.Errorf("%s --json: branch %v, context %v; want both %q", what, m["branch"], m["context"], want)
		}
	}
	sameBranch("checkpoint", check("checkpoint", 0, "checkpoint", "sb/1", "c1"), "1")
	check("checkpoints", 0, "checkpoint", "ls", "sb")
	check("commit", 0, "commit", "sb/1")
	check("checkpoint", 0, "checkpoint", "sb", "c2")
	sameBranch("rollback", check("rollback", 0, "rollback", "sb", "c2"), "sb")
	check("object", 0, "checkpoint", "rm", "sb", "c2")
	check("object", 0, "save", "sb", tar)
	check("object", 0, "load", tar)
	check("object", 0, "speculate", "sb", "--", "true")

	// Errors: each command once, with what a user gets wrong.
	// Errors: each command once, with what a user gets wrong; noSandbox
	// marks a sandbox that does not exist, whose hint must lead to
	// branchctl ls.
	for _, tc := range []struct {
		args      []string
		noSandbox bool
	}{
		{[]string{"ls", "extra"}, false},
		{[]string{"fork", "nosuch"}, true},
		{[]string{"exec", "nosuch/1", "--", "true"}, true},
		{[]string{"tree", "nosuch"}, true},
		{[]string{"commit", "sb/99"}, false},
		{[]string{"abort", "sb/99"}, false},
		{[]string{"logs", "sb"}, false},
		{[]string{"checkpoint", "sb", "bad/name"}, false},
		{[]string{"checkpoint", "ls", "nosuch"}, true},
		{[]string{"checkpoint", "rm", "sb", "nosuch"}, false},
		{[]string{"rollback", "sb", "nosuch"}, false},
		{[]string{"push", "sb", "not a ref"}, false},
		{[]string{"pull", "not a ref", "sb2"}, false},
		{[]string{"save", "nosuch", tar}, true},
		{[]string{"load", filepath.Join(dir, "missing.tar")}, false},
		{[]string{"self", "tree"}, false},
		{[]string{"speculate", "nosuch", "--", "true"}, true},
		{[]string{"best-of-n", "nosuch", "--", "true"}, false},
		{[]string{"tournament", "nosuch", "--", "true"}, false},
		{[]string{"reflexion", "nosuch", "--", "true"}, false},
		{[]string{"beam", "nosuch", "--", "true"}, false},
		{[]string{"tree-search", "nosuch", "--", "true"}, false},
		{[]string{"no-such-command"}, false},
	} {
		m := check("error", -1, tc.args...)
		e, _ := m["error"].(map[string]any)
		t.Logf("branchctl %v: %v: %v (hint: %v)", tc.args, e["kind"], e["message"], e["hint"])
		if tc.noSandbox && (e["kind"] != "not-found" || !strings.Contains(fmt.Sprint(e["hint"]), "branchctl ls")) {
			t.Errorf("branchctl %v: kind %v hint %q; want not-found and a hint to branchctl ls", tc.args, e["kind"], e["hint"])
		}
	}
	var missing []string
	for _, c := range []string{"ls", "fork", "exec", "tree", "commit", "abort", "logs", "checkpoint", "rollback", "push", "pull", "save", "load", "self", "speculate", "best-of-n", "tournament", "reflexion", "beam", "tree-search"} {
		if !seen[c] {
			missing = append(missing, c)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("commands not checked: %v", missing)
	}
}
