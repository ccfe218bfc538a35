"""How long a bare ``import unifiedamp`` takes, against the interpreter starting with no import.

Run: python benchmarks/bench_import.py [--repeats R]

Each run is a fresh interpreter, ``python -X importtime -c "import unifiedamp"``, whose
cumulative time for ``unifiedamp`` is read from its report (the package and every module
it imports that the interpreter had not, standard library included). The bytecode is
written once, beforehand, into a temporary folder (``PYTHONPYCACHEPREFIX``) that every run
reads, as an installed package's is: with ``PYTHONDONTWRITEBYTECODE=1`` and no bytecode,
each run would compile the sources again and take about twice as long. Prints the minimum
and the median over the runs, and the same for ``import numbers`` (a small standard-library
module) as the machine's yardstick. The target is under 15 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile


def cumulative_us(module: str, env: dict[str, str]) -> int:
    """The cumulative microseconds ``-X importtime`` reports for ``module``'s import."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"],
                          env=env, capture_output=True, text=True, check=True)
    for line in proc.stderr.splitlines():
        fields = [f.strip() for f in line.removeprefix("import time:").split("|")]
        if len(fields) == 3 and fields[2] == module:
            return int(fields[1])
    raise RuntimeError(f"-X importtime printed no line for {module}:\n{proc.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as prefix:
        env = {**os.environ, "PYTHONPYCACHEPREFIX": prefix}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        subprocess.run([sys.executable, "-c", "import unifiedamp"], env=env, check=True)
        times: dict[str, list[int]] = {"unifiedamp": [], "numbers": []}
        for _ in range(args.repeats):
            for module, found in times.items():
                found.append(cumulative_us(module, env))
    print(f"python {sys.version.split()[0]}; bytecode cached; {args.repeats} fresh "
          f"interpreters each")
    for module, found in times.items():
        print(f"  import {module:12s} min {min(found) / 1e3:6.2f} ms   "
              f"median {statistics.median(found) / 1e3:6.2f} ms")
    best = min(times["unifiedamp"]) / 1e3
    print(f"  target: under 15 ms: {'met' if best < 15 else 'missed'} ({best:.2f} ms)")


if __name__ == "__main__":
    main()
