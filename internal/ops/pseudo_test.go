//go:build linux

package ops

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// hostRoot is the test's own root, opened with caps as the sandbox's.
func hostRoot(t *testing.T, caps uint64) *Root {
	t.Helper()
	dir, err := os.Open("/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close() })
	return &Root{dir: dir, caps: caps}
}

// A sysfs attribute says 4096 bytes whatever it holds: it is read whole,
// not trusted (the HTTP API sent Content-Length 4096 and 6 bytes).
func TestPseudoSysfsSize(t *testing.T) {
	f, err := OpenFile(hostRoot(t, ^uint64(0)), "/sys/class/net/lo/mtu")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.Pseudo {
		t.Fatal("a sysfs file is not pseudo")
	}
	data, err := f.ReadAll(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) == f.Info.Size() || !strings.HasSuffix(string(data), "\n") {
		t.Fatalf("read %q, its size says %d", data, f.Info.Size())
	}
}

// The kernel's refusal of a read is the request's mistake (it was a 500).
func TestPseudoReadRefused(t *testing.T) {
	f, err := OpenFile(hostRoot(t, ^uint64(0)), "/proc/self/mem")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = f.ReadAll(1 << 20)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("read /proc/self/mem at 0: %v, want invalid argument", err)
	}
}

// A pseudo file is opened with the sandbox's capabilities: /proc/kmsg
// needs CAP_SYSLOG, which a container's default set lacks (the server,
// as root, read the node's kernel log, and waited for it).
func TestPseudoOpenedWithSandboxCaps(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	_, err := OpenFile(hostRoot(t, 0), "/proc/kmsg")
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("open /proc/kmsg with no capabilities: %v, want permission denied", err)
	}
	// The thread's capabilities are back: a file only root can open
	// still opens as it did.
	f, err := OpenFile(hostRoot(t, 0), "/etc/shadow")
	if err != nil {
		t.Fatalf("open /etc/shadow after: %v", err)
	}
	f.Close()
}

// A regular file is not pseudo, and a fifo is refused without waiting for
// a writer.
func TestOpenRegularOnly(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/f", []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := hostRoot(t, 0)
	f, err := OpenFile(r, dir+"/f")
	if err != nil {
		t.Fatal(err)
	}
	data, err := f.ReadAll(100)
	f.Close()
	if err != nil || string(data) != "data" || f.Pseudo {
		t.Fatalf("read %q, %v, pseudo %v", data, err, f.Pseudo)
	}
	if err := mkfifo(dir + "/fifo"); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenFile(r, dir+"/fifo"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("open a fifo: %v, want invalid argument", err)
	}
	if _, err := WriteFile(r, dir+"/fifo", strings.NewReader("x"), 0o600); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("write a fifo: %v, want invalid argument", err)
	}
	if n, err := WriteFile(r, dir+"/new", strings.NewReader("xy"), 0o600); err != nil || n != 2 {
		t.Fatalf("write a new file: %d, %v", n, err)
	}
}

func mkfifo(p string) error { return unix.Mkfifo(p, 0o600) }
