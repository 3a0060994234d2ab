//go:build linux

package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
)

// restoreBound is how long a restore from a memory image of size bytes may
// take before its CRIU is killed: a damaged image can leave CRIU's restored
// task spinning and the restore never ending, with the sandbox's lock held
// and its processes (for a rollback) already gone. Restores measured here
// take 30-330 ms (docs/benchmarks.md); the bound is far above, and grows
// with the image as its copy does.
func restoreBound(size int64) time.Duration {
	return 20*time.Second + time.Duration(size/(50<<20))*time.Second
}

// restoreLogBound bounds the log of a restore: the spinning task of a
// damaged image logs each of its turns (1.5 GB in 20 s here), into the
// sandbox's bundle, where a restore's log is 0.1-1 MB.
const restoreLogBound = 128 << 20

// restoreWatch kills the CRIU working in bundle if the restore runs past
// restoreBound(size) or its log (logPath) past restoreLogBound; done ends
// the watch and says, as an error to wrap into the restore's, whether it
// fired (nil if not).
func restoreWatch(ctx context.Context, bundle, logPath string, size int64) (done func() error) {
	bound := restoreBound(size)
	stop, ended := make(chan struct{}), make(chan string, 1)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		deadline := time.Now().Add(bound)
		for {
			select {
			case <-stop:
				ended <- ""
				return
			case now := <-tick.C:
				why := ""
				if now.After(deadline) {
					why = fmt.Sprintf("did not end within %s", bound)
				} else if fi, err := os.Stat(logPath); err == nil && fi.Size() > restoreLogBound {
					why = fmt.Sprintf("logged over %d MB without ending", restoreLogBound>>20)
				}
				if why != "" {
					log.G(ctx).WithField("bundle", bundle).Errorf("a restore from a memory image %s: killing its CRIU", why)
					killCriuOf(ctx, bundle)
					<-stop
					ended <- why
					return
				}
			}
		}
	}()
	return func() error {
		close(stop)
		if why := <-ended; why != "" {
			return fmt.Errorf("the restore %s, and CRIU was killed (its image damaged?): %w", why, errdefs.ErrDataLoss)
		}
		return nil
	}
}

// watchRestore runs start, a restore from a memory image of size bytes
// whose CRIU works for bundle and logs to logPath, under restoreWatch: a
// restore the watch ended fails saying so.
func watchRestore(ctx context.Context, bundle, logPath string, size int64, start func() error) error {
	done := restoreWatch(ctx, bundle, logPath, size)
	err := start()
	if werr := done(); werr != nil && err != nil {
		err = fmt.Errorf("%w: %v", werr, err)
	}
	return err
}
