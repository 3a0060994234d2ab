//go:build linux

package snapshotter

import (
	"context"
	"errors"
	"os"
	"sync"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// dbRoomBytes is how much disk the branch database keeps allocated beyond
// its end: room for a few hundred transactions of branch records.
const dbRoomBytes = 1 << 20

// dbRoom keeps disk blocks allocated beyond the end of the branch
// database, so that the operations that free space (an abort, a
// checkpoint's delete) can still be recorded when its filesystem is full.
// bolt grows its file with plain writes past its end (NoGrowSync), each of
// which needs new blocks: on a full disk, an abort failed to record itself
// with "no space left on device", and the branch whose writes had filled
// the disk could not be discarded.
type dbRoom struct {
	path string
	mu   sync.Mutex
	end  int64 // blocks are allocated up to here
	off  bool  // the filesystem cannot preallocate
}

// keep allocates up to size+dbRoomBytes once less than half of the room is
// left beyond size, the database's size. A full disk leaves what room is
// left, to be tried again at the next transaction.
func (r *dbRoom) keep(ctx context.Context, size int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.off || size+dbRoomBytes/2 <= r.end {
		return
	}
	f, err := os.OpenFile(r.path, os.O_WRONLY, 0)
	if err != nil {
		log.G(ctx).WithError(err).Warn("open the branch database to keep room beyond its end")
		return
	}
	defer f.Close()
	// KEEP_SIZE: bolt reads the file's size as its own; the blocks past it
	// are used by its next writes there.
	err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, size+dbRoomBytes)
	switch {
	case err == nil:
		r.end = size + dbRoomBytes
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS):
		r.off = true
	case !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT):
		log.G(ctx).WithError(err).Warn("keep room beyond the end of the branch database")
	}
}
