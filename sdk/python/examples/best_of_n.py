#!/usr/bin/env python3
"""Best of N with branchbox: a sandbox whose test fails is forked into 4
branches, each tries a fix and runs the test, and the first whose test
passes is committed into the sandbox (its siblings are invalidated).

    python3 examples/best_of_n.py --image docker.io/branchbox/busybox:test
    python3 examples/best_of_n.py --url https://node:8443 --token $TOKEN --namespace agents --image IMAGE

It makes its own sandbox and removes it at the end.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import branchbox  # noqa: E402

# The project: a calculator with an off-by-one bug, and its test.
CALC = 'echo $(( $1 + $2 + 1 ))\n'
TEST = '[ "$(sh /calc.sh 2 3)" = 5 ]\n'
# Four candidate fixes; only one is right.
FIXES = ["+ 2", "- 2", "+ 0", "* 1 + 1"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", default=os.environ.get("BRANCHBOX_SOCKET"))
    ap.add_argument("--url", default=os.environ.get("BRANCHBOX_URL"))
    ap.add_argument("--token", default=os.environ.get("BRANCHBOX_TOKEN"))
    ap.add_argument("--namespace", default=os.environ.get("BRANCHBOX_NAMESPACE", "default"))
    ap.add_argument("--image", default=os.environ.get("BRANCHBOX_IMAGE", "docker.io/branchbox/busybox:test"))
    ap.add_argument("--sandbox", default="best-of-n-py")
    a = ap.parse_args()

    # A socket given wins over a URL (from the environment, say).
    url = None if a.socket else a.url
    c = branchbox.Client(url=url, socket=a.socket, token=a.token, namespace=a.namespace)
    sb = c.create_sandbox(a.sandbox, a.image, args=["sleep", "1000000"])
    try:
        sb.root.write_file("/calc.sh", CALC)
        sb.root.write_file("/test.sh", TEST)
        print("before:", sb.root.exec(["sh", "/test.sh"]).exit_code, "(the test fails)")

        attempts = [["sh", "-c", "echo 'echo $(( $1 + $2 %s ))' > /calc.sh" % f] for f in FIXES]
        start = time.monotonic()
        winner, results = branchbox.best_of_n(sb, attempts, ["sh", "/test.sh"])
        took = time.monotonic() - start
        for i, r in enumerate(results):
            if r is None:
                what = "-"
            elif r.exit_code == 137:
                what = "killed (SIGKILL): a sibling committed first"
            else:
                what = "exit %d" % r.exit_code
            print("attempt %d: fix %-9r test %s" % (i, FIXES[i], what))
        if winner is None:
            print("no fix passed")
            return 1
        print("committed branch %s in %.0f ms" % (winner.id, took * 1000))
        print("after:", sb.root.exec(["sh", "/test.sh"]).exit_code, sb.root.read_file("/calc.sh").decode().strip())
        return 0
    finally:
        sb.remove()


if __name__ == "__main__":
    sys.exit(main())
