//go:build linux

package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/archive"
	"github.com/containerd/containerd/v2/pkg/archive/compression"
	"github.com/containerd/containerd/v2/pkg/labels"
	cfs "github.com/containerd/continuity/fs"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// A state's layer is found from the directories the two states stack over
// the layers they share (diffDirs), so that its cost follows the change
// and not the image: containerd's diff service walks both whole trees, a
// stat of every file of the image twice.

// layerStack returns the directories of a single overlay (upper first,
// then its lower directories, top to bottom) or bind mount, and false for
// any other shape.
func layerStack(ms []mount.Mount) ([]string, bool) {
	if len(ms) != 1 {
		return nil, false
	}
	m := ms[0]
	if m.Type == "bind" || slices.Contains(m.Options, "bind") || slices.Contains(m.Options, "rbind") {
		return []string{m.Source}, true
	}
	if m.Type != "overlay" {
		return nil, false
	}
	var upper string
	var lowers []string
	for _, o := range m.Options {
		switch k, v, _ := strings.Cut(o, "="); k {
		case "upperdir":
			upper = v
		case "lowerdir":
			if strings.Contains(v, `\`) {
				return nil, false // escaped colons: not ours to parse
			}
			lowers = strings.Split(v, ":")
		}
	}
	if len(lowers) == 0 {
		return nil, false
	}
	if upper != "" {
		return append([]string{upper}, lowers...), true
	}
	return lowers, true
}

// diffDirs returns the directories each state stacks over the layers the
// two share (at least one: the image's lowest), upper's then lower's:
// every path that differs between the two states is named in one of them.
// (A branch's rootfs holds its whole change in its upper directory, while
// its checkpoints are layers of their own: the two share only the image.)
func diffDirs(lower, upper []mount.Mount) ([]string, bool) {
	l, ok := layerStack(lower)
	if !ok {
		return nil, false
	}
	u, ok := layerStack(upper)
	if !ok {
		return nil, false
	}
	shared := 0
	for shared < min(len(l), len(u)) && l[len(l)-1-shared] == u[len(u)-1-shared] {
		shared++
	}
	if shared == 0 {
		return nil, false
	}
	return append(slices.Clone(u[:len(u)-shared]), l[:len(l)-shared]...), true
}

// change is one entry of a layer: a path (with a leading slash, as
// continuity names them) and whether it is gone in the newer state.
type change struct {
	path    string
	deleted bool
}

// changesIn lists what differs between the trees mounted at lowerRoot and
// upperRoot, given the directories (dirs) that name every path that may
// differ: each one present in upper and not the same in lower (added or
// changed), each one present only in lower (deleted: a whiteout, or a name
// an opaque directory hides), and every name a directory of both trees
// lost. Paths named but in neither tree (made and removed again) are left
// out, and so is anything below a deleted path. Sorted as a tree walk
// visits them, parents first.
func changesIn(ctx context.Context, dirs []string, lowerRoot, upperRoot string) ([]change, error) {
	named := map[string]struct{}{}
	for _, d := range dirs {
		err := filepath.WalkDir(d, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if rel := strings.TrimPrefix(p, d); rel != "" {
				named[rel] = struct{}{}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("walk the change in %s: %w", d, err)
		}
	}
	lowerTree, upperTree := newTree(lowerRoot), newTree(upperRoot)
	var out []change
	for p := range named {
		inUpper, err := upperTree.exists(p)
		if err != nil {
			return nil, err
		}
		inLower, err := lowerTree.exists(p)
		if err != nil {
			return nil, err
		}
		switch {
		case inUpper && !inLower:
			out = append(out, change{path: p})
		case inLower && !inUpper:
			// Under what is no directory now, the replacement (or the
			// parent's own whiteout) covers it.
			if ok, err := upperTree.isDir(path.Dir(p)); err != nil {
				return nil, err
			} else if ok {
				out = append(out, change{path: p, deleted: true})
			}
		}
		if !inUpper || !inLower {
			continue
		}
		same, err := sameFile(lowerRoot+p, upperRoot+p)
		if err != nil {
			return nil, err
		}
		if !same {
			out = append(out, change{path: p})
		}
		// A directory of both: names it lost that no dir names (an
		// opaque directory hides all of lower's).
		lost, err := lostNames(lowerRoot+p, upperRoot+p)
		if err != nil {
			return nil, err
		}
		for _, name := range lost {
			if _, ok := named[p+"/"+name]; !ok {
				out = append(out, change{path: p + "/" + name, deleted: true})
			}
		}
	}
	slices.SortFunc(out, func(a, b change) int {
		return slices.Compare(strings.Split(a.path, "/"), strings.Split(b.path, "/"))
	})
	// Nothing below a deleted path: its whiteout covers it.
	kept := out[:0]
	gone := ""
	for _, c := range out {
		if gone != "" && strings.HasPrefix(c.path, gone+"/") {
			continue
		}
		if c.deleted {
			gone = c.path
		}
		kept = append(kept, c)
	}
	return kept, nil
}

// tree looks paths up in one mounted tree without following a symlink on
// the way: the paths come from directories a sandbox wrote, and a symlink
// it made where another layer has a directory (/a -> / over /a/b) must
// not lead a lookup out of the tree. A path under anything that is not a
// directory is not in the tree, as a walk of it would not find it.
type tree struct {
	root string
	dirs map[string]bool // path: a directory, reached through directories
}

func newTree(root string) *tree { return &tree{root: root, dirs: map[string]bool{"/": true}} }

func (t *tree) exists(p string) (bool, error) {
	if ok, err := t.isDir(path.Dir(p)); err != nil || !ok {
		return false, err
	}
	_, err := os.Lstat(t.root + p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

func (t *tree) isDir(p string) (bool, error) {
	if v, ok := t.dirs[p]; ok {
		return v, nil
	}
	v, err := t.exists(p)
	if err != nil {
		return false, err
	}
	if v {
		fi, err := os.Lstat(t.root + p)
		if err != nil {
			return false, err
		}
		v = fi.IsDir()
	}
	t.dirs[p] = v
	return v, nil
}

// sameFile says whether two files are the same by the rules containerd's
// diff service compares them by (continuity's fs.Changes): one file (an
// overlay shows a lower layer's file with its own device and inode), or
// the same type, mode, owner, device and file capabilities, and for a file
// that is not a directory also the same size and mtime, and where both
// mtimes lack nanoseconds (as a tar layer leaves them), the same content
// or link.
func sameFile(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Lstat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Lstat(b, &sb); err != nil {
		return false, err
	}
	if sa.Dev == sb.Dev && sa.Ino == sb.Ino {
		return true, nil
	}
	if sa.Mode != sb.Mode || sa.Uid != sb.Uid || sa.Gid != sb.Gid || sa.Rdev != sb.Rdev {
		return false, nil
	}
	if ca, cb := capability(a), capability(b); ca != cb {
		return false, nil
	}
	if sa.Mode&unix.S_IFMT == unix.S_IFDIR {
		return true, nil
	}
	if sa.Size != sb.Size || sa.Mtim.Sec != sb.Mtim.Sec || sa.Mtim.Nsec != sb.Mtim.Nsec {
		return false, nil
	}
	if sa.Mtim.Nsec != 0 || sa.Size == 0 {
		return true, nil
	}
	if sa.Mode&unix.S_IFMT == unix.S_IFLNK {
		la, err := os.Readlink(a)
		if err != nil {
			return false, err
		}
		lb, err := os.Readlink(b)
		return la == lb, err
	}
	if sa.Mode&unix.S_IFMT != unix.S_IFREG {
		return true, nil
	}
	return sameContent(a, b)
}

// capability is a file's security.capability attribute ("" if none).
func capability(p string) string {
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(p, "security.capability", buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// sameContent compares two regular files byte for byte.
func sameContent(a, b string) (bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return false, err
	}
	defer fb.Close()
	ba, bb := make([]byte, 64<<10), make([]byte, 64<<10)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea == io.EOF || ea == io.ErrUnexpectedEOF {
			return eb == io.EOF || eb == io.ErrUnexpectedEOF, nil
		}
		if ea != nil {
			return false, ea
		}
		if eb != nil {
			return false, eb
		}
	}
}

// lostNames returns the names in directory lower that directory upper
// lacks; none if either is not a directory.
func lostNames(lower, upper string) ([]string, error) {
	names := func(dir string) ([]string, error) {
		f, err := os.Open(dir)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		return f.Readdirnames(-1)
	}
	if fi, err := os.Lstat(lower); err != nil || !fi.IsDir() {
		return nil, err
	}
	if fi, err := os.Lstat(upper); err != nil || !fi.IsDir() {
		return nil, err
	}
	ln, err := names(lower)
	if err != nil {
		return nil, err
	}
	un, err := names(upper)
	if err != nil {
		return nil, err
	}
	have := make(map[string]struct{}, len(un))
	for _, n := range un {
		have[n] = struct{}{}
	}
	var lost []string
	for _, n := range ln {
		if _, ok := have[n]; !ok {
			lost = append(lost, n)
		}
	}
	return lost, nil
}

// writeLayer writes the gzip layer of the changes between the states
// mounted by lower and upper (whose overlay stacks dirs over lower's) into
// the content store, as containerd's walking differ writes one (the same
// tar writer, reading the upper tree), and returns it with its diff id.
// The two states are mounted in a mount namespace of the writer's own.
func writeLayer(ctx context.Context, cs content.Store, lower, upper []mount.Mount, dirs []string) (desc ocispec.Descriptor, diffID digest.Digest, retErr error) {
	err := inOwnMountNamespace(func() error {
		return mountAndWrite(ctx, cs, lower, upper, dirs, &desc, &diffID)
	})
	return desc, diffID, err
}

func mountAndWrite(ctx context.Context, cs content.Store, lower, upper []mount.Mount, dirs []string, desc *ocispec.Descriptor, diffID *digest.Digest) error {
	return mount.WithReadonlyTempMount(ctx, lower, func(lowerRoot string) error {
		return mount.WithReadonlyTempMount(ctx, upper, func(upperRoot string) error {
			changes, err := changesIn(ctx, dirs, lowerRoot, upperRoot)
			if err != nil {
				return err
			}
			*desc, *diffID, err = storeLayer(ctx, cs, func(w io.Writer) error {
				tw := archive.NewChangeWriter(w, upperRoot)
				for _, c := range changes {
					kind, fi := cfs.ChangeKind(cfs.ChangeKindDelete), os.FileInfo(nil)
					if !c.deleted {
						if fi, err = os.Lstat(upperRoot + c.path); err != nil {
							return err
						}
						kind = cfs.ChangeKindModify
					}
					if err := tw.HandleChange(kind, c.path, fi, nil); err != nil {
						return err
					}
				}
				return tw.Close()
			})
			return err
		})
	})
}

// storeLayer writes the gzip-compressed stream write makes into the
// content store, labelled with its uncompressed digest (its diff id). An
// unfinished write is aborted, leaving nothing in the store.
func storeLayer(ctx context.Context, cs content.Store, write func(io.Writer) error) (ocispec.Descriptor, digest.Digest, error) {
	ref := "branchbox-layer-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	w, err := content.OpenWriter(ctx, cs, content.WithRef(ref), content.WithDescriptor(ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip}))
	if err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("open a content writer: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			w.Close()
			if err := cs.Abort(context.WithoutCancel(ctx), ref); err != nil && !errdefs.IsNotFound(err) {
				log.G(ctx).WithError(err).WithField("ref", ref).Warn("abort an unfinished layer write")
			}
		}
	}()
	gz, err := compression.CompressStream(w, compression.Gzip)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	uncompressed := digest.SHA256.Digester()
	if err := write(io.MultiWriter(gz, uncompressed.Hash())); err != nil {
		gz.Close()
		return ocispec.Descriptor{}, "", err
	}
	if err := gz.Close(); err != nil {
		return ocispec.Descriptor{}, "", err
	}
	diffID := uncompressed.Digest()
	lbls := map[string]string{labels.LabelUncompressed: diffID.String()}
	dgst := w.Digest()
	if err := commitHeld(ctx, w, 0, dgst, content.WithLabels(lbls)); err != nil {
		return ocispec.Descriptor{}, "", fmt.Errorf("commit the layer: %w", err)
	}
	committed = true // or already there: the same layer, made before
	info, err := cs.Info(ctx, dgst)
	if err != nil {
		return ocispec.Descriptor{}, "", err
	}
	if info.Labels[labels.LabelUncompressed] == "" {
		info.Labels = lbls
		if _, err := cs.Update(ctx, info, "labels."+labels.LabelUncompressed); err != nil {
			return ocispec.Descriptor{}, "", fmt.Errorf("label the layer with its diff id: %w", err)
		}
	}
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: dgst, Size: info.Size}, diffID, nil
}
