//go:build linux

package snapshotter

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
)

// memoryDir is, in a checkpoint's directory, the memory image of its
// branch's processes, when it was taken with memory.
const memoryDir = "memory"

// maxMemoryImageFiles bounds what a memory image may hold: CRIU writes a
// few files per process, and a tree of thousands is not a sandbox's.
const maxMemoryImageFiles = 100000

// copyMemoryImage copies the regular files of the memory image in src (a
// flat directory, as CRIU writes one) into dst, returning their bytes.
// Nothing else is taken: the directory is the shim's, but what is in it
// came from the sandbox's processes.
func copyMemoryImage(src, dst string) (int64, error) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return 0, err
	}
	if len(entries) > maxMemoryImageFiles {
		return 0, fmt.Errorf("%d files, more than %d: %w", len(entries), maxMemoryImageFiles, errdefs.ErrResourceExhausted)
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return 0, err
	}
	var total int64
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		n, err := copyRegular(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func copyRegular(src, dst string) (int64, error) {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}
