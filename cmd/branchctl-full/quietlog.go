//go:build linux

package main

import "github.com/sirupsen/logrus"

// ttrpcLateReply is what ttrpc's client logs, as an error, when a reply
// comes for a call whose caller gave up (containerd/ttrpc client.go).
const ttrpcLateReply = "ttrpc: received message on inactive stream"

// quietFormatter drops ttrpcLateReply below the debug level. The servers
// give up on calls as a matter of course (an exec's wait ended by its
// timeout, or by a client that left or cancelled its MCP call), and an
// error line on their stderr each time, which an MCP client shows as the
// server's, would say something went wrong when nothing did.
type quietFormatter struct{ logrus.Formatter }

func (f quietFormatter) Format(e *logrus.Entry) ([]byte, error) {
	if e.Message == ttrpcLateReply && (e.Logger == nil || !e.Logger.IsLevelEnabled(logrus.DebugLevel)) {
		return nil, nil
	}
	return f.Formatter.Format(e)
}

// quietLogs installs quietFormatter on the logger containerd's log package
// writes to, for the life of a server command.
func quietLogs() {
	l := logrus.StandardLogger()
	if _, ok := l.Formatter.(quietFormatter); !ok {
		l.SetFormatter(quietFormatter{l.Formatter})
	}
}
