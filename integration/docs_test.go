//go:build linux

package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/branchbox/branchbox/internal/daemons"
	"github.com/branchbox/branchbox/internal/ociimage"
)

// docsTestTag is the info string of a fenced block the docs test runs
// (```sh docs-test): a command block a reader would paste, which must
// work as written.
const docsTestTag = "sh docs-test"

// docBlock is one runnable block of a Markdown file.
type docBlock struct {
	file string // relative to the repository root
	line int    // of the opening fence
	text string
}

// docBlocks returns the runnable blocks of README.md and docs/**/*.md.
func docBlocks(root string) ([]docBlock, error) {
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var out []docBlock
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		out = append(out, parseDocBlocks(f, data)...)
	}
	return out, nil
}

// parseDocBlocks finds the ```sh docs-test blocks of one file.
func parseDocBlocks(file string, data []byte) []docBlock {
	var out []docBlock
	var cur *docBlock
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		trimmed := strings.TrimSpace(l)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```") && strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) == docsTestTag:
			cur = &docBlock{file: file, line: n}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		}
	}
	return out
}

func TestParseDocBlocks(t *testing.T) {
	md := "# x\n```sh\nnot run\n```\n```sh docs-test\necho a\necho b\n```\n```  sh docs-test \necho c\n```\n"
	got := parseDocBlocks("f.md", []byte(md))
	if len(got) != 2 || got[0].text != "echo a\necho b\n" || got[0].line != 5 || got[1].text != "echo c\n" {
		t.Fatalf("got %+v", got)
	}
}

// TestDocsCommands runs every ```sh docs-test block of the README and
// docs/ as a reader would: bash -euo pipefail from the repository root,
// the built binaries first on PATH, CONTAINERD_ADDRESS and
// CONTAINERD_NAMESPACE naming a private containerd with the branch
// snapshotter (the private-containerd recipe starts its own), and
// bin/busybox.tar present (make image). A block must end what it started:
// the env's teardown fails on a container, shim or mount left, and this
// test on a process left in the block's process group.
func TestDocsCommands(t *testing.T) {
	requireRoot(t)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := docBlocks(root)
	if err != nil {
		t.Fatal(err)
	}
	// The README's branchctl session, the private-containerd recipe and
	// make image are runnable: losing one from the docs fails here.
	want := map[string]bool{"README.md": false, "docs/private-containerd.md": false}
	image := false
	for _, b := range blocks {
		if _, ok := want[b.file]; ok {
			want[b.file] = true
		}
		image = image || strings.Contains(b.text, "make image")
	}
	for f, ok := range want {
		if !ok {
			t.Errorf("%s has no ```%s block", f, docsTestTag)
		}
	}
	if !image {
		t.Errorf("no ```%s block runs make image", docsTestTag)
	}
	bin := daemons.BinDirFromEnv()
	if err := ociimage.WriteBusyboxImageFile(filepath.Join(bin, "busybox.tar")); err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			ctx, env := startEnv(t)
			runDocBlock(t, ctx, root, env, b)
		})
	}
}

func runDocBlock(t *testing.T, ctx context.Context, root string, env *daemons.Env, b docBlock) {
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	tmp := t.TempDir()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.text)
	cmd.Dir = root
	cmd.Env = append(os.Environ(),
		"PATH="+env.BinDir+":"+os.Getenv("PATH"),
		"CONTAINERD_ADDRESS="+env.Address,
		"CONTAINERD_NAMESPACE="+env.Namespace,
		"TMPDIR="+tmp,
	)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	runErr := cmd.Run()
	pgid := cmd.Process.Pid
	if left := processGroup(pgid); len(left) > 0 {
		t.Errorf("%s:%d left processes running: %v (killed)", b.file, b.line, left)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		waitGone(pgid, 10*time.Second)
	}
	if m, _ := daemons.MountsUnder(tmp); len(m) > 0 {
		t.Errorf("%s:%d left mounts: %v", b.file, b.line, m)
	}
	// The runtime's directory of a namespace the block used on its own
	// containerd (the shim makes it and, as runc, leaves it): removed if
	// empty, reported if not.
	for _, m := range regexp.MustCompile(`CONTAINERD_NAMESPACE=([A-Za-z0-9._-]+)`).FindAllStringSubmatch(b.text, -1) {
		if err := os.Remove(filepath.Join(runtimeRoot, m[1])); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s:%d left runtime state: %v", b.file, b.line, err)
		}
	}
	if runErr != nil {
		var ee *exec.ExitError
		if errors.As(runErr, &ee) || ctx.Err() != nil {
			t.Fatalf("%s:%d failed (%v):\n%s\noutput:\n%s", b.file, b.line, runErr, b.text, out.String())
		}
		t.Fatal(runErr)
	}
	t.Logf("%s:%d output:\n%s", b.file, b.line, out.String())
}

// processGroup lists the live processes of process group pgid.
func processGroup(pgid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command (which may hold spaces) end at ')'.
		i := bytes.LastIndexByte(stat, ')')
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			out = append(out, pid)
		}
	}
	return out
}

func waitGone(pgid int, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end) && len(processGroup(pgid)) > 0; {
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDocsLinks: every relative link of the README and docs/ leads to a
// file of the repository.
func TestDocsLinks(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(root, "README.md")}
	_ = filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(f), target)); err != nil {
				rel, _ := filepath.Rel(root, f)
				t.Errorf("%s links to %s, which does not exist", rel, target)
			}
		}
	}
}
