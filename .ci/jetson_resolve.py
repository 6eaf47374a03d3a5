"""Check that requirements/jetson.txt resolves, wheels only, for a Jetson with JetPack 6.

JetPack 6 is Ubuntu 22.04 on aarch64 with CPython 3.10 and glibc 2.35. pip's resolver is asked
for exactly that target (pip download's resolution; --dry-run --report fetches metadata, not the
wheels): every requirement and dependency must have a cp310/abi3/pure wheel for
manylinux_2_17..2_35 aarch64, and numpy must stay below 2 (Humble's message packages are built
against numpy 1.x).

    python .ci/jetson_resolve.py [requirements/jetson.txt]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

GLIBC_MINORS = range(35, 16, -1)  # JetPack 6: glibc 2.35; pip does not expand older tags itself


def main(argv: list[str]) -> int:
    reqs = Path(argv[1] if len(argv) > 1 else "requirements/jetson.txt")
    platforms = [f"manylinux_2_{m}_aarch64" for m in GLIBC_MINORS] + ["manylinux2014_aarch64"]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
               "--ignore-installed", "--only-binary=:all:", "--python-version", "3.10",
               "--implementation", "cp", "--abi", "cp310", "--abi", "abi3", "--abi", "none",
               *[f"--platform={p}" for p in platforms], "--target", str(Path(tmp) / "t"),
               "--report", str(report), "-r", str(reqs)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(f"{reqs} does not resolve for cp310/aarch64:\n{done.stderr}")
            return 1
        installed = {i["metadata"]["name"].lower(): i for i in
                     json.loads(report.read_text())["install"]}
    problems = []
    numpy = installed.get("numpy")
    if numpy is None or int(numpy["metadata"]["version"].split(".")[0]) >= 2:
        problems.append(f"numpy must resolve below 2, got "
                        f"{numpy['metadata']['version'] if numpy else 'none'}")
    for name, item in sorted(installed.items()):
        wheel = item["download_info"]["url"].rsplit("/", 1)[-1]
        if not wheel.endswith(".whl") or not any(
                tag in wheel for tag in ("-cp310-", "-abi3-", "-none-any", "py3-none")):
            problems.append(f"{name}: {wheel} is not a CPython 3.10 wheel")
    for line in problems:
        sys.stderr.write(f"{reqs}: {line}\n")
    if not problems:
        sys.stdout.write(f"{reqs}: {len(installed)} packages resolve to cp310/aarch64 wheels, "
                         f"numpy {numpy['metadata']['version']}\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
