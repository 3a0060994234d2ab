//go:build linux

package main

import (
	"bytes"
	"testing"

	"github.com/sirupsen/logrus"
)

// TestQuietFormatter: ttrpc's late-reply error is dropped unless the level
// is debug; every other line is written.
func TestQuietFormatter(t *testing.T) {
	var out bytes.Buffer
	l := logrus.New()
	l.SetOutput(&out)
	l.SetFormatter(quietFormatter{&logrus.TextFormatter{DisableTimestamp: true}})
	l.WithField("stream", 3).Error(ttrpcLateReply)
	if out.Len() != 0 {
		t.Fatalf("written at info: %q", out.String())
	}
	l.Error("something else")
	if !bytes.Contains(out.Bytes(), []byte("something else")) {
		t.Fatalf("another error dropped: %q", out.String())
	}
	out.Reset()
	l.SetLevel(logrus.DebugLevel)
	l.WithField("stream", 3).Error(ttrpcLateReply)
	if !bytes.Contains(out.Bytes(), []byte("inactive stream")) {
		t.Fatalf("dropped at debug: %q", out.String())
	}
}
