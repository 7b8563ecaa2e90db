"""Print the requirements of the installed LiteLLM's ``[proxy]`` extra, as pip requirement lines.

Why: from LiteLLM 1.109 the ``[proxy]`` extra requires ``litellm-proxy``, which not every package index
carries (this project's does not), and pins a ``litellm-enterprise`` post-release the index may lack, so
``pip install 'litellm[proxy]==X'`` fails there. ``make install`` installs ``litellm`` itself, then what this
prints: the extra's requirements read from the installed ``litellm``'s metadata, with

* ``--leave-out NAME``: requirements to omit (``litellm-proxy``);
* ``--any-version NAME``: requirements whose version specifier is dropped (the constraints file then pins
  the release that resolved here, e.g. ``litellm-enterprise==0.1.83`` where the extra asks ``0.1.83.post1``).

A name given that the extra does not require is no error: the same command serves every LiteLLM version (the
older ones require neither ``litellm-proxy`` nor an unavailable pin). Markers are evaluated for the running
interpreter, so only the lines that apply to it are printed; only what the extra adds is printed (not
``litellm``'s own requirements, which come with it). Exit status 1 with a message when ``litellm`` is not
installed or has no ``[proxy]`` extra.

Usage (with the target environment's Python): ``python .ci/proxy_extra_requirements.py --leave-out
litellm-proxy --any-version litellm-enterprise > reqs.txt && python -m pip install -c constraints.txt -r
reqs.txt``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

EXTRA = "proxy"


def extra_requirements(
    requires: Iterable[str], *, leave_out: Iterable[str] = (), any_version: Iterable[str] = ()
) -> list[str]:
    """The requirement lines ``[proxy]`` adds to ``requires`` (a distribution's ``Requires-Dist`` values),
    for this interpreter, less ``leave_out``, with no version specifier for ``any_version``; sorted by name,
    each name once (a requirement listed twice under different markers applies once here)."""
    omitted = {canonicalize_name(name) for name in leave_out}
    unpinned = {canonicalize_name(name) for name in any_version}
    lines: dict[str, str] = {}
    for line in requires:
        requirement = Requirement(line)
        marker = requirement.marker
        # Only what the extra adds: its marker holds with extra == "proxy" and not without an extra.
        if marker is None or not marker.evaluate({"extra": EXTRA}) or marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in omitted:
            continue
        extras = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        specifier = "" if name in unpinned else str(requirement.specifier)
        lines.setdefault(name, f"{requirement.name}{extras}{specifier}")
    return [lines[name] for name in sorted(lines)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--leave-out", action="append", default=[], metavar="NAME", help="omit this requirement")
    parser.add_argument(
        "--any-version", action="append", default=[], metavar="NAME", help="drop this requirement's version"
    )
    args = parser.parse_args(argv)
    try:
        distribution = metadata.distribution("litellm")
    except metadata.PackageNotFoundError:
        print("proxy_extra_requirements: litellm is not installed in this environment", file=sys.stderr)
        return 1
    if EXTRA not in (distribution.metadata.get_all("Provides-Extra") or []):
        print(f"proxy_extra_requirements: litellm {distribution.version} has no [{EXTRA}] extra", file=sys.stderr)
        return 1
    for line in extra_requirements(distribution.requires or [], leave_out=args.leave_out, any_version=args.any_version):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
