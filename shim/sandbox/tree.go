//go:build linux

package sandbox

import (
	"context"
	"sort"

	shimv1 "github.com/branchbox/branchbox/api/shim/v1"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/branchbox/branchbox/branch"
	"github.com/branchbox/branchbox/shim/cgroup"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Tree lists every branch of a sandbox: the snapshotter's tree (states,
// epochs, upper sizes, ended branches) with what this shim runs.
func (c *Service) Tree(ctx context.Context, req *shimv1.TreeRequest) (_ *shimv1.TreeResponse, retErr error) {
	defer func() { retErr = toTTRPC(retErr) }()
	sb, err := c.Sandbox(req.Sandbox)
	if err != nil {
		return nil, err
	}
	ctx = withNS(ctx, sb)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err := c.view(ctx, sb); err != nil {
		return nil, err
	}
	infos, err := sb.snapshot.Tree(ctx, sb.root())
	if err != nil {
		return nil, err
	}
	paused := c.Paused(sb)
	resp := &shimv1.TreeResponse{}
	for i := range infos {
		n := sb.nodes[infos[i].ID]
		if n == nil {
			n = &Branch{id: infos[i].ID, parent: infos[i].Parent}
		}
		resp.Nodes = append(resp.Nodes, c.describe(sb, n, &infos[i], true))
	}
	if root := sb.nodes[branch.RootID]; root != nil {
		if pid, err := c.initPid(ctx, sb, root); err == nil {
			for _, d := range resp.Nodes {
				if d.Id == branch.RootID {
					d.InitPid, d.Status = uint32(pid), "running"
				}
			}
		}
	}
	if paused {
		// Frozen with the sandbox: every branch whose processes run.
		for _, d := range resp.Nodes {
			if d.Status != "" && d.Status != "exited" {
				d.Status = StatusPaused
			}
		}
	}
	return resp, nil
}

// describe is a branch as the API reports it. Without readProcs, its
// processes are not read from its cgroup: a branch just started without a
// command has its init alone, and has had no OOM kill.
func (c *Service) describe(sb *Sandbox, n *Branch, info *branch.Info, readProcs bool) *shimv1.Branch {
	d := &shimv1.Branch{Id: n.id, Parent: n.parent, Net: n.net, Seal: n.seal, Cgroup: n.cgroup, Memory: n.memory}
	if info != nil {
		d.Parent = info.Parent
		d.State = string(info.State)
		d.Epoch, d.ForkEpoch = info.Epoch, info.ForkEpoch
		d.Winner, d.WinnerEpoch = info.Winner, info.WinnerEpoch
		d.UpperSize, d.UpperInodes = info.UpperSize, info.UpperInodes
		d.Sealed, d.Children = info.Sealed, info.Children
		d.Quarantine = info.Quarantine
		if !info.Created.IsZero() {
			d.Created = timestamppb.New(info.Created)
		}
		if !info.Ended.IsZero() {
			d.Ended = timestamppb.New(info.Ended)
		}
	}
	if n.spec != nil {
		d.Limits = limitsOf(n.spec)
	}
	procs := n.procs()
	if !readProcs && procs != nil {
		d.Pids = []uint32{uint32(procs.Pid())}
	} else if n.cgroup != "" && (procs != nil || n.id == branch.RootID) {
		c.readCgroup(d, n.cgroup)
	}
	if procs != nil {
		d.InitPid = uint32(procs.Pid())
		if n.state.has(exited) {
			if p, err := procs.Process(""); err == nil {
				d.ExitStatus = int32(p.ExitStatus())
			}
		}
	}
	d.Status = n.status()
	return d
}

// readCgroup reports the processes of the cgroup cg, read on one
// hierarchy, and whether the OOM killer killed one there.
func (c *Service) readCgroup(d *shimv1.Branch, cg string) {
	ms, err := c.cgroups.Mounts()
	if err != nil {
		return
	}
	dirs := cgroup.ReadDirs(ms, cg)
	pids := cgroup.PidsIn(cgroup.OneHierarchy(dirs))
	sort.Ints(pids)
	for _, p := range pids {
		d.Pids = append(d.Pids, uint32(p))
	}
	d.OomKilled = cgroup.OOMKillsIn(dirs) > 0
}

// status is the branch's processes in a word, as the tree reports them:
// waiting (its init waits for an exec), running (its command, or
// processes restored from memory), exited, or frozen (sealed with its
// processes frozen, or held for a commit); "" for the sandbox, whose
// task says.
func (n *Branch) status() string {
	s := ""
	if n.procs() != nil {
		switch {
		case n.state.has(exited):
			s = "exited"
		case n.hasCommand || n.memory:
			s = "running"
		default:
			s = "waiting"
		}
	}
	if n.state.has(sealFrozen | held) {
		s = "frozen"
	}
	return s
}

// limitsOf reads the limits a spec sets, for reporting.
func limitsOf(s *specs.Spec) *shimv1.Limits {
	l := &shimv1.Limits{}
	if s == nil || s.Linux == nil || s.Linux.Resources == nil {
		return l
	}
	r := s.Linux.Resources
	if r.Memory != nil && r.Memory.Limit != nil {
		l.Memory = *r.Memory.Limit
	}
	if r.CPU != nil && r.CPU.Quota != nil && r.CPU.Period != nil && *r.CPU.Period > 0 && *r.CPU.Quota > 0 {
		l.Cpus = float64(*r.CPU.Quota) / float64(*r.CPU.Period)
	}
	if r.Pids != nil && r.Pids.Limit != nil {
		l.Pids = *r.Pids.Limit
	}
	return l
}
