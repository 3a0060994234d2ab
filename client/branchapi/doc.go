// Package branchapi is the client of the snapshotter's branch API (fork,
// commit, abort, tree, mounts, checkpoints of snapshots), over ttrpc where
// the snapshotter serves it beside its socket, else gRPC. The shim calls
// the snapshotter through it; users normally go through package client.
package branchapi
