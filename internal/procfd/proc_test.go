//go:build linux

package procfd

import (
	"os"
	"os/exec"
	"testing"
)

func TestTree(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	self := os.Getpid()
	if tree := Tree(self, nil); !tree[self] || !tree[cmd.Process.Pid] {
		t.Fatalf("tree of %d: %v; want it and its child %d", self, tree, cmd.Process.Pid)
	}
	if tree := Tree(self, func(p int) bool { return p != cmd.Process.Pid }); tree != nil {
		t.Fatalf("a walk its visit ended returned %v", tree)
	}
	infos, err := Mountinfo(self)
	if err != nil || len(infos) == 0 {
		t.Fatalf("mountinfo: %d mounts, %v", len(infos), err)
	}
}
