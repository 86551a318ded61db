"""Print one line, then stay silent: idle.py SECONDS."""
import sys
import time

print("hello", flush=True)
time.sleep(float(sys.argv[1]))
