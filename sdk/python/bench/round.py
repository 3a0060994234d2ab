"""One fork+exec+commit round per line read from stdin ("round"), through
the Python SDK; prints "ok" after each. integration/sdk_bench_test.go
times the rounds (BenchmarkSDKRound); the process stays up between them,
as an agent's would."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import branchbox  # noqa: E402


def main():
    c = branchbox.Client(socket=os.environ["BRANCHBOX_SOCKET"], namespace=os.environ["BRANCHBOX_NAMESPACE"])
    sb = c.sandbox(os.environ["BRANCHBOX_SANDBOX"])
    for line in sys.stdin:
        if line.strip() != "round":
            break
        (k,) = sb.fork(1)
        r = k.exec(["true"])
        if r.exit_code != 0:
            raise SystemExit("exec: %r" % r)
        k.commit()
        sys.stdout.write("ok\n")
        sys.stdout.flush()
    c.close()


if __name__ == "__main__":
    main()
