"""`python -m minidist.tutorial.check <rung> <your file> [--world N]`: see the package docstring."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minidist.runtime import EXIT_USAGE


def usage_error(message: str) -> None:
    print(f"minidist.tutorial.check: {message}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


def list_rungs() -> None:
    from minidist.tutorial.check.rungs import RUNGS, TUTORIAL
    root = TUTORIAL.parents[1]
    for rung in RUNGS.values():
        print(f"{rung.name:<18} {rung.title}\n{'':<18} stub {rung.stub.relative_to(root)}, solution "
              f"{rung.solution_path.relative_to(root)}, problem {rung.page}")


def main(argv: list[str] | None = None) -> None:
    from minidist.tutorial.check.rungs import RUNGS, load
    ap = argparse.ArgumentParser(prog="python -m minidist.tutorial.check",
                                 description="Run a rung's equivalence, byte and memory checks against your file.")
    ap.add_argument("rung", nargs="?", help=f"one of: {', '.join(RUNGS)}")
    ap.add_argument("path", nargs="?", help="your implementation (start from the rung's stub; --list names them)")
    ap.add_argument("--world", type=int, default=2, help="ranks to check at (default 2)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds before the world is stopped (default 180)")
    ap.add_argument("--list", action="store_true", help="the rungs, their stubs and solutions")
    args = ap.parse_args(argv)
    if args.list:
        return list_rungs()
    if args.rung not in RUNGS:
        usage_error(f"rung {args.rung!r} is not one of: {', '.join(RUNGS)} (--list shows their stubs)")
    if not args.path or not Path(args.path).is_file():
        usage_error(f"{args.path!r} is not a file: give the path of your implementation of {args.rung} "
                    f"(start from {RUNGS[args.rung].stub})")
    if not 2 <= args.world <= 8:
        usage_error(f"--world {args.world}: check at 2 to 8 ranks")
    rung = RUNGS[args.rung]
    try:
        load(args.path, rung)   # here first: a file that does not import is a bad input, not a failed world
    except Exception as exc:  # noqa: BLE001 - the learner's file: any import error, on one line
        usage_error(f"{args.path} does not import: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
    sys.exit(check(rung.name, args.path, args.world, args.timeout))


def check(rung_name: str, path: str, world: int, timeout_s: float) -> int:
    from minidist.tutorial.check.rungs import RUNGS, run_checks
    from minidist.tutorial.check.world import run_world
    rung = RUNGS[rung_name]
    print(f"{rung.name}: {rung.title}; {path} at N = {world} (gloo, {timeout_s:.0f} s at most)", flush=True)
    outcomes = run_world(run_checks, (rung.name, str(Path(path).resolve())), world, timeout_s)
    broken = [(r, o[1]) for r, o in enumerate(outcomes) if o[0] != "ok"]
    if broken:
        for r, why in broken:
            print(f"FAIL  rank {r}: {why}")
        print(f"0 of {len(rung.checks)} checks ran to the end")
        return 1
    passed = 0
    for k, check_ in enumerate(rung.checks):
        verdicts = [o[1][k] for o in outcomes]
        ok = all(v[1] for v in verdicts)
        detail = next((v[2] for v in verdicts if not v[1]), verdicts[0][2])
        passed += ok
        print(f"{'PASS' if ok else 'FAIL'}  {check_.name}: {detail}", flush=True)
    print(f"{passed} of {len(rung.checks)} checks pass")
    return 0 if passed == len(rung.checks) else 1


if __name__ == "__main__":
    main()
