//go:build linux

package ocirt

// CRIU says why it failed in its log, not in its reply: the reply carries
// its first error, which on a node without CAP_SYS_RESOURCE is always its
// failure to raise its own RLIMIT_NOFILE, logged on every run and not
// fatal. A dump's or restore's error names the log's last errors instead.

import (
	"errors"
	"io"
	"os"
	"strings"
)

// CriuLogMarker starts what CriuLogErrors adds to an error message.
const CriuLogMarker = " (criu: "

// CriuLogErrors is what CRIU's log at path says went wrong, to add to an
// error message: its last Error lines, and its last lines, which say which
// step failed where no Error line does (a dump failed by a check prints
// none); "" without a log. It reads the log's last MB: a runaway restore's
// log runs to GBs.
func CriuLogErrors(path string) string {
	b, err := readTail(path, 1<<20)
	if err != nil || len(b) == 0 {
		return ""
	}
	var errs []string
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, "Error ("); i >= 0 && !strings.Contains(l, "RLIMIT_NOFILE") {
			errs = append(errs, strings.TrimSpace(l[i:]))
		}
	}
	if len(errs) > 4 {
		errs = errs[len(errs)-4:]
	}
	var tail []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			tail = append(tail, l)
		}
	}
	if len(tail) > 6 {
		tail = tail[len(tail)-6:]
	}
	return CriuLogMarker + strings.Join(errs, "; ") + "; log ends: " + strings.Join(tail, " | ") + ")"
}

// readTail reads at most the last max bytes of a file.
func readTail(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	off := fi.Size() - max
	if off < 0 {
		off = 0
	}
	b := make([]byte, fi.Size()-off)
	n, err := f.ReadAt(b, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return b[:n], nil
}
