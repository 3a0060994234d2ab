//go:build linux

package apply

import (
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// randTree lists the paths under root (root itself as "") by type, without
// following symlinks, so random operations can pick targets.
type randTree struct {
	dirs, files, others []string
}

func listTree(t testing.TB, root string) randTree {
	var rt randTree
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			rel = ""
		}
		switch {
		case d.IsDir():
			rt.dirs = append(rt.dirs, rel)
		case d.Type().IsRegular():
			rt.files = append(rt.files, rel)
		default:
			rt.others = append(rt.others, rel)
		}
		return nil
	})
	must(t, err)
	return rt
}

func pick(r *rand.Rand, lists ...[]string) (string, bool) {
	var all []string
	for _, l := range lists {
		all = append(all, l...)
	}
	if len(all) == 0 {
		return "", false
	}
	return all[r.IntN(len(all))], true
}

var randModes = []uint32{0o644, 0o600, 0o755, 0o700, 0o4755, 0o2750, 0o1777, 0o444, 0o6711}

// openRegular opens p for writing only if it is a regular file or absent.
// The generator makes device nodes: writing to one would drive a real
// device of the host (1:4 is /dev/port), and whether that open succeeds
// depends on the machine, which would make a seed replay differently.
func openRegular(p string, flag int) (*os.File, error) {
	if st, err := os.Lstat(p); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", p)
	}
	return os.OpenFile(p, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o644)
}

// randFile writes content of a random size, sometimes with holes.
func randFile(r *rand.Rand, p string) error {
	f, err := openRegular(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return err
	}
	defer f.Close()
	for range r.IntN(4) {
		buf := make([]byte, r.IntN(9000))
		for i := range buf {
			buf[i] = byte(r.IntN(256))
		}
		if _, err := f.WriteAt(buf, int64(r.IntN(3))*int64(r.IntN(2<<20))); err != nil {
			return err
		}
	}
	if r.IntN(4) == 0 {
		return f.Truncate(int64(r.IntN(4 << 20)))
	}
	return nil
}

// randOp makes one random change under root. Errors are expected (a chmod
// of a symlink, a rename of a lower directory) and ignored: the oracle
// compares whatever state the kernel reached.
func randOp(r *rand.Rand, root string, rt randTree) {
	newName := func() string {
		d, _ := pick(r, rt.dirs)
		return filepath.Join(root, d, "n"+strconv.Itoa(r.IntN(6)))
	}
	anyPath := func() string {
		p, ok := pick(r, rt.files, rt.others, rt.dirs[min(1, len(rt.dirs)):])
		if !ok {
			return newName() // never the root itself
		}
		return filepath.Join(root, p)
	}
	file := func() string {
		p, ok := pick(r, rt.files)
		if !ok {
			return newName()
		}
		return filepath.Join(root, p)
	}
	switch r.IntN(17) {
	case 0:
		_ = randFile(r, newName())
	case 1:
		_ = randFile(r, file())
	case 2:
		if f, err := openRegular(file(), os.O_WRONLY|os.O_APPEND); err == nil {
			_, _ = f.Write([]byte("appended"))
			f.Close()
		}
	case 3:
		_ = unix.Fchmodat(unix.AT_FDCWD, anyPath(), randModes[r.IntN(len(randModes))], 0)
	case 4:
		_ = os.Lchown(anyPath(), r.IntN(3)*1000, r.IntN(3)*1000)
	case 5:
		ns := []string{"user.a", "user.b", "security.bb"}
		_ = unix.Lsetxattr(anyPath(), ns[r.IntN(3)], []byte(strconv.Itoa(r.IntN(100))), 0)
	case 6:
		_ = unix.Lremovexattr(anyPath(), "user.a")
	case 7, 8:
		_ = os.RemoveAll(anyPath())
	case 9:
		_ = os.Mkdir(newName(), os.FileMode(randModes[r.IntN(len(randModes))]&0o777))
	case 10:
		if d, ok := pick(r, rt.dirs[min(1, len(rt.dirs)):]); ok {
			p := filepath.Join(root, d)
			_ = os.RemoveAll(p)
			_ = os.Mkdir(p, 0o755)
			_ = randFile(r, filepath.Join(p, "again"))
		}
	case 11:
		texts := []string{"../../../etc/passwd", "/abs/path", "n1", "..", "d0/n2", ""}
		_ = os.Symlink(texts[r.IntN(len(texts)-1)], newName())
	case 12:
		_ = os.Link(file(), newName())
	case 13:
		_ = os.Rename(file(), newName())
	case 14:
		if r.IntN(2) == 0 {
			_ = unix.Mkfifo(newName(), 0o640)
		} else {
			// Harmless numbers (null, zero, full, random, urandom) even
			// though nothing opens them.
			minors := []uint32{3, 5, 7, 8, 9}
			_ = unix.Mknod(newName(), unix.S_IFCHR|0o600, int(unix.Mkdev(1, minors[r.IntN(len(minors))])))
		}
	case 15:
		// Type change in place.
		p := anyPath()
		_ = os.RemoveAll(p)
		switch r.IntN(3) {
		case 0:
			_ = randFile(r, p)
		case 1:
			_ = os.Mkdir(p, 0o755)
		case 2:
			_ = os.Symlink("target-"+strconv.Itoa(r.IntN(3)), p)
		}
	case 16:
		sec := int64(1e9 + r.IntN(1e9))
		ts := []unix.Timespec{{Sec: sec, Nsec: int64(r.IntN(1e9))}, {Sec: sec, Nsec: int64(r.IntN(1e9))}}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, anyPath(), ts, unix.AT_SYMLINK_NOFOLLOW)
	}
}

func randBase(r *rand.Rand) func(t testing.TB, l string) {
	return func(t testing.TB, l string) {
		t.Helper()
		for i := range 3 {
			must(t, os.MkdirAll(filepath.Join(l, "d"+strconv.Itoa(i), "e"+strconv.Itoa(r.IntN(2))), 0o755))
		}
		n := 10 + r.IntN(30)
		for range n {
			randOp(r, l, listTree(t, l))
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// TestApplyRandomized runs seeded rounds of random changes on random bases
// through the kernel oracle. BRANCHBOX_APPLY_SEED replays one round and
// BRANCHBOX_APPLY_ROUNDS sets how many run (default 200).
func TestApplyRandomized(t *testing.T) {
	requireRoot(t)
	first := uint64(time.Now().UnixNano())
	rounds := envInt("BRANCHBOX_APPLY_ROUNDS", 200)
	if s := envInt("BRANCHBOX_APPLY_SEED", -1); s >= 0 {
		first, rounds = uint64(s), 1
	}
	var total Stats
	for i := range rounds {
		seed := first + uint64(i)
		ok := t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 0))
			nops := 1 + r.IntN(40)
			o := runOracle(t, randBase(r), func(t testing.TB, m string) {
				for range nops {
					randOp(r, m, listTree(t, m))
				}
			})
			s := o.stats
			total.Files += s.Files
			total.Dirs += s.Dirs
			total.Symlinks += s.Symlinks
			total.Hardlinks += s.Hardlinks
			total.Devices += s.Devices
			total.Whiteouts += s.Whiteouts
			total.Opaques += s.Opaques
			total.Bytes += s.Bytes
		})
		if !ok {
			t.Fatalf("round failed; replay with BRANCHBOX_APPLY_SEED=%d", seed)
		}
	}
	t.Logf("first seed %d, %d rounds, applied in total: %+v", first, rounds, total)
	// The generator must actually reach every kind of entry, or the rounds
	// prove less than they claim.
	if rounds >= 50 && (total.Files == 0 || total.Dirs == 0 || total.Symlinks == 0 || total.Hardlinks == 0 ||
		total.Devices == 0 || total.Whiteouts == 0 || total.Opaques == 0) {
		t.Fatalf("random changes missed a kind of entry: %+v", total)
	}
}
