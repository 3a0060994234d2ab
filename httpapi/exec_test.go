//go:build linux

package httpapi

import (
	"bufio"
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// TestStreamWriterUTF8: a character split between writes is sent whole;
// bytes that are not UTF-8 become one replacement character a run.
func TestStreamWriterUTF8(t *testing.T) {
	rec := httptest.NewRecorder()
	out := newNDJSON(rec)
	out.begin()
	w := &streamWriter{out: out}
	for _, p := range [][]byte{[]byte("a\xc3"), []byte("\xa9b\xe2\x82"), []byte("\xacc"), []byte("\xff\xfed\xf0\x9f")} {
		if _, err := w.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	w.flush()
	var got string
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		var ev ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Stdout == nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got += *ev.Stdout
	}
	if want := "aéb€c\uFFFDd\uFFFD"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
