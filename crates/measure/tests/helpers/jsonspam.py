"""Write N JSON lines fast, alternating stdout and stderr in bursts: jsonspam.py N.

Each line is {"i": k, "stream": "out"|"err", "pad": "..."} with a pad length that
varies with k (0..2999 bytes), so lines straddle pipe buffer boundaries."""
import json
import sys


def line(k):
    stream = "err" if (k // 100) % 3 == 2 else "out"
    return stream, (json.dumps({"i": k, "stream": stream, "pad": "x" * ((k * 7919) % 3000)}) + "\n").encode()


def main():
    n = int(sys.argv[1])
    for k in range(n):
        stream, b = line(k)
        (sys.stderr.buffer if stream == "err" else sys.stdout.buffer).write(b)
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main()
