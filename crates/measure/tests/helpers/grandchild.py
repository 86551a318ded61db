"""Start two grandchildren that sleep: one in our process group, one escaped into a
new session (setsid). Print both pids, then stay silent: grandchild.py."""
import subprocess
import sys
import time

sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
same = subprocess.Popen(sleeper)
escaped = subprocess.Popen(sleeper, start_new_session=True)
print(f"pids {same.pid} {escaped.pid}", flush=True)
time.sleep(60)
