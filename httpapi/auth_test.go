//go:build linux

package httpapi

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/errdefs"
)

func TestTokens(t *testing.T) {
	f := filepath.Join(t.TempDir(), "tokens")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(f+".new", []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(f+".new", f); err != nil {
			t.Fatal(err)
		}
	}
	const a, b = "aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb"
	write("# comment\n\n" + a + " ns1, ns2\n" + b + "\t*\n")
	tk, err := NewTokens(f)
	if err != nil {
		t.Fatal(err)
	}
	if ns, err := tk.Namespaces(a); err != nil || !Allowed(ns, "ns2") || Allowed(ns, "ns3") {
		t.Fatalf("token a: %v %v", ns, err)
	}
	if ns, err := tk.Namespaces(b); err != nil || !Allowed(ns, "anything") {
		t.Fatalf("token b: %v %v", ns, err)
	}
	if _, err := tk.Namespaces("cccccccccccccccc"); !errdefs.IsUnauthorized(err) {
		t.Fatalf("unknown token: %v", err)
	}
	// Rotated: a goes, without a new Tokens.
	write(b + " ns1\n")
	if _, err := tk.Namespaces(a); !errdefs.IsUnauthorized(err) {
		t.Fatalf("token a after rotation: %v", err)
	}
	// Broken: no token is valid.
	write(b + "\n")
	if _, err := tk.Namespaces(b); !errdefs.IsUnauthorized(err) {
		t.Fatalf("token b with a broken file: %v", err)
	}
	write("short ns1\n")
	if _, err := tk.Namespaces("short"); !errdefs.IsUnauthorized(err) {
		t.Fatalf("a short token: %v", err)
	}
	if _, err := NewTokens(filepath.Join(t.TempDir(), "nosuch")); err == nil {
		t.Fatal("a missing token file was taken")
	}
}

func TestLimits(t *testing.T) {
	l := newLimits(2, 1)
	r1, err := l.acquire("c", true)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.acquire("c", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.acquire("c", true); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("third exec: %v", err)
	}
	if _, err := l.acquire("other", true); err != nil {
		t.Fatalf("another client's exec: %v", err)
	}
	if _, err := l.acquire("c", false); err != nil {
		t.Fatalf("a stream beside execs: %v", err)
	}
	r1()
	r1() // once only
	r3, err := l.acquire("c", true)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	r2()
	r3()
	if len(l.execs) != 1 { // "other" still holds one
		t.Fatalf("counts left: %v", l.execs)
	}
}
