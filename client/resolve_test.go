//go:build linux

package client

import (
	"encoding/json"
	"errors"
	"testing"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestResolve(t *testing.T) {
	list := []Sandbox{
		sb("abc123", "web"),
		sb("abd456", "db"),
		sb("web", "other"),
		sb("ff01", "app", "pod1/app"),
		sb("ff02", "app", "pod2/app"),
	}
	for _, tc := range []struct{ name, want, err string }{
		{name: "abc123", want: "abc123"},
		{name: "web", want: "web"}, // an exact id wins over a name
		{name: "db", want: "abd456"},
		{name: "abc", want: "abc123"},
		{name: "pod2/app", want: "ff02"},
		{name: "ab", err: `"ab" names 2 containers: abc123 ("web"), abd456 ("db"); give more of the id: invalid argument`},
		{name: "app", err: `"app" names 2 containers: ff01 ("app"), ff02 ("app"); give more of the id: invalid argument`},
		{name: "zz\x1b[2J", err: `no sandbox "zz\x1b[2J": no container has that id, id prefix or name: not found`},
	} {
		got, err := resolve(list, tc.name)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: got %v, want error %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got.ID != tc.want {
			t.Errorf("%q: got %q %v, want %q", tc.name, got.ID, err, tc.want)
		}
	}
	if _, err := resolve(list, "nope"); !errors.Is(err, ErrNoSandbox) || !errdefs.IsNotFound(err) {
		t.Errorf("not found is %v", err)
	}
}

func sb(id string, names ...string) Sandbox {
	return Sandbox{ID: id, Name: names[0], names: names}
}

func TestSandboxNames(t *testing.T) {
	md, _ := json.Marshal(map[string]any{"Version": "v1", "Metadata": map[string]any{
		"ID": "c1", "Name": "app_mypod_default_uid-1_0", "Config": map[string]any{"metadata": map[string]any{"name": "app"}}}})
	for _, tc := range []struct {
		c    *containersapi.Container
		want []string
	}{
		{&containersapi.Container{ID: "a", Labels: map[string]string{"nerdctl/name": "web"}}, []string{"web"}},
		{&containersapi.Container{ID: "b", Labels: map[string]string{kubeContainerLabel: "app", kubePodLabel: "p"}}, []string{"p/app", "app"}},
		{&containersapi.Container{ID: "c", Labels: map[string]string{criKindLabel: "container"},
			Extensions: map[string]*anypb.Any{criContainerExtension: {Value: md}}}, []string{"mypod/app", "app"}},
		{&containersapi.Container{ID: "d", Labels: map[string]string{criKindLabel: "sandbox", kubeContainerLabel: "POD"}}, nil},
	} {
		s := sandboxFromProto(tc.c)
		if len(s.names) != len(tc.want) || (len(s.names) > 0 && (s.names[0] != tc.want[0] || s.Name != tc.want[0])) {
			t.Errorf("%s: names %q, want %q", tc.c.ID, s.names, tc.want)
		}
	}
}

func TestReplaceWord(t *testing.T) {
	for _, c := range []struct{ text, word, with, want string }{
		{"memory fork of abc123: no", "abc123", "web", "memory fork of web: no"},
		{`no checkpoint named "x" in "abc123"`, "abc123", "web", `no checkpoint named "x" in "web"`},
		{"app: the application app-2 and app.", "app", "ap", "ap: the application app-2 and ap."},
		{"nothing here", "abc", "x", "nothing here"},
	} {
		if got, _ := replaceWord(c.text, c.word, c.with); got != c.want {
			t.Errorf("replaceWord(%q, %q, %q) = %q; want %q", c.text, c.word, c.with, got, c.want)
		}
	}
}
