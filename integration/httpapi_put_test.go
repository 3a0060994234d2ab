//go:build linux

package integration

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestHTTPAPIPutCut: a PUT of a file whose upload is cut (the client's
// connection drops mid-body) leaves the file as it was, and makes none
// where there was none; a whole one replaces it, keeping its owner and
// mode. Before, the file was emptied first and written as the body came:
// a cut upload left the part that had come, and the old content was lost.
func TestHTTPAPIPutCut(t *testing.T) {
	ctx, env, srv, api, sb := apiSandbox(t)
	file := func(p string) string { return sb + "/branches/0/files?path=" + p }
	old := bytes.Repeat([]byte("old "), 1000)
	api.must(ctx, 200, "PUT", file("/data"), old)
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "chown 1234:5678 /data && chmod 0640 /data"); err != nil {
		t.Fatalf("chown: %s %v", out, err)
	}
	// cut sends a PUT of 100,000 bytes, 20,000 of them, and hangs up.
	cut := func(p string) {
		conn, err := net.Dial("unix", srv.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: branchbox\r\nContent-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\n", file(p))
		if _, err := conn.Write(bytes.Repeat([]byte("new "), 5000)); err != nil {
			t.Fatal(err)
		}
		// The server is writing what came when the connection drops.
		time.Sleep(300 * time.Millisecond)
	}
	cut("/data")
	if got := api.must(ctx, 200, "GET", file("/data"), nil).Body; !bytes.Equal(got, old) {
		t.Fatalf("after a cut upload the file holds %d bytes (%.20q...), want the old %d", len(got), got, len(old))
	}
	cut("/fresh")
	api.fails(ctx, 404, "not-found", "GET", file("/fresh"), nil)

	api.must(ctx, 200, "PUT", file("/data"), []byte("new\n"))
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "stat -c '%u:%g %a' /data; cat /data"); err != nil || out != "1234:5678 640\nnew\n" {
		t.Fatalf("after a whole upload: %q %v", out, err)
	}
	// A file of the image's layer, replaced in the rootfs's upper.
	api.must(ctx, 200, "PUT", file("/etc/group"), []byte("root:x:0:\nwheel:x:10:\n"))
	if out, err := execIn(ctx, env, "sb", "sh", "-c", "stat -c '%u:%g %a' /etc/group; grep -c : /etc/group"); err != nil || out != "0:0 644\n2\n" {
		t.Fatalf("the image's /etc/group after an upload: %q %v", out, err)
	}
	if out, err := execIn(ctx, env, "sb", "ls", "-a", "/", "/etc"); err != nil || strings.Contains(out, ".bbx") {
		t.Fatalf("the root after the uploads: %q %v", out, err)
	}
}
