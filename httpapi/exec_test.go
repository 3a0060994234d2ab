//go:build linux

package httpapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"
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

// TestKeepAlive: a stream without output gets a running line every
// interval, the seconds growing; output puts the next one off; none comes
// after stop (the exit status is the last line).
func TestKeepAlive(t *testing.T) {
	rec := httptest.NewRecorder()
	out := newNDJSON(rec)
	out.begin()
	start := time.Now()
	stop := out.keepAlive(20*time.Millisecond, func() any {
		s := time.Since(start).Seconds()
		return ExecEvent{Running: &s}
	})
	time.Sleep(70 * time.Millisecond)
	text := "x"
	_ = out.send(ExecEvent{Stdout: &text})
	time.Sleep(50 * time.Millisecond)
	stop()
	stop() // again: nothing more
	n := rec.Body.Len()
	time.Sleep(50 * time.Millisecond)
	if rec.Body.Len() != n {
		t.Fatal("a line after stop")
	}
	var running []float64
	sawOutput := false
	sc := bufio.NewScanner(bytes.NewReader(rec.Body.Bytes()))
	for sc.Scan() {
		var ev ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch {
		case ev.Running != nil:
			if len(running) > 0 && *ev.Running <= running[len(running)-1] {
				t.Fatalf("running %v after %v", *ev.Running, running)
			}
			if *ev.Running < 0.02 {
				t.Fatalf("running %v before the interval", *ev.Running)
			}
			running = append(running, *ev.Running)
		case ev.Stdout != nil:
			sawOutput = true
		default:
			t.Fatalf("line %q", sc.Text())
		}
	}
	if !sawOutput || len(running) < 3 {
		t.Fatalf("output %v, running lines %v", sawOutput, running)
	}
	if out.keepAlive(0, nil)(); rec.Body.Len() != n {
		t.Fatal("keepAlive(0) sent something")
	}
}
