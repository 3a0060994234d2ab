//go:build linux

package integration

import (
	"encoding/json"
	"sync"
	"testing"
)

// TestHTTPAPICommitRace: siblings committed at once through the HTTP API,
// each in its own request from its own client: exactly one wins, and every
// other is refused as stale, naming that winner, as through the Go client.
func TestHTTPAPICommitRace(t *testing.T) {
	ctx, _, srv, api, sb := apiSandbox(t)
	const n = 8
	var kids apiBranches
	api.must(ctx, 200, "POST", sb+"/fork", map[string]any{"count": n}).decode(t, &kids)
	for _, k := range kids.Branches {
		api.must(ctx, 200, "PUT", sb+"/branches/"+k.ID+"/files?path=/who", []byte(k.ID))
	}
	results := make([]apiResult, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, k := range kids.Branches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := newUnixAPI(t, srv) // a connection of its own
			<-start
			results[i] = c.do(ctx, "POST", sb+"/branches/"+k.ID+"/commit", nil, true)
		}()
	}
	close(start)
	wg.Wait()
	winner := ""
	for i, r := range results {
		if r.Status == 200 {
			if winner != "" {
				t.Fatalf("two commits won: %s and %s", winner, kids.Branches[i].ID)
			}
			winner = kids.Branches[i].ID
		}
	}
	if winner == "" {
		t.Fatalf("no commit won: %+v", results)
	}
	for i, r := range results {
		if kids.Branches[i].ID == winner {
			continue
		}
		var e struct {
			Error struct{ Kind, Message string }
		}
		if err := json.Unmarshal(r.Body, &e); err != nil || r.Status != 409 || e.Error.Kind != "stale" {
			t.Fatalf("branch %s: %d %s", kids.Branches[i].ID, r.Status, r.Body)
		}
	}
	if r := api.must(ctx, 200, "GET", sb+"/branches/0/files?path=/who", nil); string(r.Body) != winner {
		t.Fatalf("the sandbox has %q, the winner was %s", r.Body, winner)
	}
}
