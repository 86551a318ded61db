"""Allocate and touch memory in steps: alloc.py STEP_MIB MAX_MIB. Prints one line per step, then sleeps."""
import sys
import time

step, limit = int(sys.argv[1]), int(sys.argv[2])
blocks = []
for i in range(limit // step):
    b = bytearray(step << 20)
    for off in range(0, len(b), 4096):  # touch every page so it is resident
        b[off] = 1
    blocks.append(b)
    print(f"allocated {(i + 1) * step} MiB", flush=True)
    time.sleep(0.05)
time.sleep(30)
