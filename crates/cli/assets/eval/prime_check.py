# Checks an extracted `is_prime(n)` answer for `ds4-server eval` (docs/eval.md).
#
# Usage: python3 -I prime_check.py ANSWER.py LOW HIGH MEMORY_MB CPU_SECONDS
#
# Runs inside the sandbox the caller sets up (a subprocess with a wall-clock timeout
# and, where available, no network namespace); this script adds its own limits before
# the answer's code runs: an address-space limit, a CPU-time limit, no new processes,
# and a socket module whose connections fail. The answer's own output goes to stderr.
# The last line on stdout starting with RESULT_TAG is the result as JSON:
#   {"extracted": true, "passed": P, "total": T,
#    "first_counterexample": {"n": N, "expected": E, "got": G} | null, "error": null | "..."}
# A case passes when the function's return value == the expected bool (so 1/0 pass,
# None does not); an exception is a failed case whose "got" names the exception.

import json
import resource
import sys

RESULT_TAG = "DS4-PRIME-CHECK "


def truth_table(low, high):
    """Primality of every integer in [low, high] by a sieve (independent of the answer)."""
    top = max(high, 2)
    sieve = [True] * (top + 1)
    sieve[0] = sieve[1] = False
    for p in range(2, int(top**0.5) + 1):
        if sieve[p]:
            for m in range(p * p, top + 1, p):
                sieve[m] = False
    return {n: (n >= 2 and sieve[n]) for n in range(low, high + 1)}


def block_network():
    import socket

    class NoNetwork(socket.socket):
        def connect(self, *a, **k):
            raise OSError("network access is disabled in the is_prime check")

        connect_ex = connect
        bind = connect
        sendto = connect

    def refuse(*a, **k):
        raise OSError("network access is disabled in the is_prime check")

    socket.socket = NoNetwork
    socket.create_connection = refuse
    socket.getaddrinfo = refuse


def limit(memory_mb, cpu_s):
    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    except (ValueError, OSError):
        pass


def main():
    answer_path, low, high, memory_mb, cpu_s = sys.argv[1:6]
    low, high, memory_mb, cpu_s = int(low), int(high), int(memory_mb), int(cpu_s)
    out = sys.stdout
    result = {
        "extracted": True,
        "passed": 0,
        "total": high - low + 1,
        "first_counterexample": None,
        "error": None,
    }
    truth = truth_table(low, high)
    with open(answer_path, encoding="utf-8") as f:
        source = f.read()
    block_network()
    limit(memory_mb, cpu_s)
    sys.stdout = sys.stderr
    namespace = {"__name__": "answer"}
    try:
        exec(compile(source, "answer.py", "exec"), namespace)
    except BaseException as e:  # noqa: BLE001 - any failure of the answer is reported
        result["error"] = "the answer did not run: %s: %s" % (type(e).__name__, e)
        result["passed"] = 0
        out.write(RESULT_TAG + json.dumps(result) + "\n")
        return
    fn = namespace.get("is_prime")
    if not callable(fn):
        result["error"] = "the answer defines no function is_prime"
        out.write(RESULT_TAG + json.dumps(result) + "\n")
        return
    passed = 0
    first = None
    for n in range(low, high + 1):
        expected = truth[n]
        try:
            got = fn(n)
            ok = got == expected
            shown = repr(got)
        except BaseException as e:  # noqa: BLE001
            ok = False
            shown = "raised %s: %s" % (type(e).__name__, e)
        if ok is True:
            passed += 1
        elif first is None:
            first = {"n": n, "expected": expected, "got": shown[:200]}
    result["passed"] = passed
    result["first_counterexample"] = first
    out.write(RESULT_TAG + json.dumps(result) + "\n")


main()
