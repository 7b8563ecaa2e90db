"""Run every benchmark script in bench/ (``bench_*.py``), one after another, printing their figures.

``make bench`` calls this; ``make bench BENCH_ARGS="admission"`` runs only the scripts whose name
contains one of the given words. Each script is run in its own process with this interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    scripts = sorted(here.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if any(word in s.stem for word in argv)]
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), env.get("PYTHONPATH", "")])
    failed = []
    for script in scripts:
        print(f"\n===== {script.name} =====", flush=True)
        if subprocess.call([sys.executable, str(script)], env=env) != 0:
            failed.append(script.name)
    if failed:
        print(f"\nbenchmarks that failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
