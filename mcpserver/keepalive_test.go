package mcpserver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// An event stream idle for the interval gets comments between its events,
// never inside one; another response gets none.
func TestKeepAlive(t *testing.T) {
	h := KeepAlive(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/json" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, "{}")
			time.Sleep(300 * time.Millisecond) // idle after its end
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		time.Sleep(300 * time.Millisecond) // before the first event: headers withheld
		_, _ = io.WriteString(w, "event: message\ndata: 1\n\n")
		time.Sleep(300 * time.Millisecond)
		_, _ = io.WriteString(w, "event: message\ndata: 2\n\n")
	}), 50*time.Millisecond)
	srv := httptest.NewServer(h)
	defer srv.Close()

	get := func(path string) string {
		t.Helper()
		req, err := http.NewRequest("POST", srv.URL+path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Accept", "application/json, text/event-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	body := get("/sse")
	events := strings.Split(strings.TrimSuffix(body, "\n\n"), "\n\n")
	var comments, data []string
	for _, e := range events {
		if e == ": keepalive" {
			comments = append(comments, e)
		} else {
			data = append(data, e)
		}
	}
	if len(comments) < 4 || strings.Join(data, "|") != "event: message\ndata: 1|event: message\ndata: 2" {
		t.Fatalf("event stream:\n%q", body)
	}
	if !strings.HasPrefix(body, ": keepalive\n\n") {
		t.Fatalf("no comment before the first event: %q", body)
	}
	// The SDK's answer of JSON, at once: as it wrote it.
	if body := get("/json"); body != "{}" {
		t.Fatalf("a JSON response was written to: %q", body)
	}
	// 0: none.
	if KeepAlive(plain{}, 0) != (plain{}) {
		t.Fatal("KeepAlive with 0 wrapped the handler")
	}
}

type plain struct{}

func (plain) ServeHTTP(http.ResponseWriter, *http.Request) {}
