"""Write long lines without newlines in uneven pieces: longline.py SEED.

Writes a 3 MiB + 123 byte line, a newline, a short line, then 1 MiB + 7 bytes
with no final newline. The exact bytes are reproducible from SEED (see expected())."""
import random
import sys


def expected(seed):
    rng = random.Random(seed)
    first = bytes(97 + b % 26 for b in rng.randbytes((3 << 20) + 123))
    last = bytes(65 + b % 26 for b in rng.randbytes((1 << 20) + 7))
    return first + b"\nshort line\n" + last


def main():
    data = expected(int(sys.argv[1]))
    rng = random.Random(7)
    out = sys.stdout.buffer
    i = 0
    while i < len(data):
        n = rng.randrange(1, 200_000)
        out.write(data[i : i + n])
        out.flush()
        i += n


if __name__ == "__main__":
    main()
