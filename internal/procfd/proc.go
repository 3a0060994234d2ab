//go:build linux

package procfd

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/sys/mountinfo"
)

// Mountinfo is the mounts of pid's mount namespace, as pid sees them.
func Mountinfo(pid int) ([]*mountinfo.Info, error) {
	name := "/proc/" + strconv.Itoa(pid) + "/mountinfo"
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	infos, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return infos, nil
}

// Tree is pid and its descendants, found from each thread's children;
// visit, if not nil, is called on each process as it is found and ends
// the walk when it returns false (Tree then returns nil).
func Tree(pid int, visit func(pid int) bool) map[int]bool {
	tree := map[int]bool{}
	todo := []int{pid}
	for len(todo) > 0 {
		p := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if tree[p] {
			continue
		}
		tree[p] = true
		if visit != nil && !visit(p) {
			return nil
		}
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", p))
		for _, t := range tasks {
			b, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					todo = append(todo, c)
				}
			}
		}
	}
	return tree
}
