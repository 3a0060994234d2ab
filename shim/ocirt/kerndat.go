//go:build linux

package ocirt

// CRIU probes the kernel's features at the start of every dump and
// restore (kerndat: about 25 ms here, most of a small process's dump),
// unless it finds the result cached in /run/criu.kdat. It writes that cache
// only where /run is a tmpfs, so that a reboot (perhaps into another
// kernel) drops it, and it gives up for good if a CRIU killed while saving
// left criu.kdat.tmp behind (it creates the file with O_EXCL). Nodes whose
// /run is a plain directory (this project's CI machines), and nodes with
// such a leftover, paid the probe on every memory fork, once for the dump
// and once per branch restored.
//
// ensureKerndatCache keeps the cache there: it removes a stale leftover,
// and where /run is not a tmpfs it has CRIU write the cache on a tmpfs of
// its own (in a private mount namespace) and puts the file in /run with
// the boot it was made in, replacing it after a reboot. CRIU reads the
// cache from any filesystem, and checks its own build's magic in it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/branchbox/branchbox/internal/lockedthread"
)

const (
	// kerndatDir and kerndatName are CRIU's (KDAT_RUNDIR, built with
	// the default RUNDIR, and KERNDAT_CACHE_NAME).
	kerndatDir  = "/run"
	kerndatName = "criu.kdat"
	// kerndatBoot records the boot the cache was made in, where we made it.
	kerndatBoot = "criu.kdat.boot-id"
	// kerndatStale is how old a criu.kdat.tmp must be to be a dead CRIU's:
	// a live one writes it at once.
	kerndatStale = time.Minute
)

// ensureKerndatCache is best effort: without a cache CRIU probes, as before.
func ensureKerndatCache(criu string) error {
	tmp := filepath.Join(kerndatDir, kerndatName+".tmp")
	if fi, err := os.Lstat(tmp); err == nil && time.Since(fi.ModTime()) > kerndatStale {
		_ = os.Remove(tmp)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(kerndatDir, &st); err != nil {
		return fmt.Errorf("kerndat cache: %w", err)
	}
	if st.Type == unix.TMPFS_MAGIC {
		return nil
	}
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return fmt.Errorf("kerndat cache: %w", err)
	}
	if made, err := os.ReadFile(filepath.Join(kerndatDir, kerndatBoot)); err == nil && bytes.Equal(made, boot) {
		if _, err := os.Stat(filepath.Join(kerndatDir, kerndatName)); err == nil {
			return nil
		}
	}
	// An earlier boot's cache goes first, the boot is recorded last: a
	// failure between them leaves no cache, or one that is made again,
	// never an old kernel's cache under this boot's record.
	if err := os.Remove(filepath.Join(kerndatDir, kerndatName)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("kerndat cache: %w", err)
	}
	data, err := probeKerndat(criu)
	if err != nil {
		return fmt.Errorf("kerndat cache: %w", err)
	}
	if err := replaceFile(kerndatName, data); err != nil {
		return fmt.Errorf("kerndat cache: %w", err)
	}
	if err := replaceFile(kerndatBoot, boot); err != nil {
		return fmt.Errorf("kerndat cache: %w", err)
	}
	return nil
}

// probeKerndat runs `criu check` with a tmpfs over /run, on a thread in a
// mount namespace of its own, and returns the cache CRIU wrote there.
func probeKerndat(criu string) ([]byte, error) {
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	// The thread stays locked: it ends changed, with the goroutine.
	lockedthread.Go(func() {
		var r result
		r.data, r.err = probeKerndatHere(criu)
		done <- r
	})
	r := <-done
	return r.data, r.err
}

func probeKerndatHere(criu string) ([]byte, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("unshare: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", kerndatDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=1m,mode=0700"); err != nil {
		return nil, fmt.Errorf("mount a tmpfs for criu: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A failed check (a feature missing) still leaves the probe's result.
	// The child is started from this thread, so it is in its namespace.
	out, cerr := exec.CommandContext(ctx, criu, "check").CombinedOutput()
	data, err := os.ReadFile(filepath.Join(kerndatDir, kerndatName))
	if err != nil {
		if cerr != nil {
			return nil, fmt.Errorf("criu check: %w: %s", cerr, bytes.TrimSpace(out))
		}
		return nil, errors.New("criu check wrote no cache")
	}
	return data, nil
}

// replaceFile writes name in kerndatDir whole, or leaves it as it was.
func replaceFile(name string, data []byte) error {
	f, err := os.CreateTemp(kerndatDir, "."+name+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), filepath.Join(kerndatDir, name))
}
