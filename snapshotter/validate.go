package snapshotter

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/labels"
	"github.com/containerd/errdefs"
)

// maxKeyLen bounds a key; containerd's own keys (namespace/sequence/name or
// a chain ID) are far shorter.
const maxKeyLen = 4096

// validateKey rejects keys that are empty, too long, carry NUL or control
// characters, or contain a ".." element. Keys are never used as paths here,
// but names that look like escapes are refused so that nothing downstream
// (logs, tools, later branch paths) can be fooled by one.
func validateKey(op, key string) error {
	if key == "" {
		return fmt.Errorf("%s: snapshot key is empty: %w", op, errdefs.ErrInvalidArgument)
	}
	if len(key) > maxKeyLen {
		return fmt.Errorf("%s: snapshot key is %d bytes long, more than the %d allowed: %w", op, len(key), maxKeyLen, errdefs.ErrInvalidArgument)
	}
	if err := checkName(key); err != nil {
		return fmt.Errorf("%s: snapshot key %s %v: %w", op, strconv.Quote(key), err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validateLabels applies containerd's size limit and the same name rules as
// keys to label keys; values may hold any text but NUL.
func validateLabels(op string, l map[string]string) error {
	for k, v := range l {
		if err := labels.Validate(k, v); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if k == "" {
			return fmt.Errorf("%s: label key is empty: %w", op, errdefs.ErrInvalidArgument)
		}
		if err := checkName(k); err != nil {
			return fmt.Errorf("%s: label key %s %v: %w", op, strconv.Quote(k), err, errdefs.ErrInvalidArgument)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("%s: value of label %s contains a NUL byte: %w", op, strconv.Quote(k), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// validateOpts checks the labels that opts would set.
func validateOpts(op string, opts []snapshots.Opt) error {
	var info snapshots.Info
	for _, o := range opts {
		if err := o(&info); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	return validateLabels(op, info.Labels)
}

func checkName(name string) error {
	for _, r := range name {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("contains control character %q", r)
		}
	}
	for _, elem := range strings.Split(name, "/") {
		if elem == ".." {
			return fmt.Errorf(`contains a ".." path element`)
		}
	}
	return nil
}

// mappedRoot returns the host uid and gid that container root maps to under
// the id-mapping labels, and whether any mapping was asked for. A label holds
// comma-separated "containerID:hostID:size" ranges.
func mappedRoot(l map[string]string) (uid, gid int, mapped bool, err error) {
	uidMap, hasUID := l[snapshots.LabelSnapshotUIDMapping]
	gidMap, hasGID := l[snapshots.LabelSnapshotGIDMapping]
	if !hasUID && !hasGID {
		return -1, -1, false, nil
	}
	if !hasUID || !hasGID {
		return -1, -1, false, fmt.Errorf("labels %s and %s must be given together: %w", snapshots.LabelSnapshotUIDMapping, snapshots.LabelSnapshotGIDMapping, errdefs.ErrInvalidArgument)
	}
	if uid, err = rootOf(snapshots.LabelSnapshotUIDMapping, uidMap); err != nil {
		return -1, -1, false, err
	}
	if gid, err = rootOf(snapshots.LabelSnapshotGIDMapping, gidMap); err != nil {
		return -1, -1, false, err
	}
	return uid, gid, true, nil
}

func rootOf(label, value string) (int, error) {
	for _, r := range strings.Split(value, ",") {
		parts := strings.Split(r, ":")
		if len(parts) != 3 {
			return -1, fmt.Errorf("label %s: range %q is not containerID:hostID:size: %w", label, r, errdefs.ErrInvalidArgument)
		}
		var n [3]uint32
		for i, p := range parts {
			v, err := strconv.ParseUint(p, 10, 32)
			if err != nil {
				return -1, fmt.Errorf("label %s: range %q: %v: %w", label, r, err, errdefs.ErrInvalidArgument)
			}
			n[i] = uint32(v)
		}
		if n[0] == 0 && n[2] > 0 {
			return int(n[1]), nil
		}
	}
	return -1, fmt.Errorf("label %s=%q maps no range onto container root: %w", label, value, errdefs.ErrInvalidArgument)
}
