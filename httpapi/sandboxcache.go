//go:build linux

package httpapi

import (
	"context"
	"sync"

	"github.com/branchbox/branchbox/client"
)

// maxCached bounds the connections kept; past it, a request dials its own.
const maxCached = 256

// sandboxCache keeps a connection to each sandbox's shim between requests:
// resolving a name through containerd and dialing the shim on every
// request would cost more than the fork or commit it carries. An entry
// goes when its connection ends (the shim exited: the sandbox is gone or
// was made anew) or the sandbox is removed through the API. A name keeps
// the sandbox it was resolved to while that sandbox lives, as a
// connection a Go program holds would.
type sandboxCache struct {
	address string

	mu sync.Mutex
	m  map[cacheKey]cached
}

type cacheKey struct{ ns, name string }

type cached struct {
	sc   *client.SandboxClient
	done <-chan struct{}
}

func newSandboxCache(address string) *sandboxCache {
	return &sandboxCache{address: address, m: map[cacheKey]cached{}}
}

// get returns a client of the sandbox name names in ns, and what to call
// when done with it.
func (c *sandboxCache) get(ctx context.Context, ns, name string) (*client.SandboxClient, func(), error) {
	k := cacheKey{ns, name}
	c.mu.Lock()
	e, ok := c.m[k]
	c.mu.Unlock()
	if ok {
		select {
		case <-e.done:
			// Its shim is gone; the watcher below has not caught up.
		default:
			return e.sc, func() {}, nil
		}
	}
	sc, err := client.NewSandboxClient(ctx, c.address, ns, name)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if other, ok := c.m[k]; ok && other.sc != e.sc {
		// Another request dialed it meanwhile.
		sc.Close()
		return other.sc, func() {}, nil
	}
	if len(c.m) >= maxCached {
		return sc, func() { sc.Close() }, nil
	}
	done := sc.Done()
	c.m[k] = cached{sc: sc, done: done}
	go func() {
		<-done
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.m[k].sc == sc {
			delete(c.m, k)
		}
	}()
	return sc, func() {}, nil
}

// forget closes the connections to sandbox id of ns, by whatever name.
func (c *sandboxCache) forget(ns, id string) {
	c.drop(func(k cacheKey, e cached) bool { return k.ns == ns && e.sc.ID == id })
}

func (c *sandboxCache) close() {
	c.drop(func(cacheKey, cached) bool { return true })
}

// drop removes the clients that match and closes them, outside the lock:
// a Close waits for what calls whose callers left still undo.
func (c *sandboxCache) drop(match func(cacheKey, cached) bool) {
	var gone []*client.SandboxClient
	c.mu.Lock()
	for k, e := range c.m {
		if match(k, e) {
			gone = append(gone, e.sc)
			delete(c.m, k)
		}
	}
	c.mu.Unlock()
	for _, sc := range gone {
		sc.Close()
	}
}
