"""``crossrt cache``: list, verify and prune a compiled-model cache directory.

- ``ls``: the entries, least recently used first (key prefix, model, driver, device, size,
  cache version, last used), or ``--json``.
- ``verify``: loads every entry with every SHA-256 checked; ``--fix`` deletes corrupt ones.
  Exits 1 when any entry was corrupt.
- ``prune``: evicts least recently used entries down to ``--max-size`` (default
  ``CROSSRT_CACHE_MAX_SIZE``), ``--key`` deletes one entry, ``--all`` clears the cache.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from ..compiler.cache import CacheEntry, CompileCache
from ..compiler.cache_store import TAG
from ..config import parse_size, settings
from ..errors import CrossrtError, InvalidArgumentError, StatusCode
from . import flags
from .common import fail, human_bytes, say


def parser() -> argparse.ArgumentParser:
    """The argument parser (also the ``--help`` text)."""
    p = argparse.ArgumentParser(
        prog="crossrt cache",
        description="Inspect and maintain a compiled-model cache: the directory that "
        "crossrt.compile(cache_dir=...), `crossrt compile --cache-dir` and CROSSRT_CACHE_DIR "
        "use.",
        epilog="examples:\n"
        "  crossrt cache ls --cache-dir ~/.cache/crossrt\n"
        "  crossrt cache verify --fix\n"
        "  crossrt cache prune --max-size 500M",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    where = argparse.ArgumentParser(add_help=False)
    flags.add(where, "--cache-dir")
    ls = commands.add_parser(
        "ls", parents=[where], help="list the entries, least recently used first"
    )
    flags.add(ls, "--json")
    verify = commands.add_parser(
        "verify",
        parents=[where],
        help="load every entry with its hashes checked; exit 1 if any is corrupt",
    )
    verify.add_argument("--fix", action="store_true", help="delete the corrupt entries")
    prune = commands.add_parser(
        "prune", parents=[where], help="evict least recently used entries down to a size"
    )
    which = prune.add_mutually_exclusive_group()
    which.add_argument(
        "--max-size",
        default=None,
        metavar="SIZE",
        help="size to fit: bytes or 500M, 2G... (default: $CROSSRT_CACHE_MAX_SIZE)",
    )
    which.add_argument("--all", action="store_true", help="delete every entry")
    which.add_argument("--key", default=None, help="delete the entry of this key (or prefix)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``crossrt cache``."""
    args = parser().parse_args(argv)
    try:
        cache = _open(args.cache_dir)
        if args.command == "ls":
            return _ls(cache, args.json)
        if args.command == "verify":
            return _verify(cache, args.fix)
        return _prune(cache, args)
    except CrossrtError as exc:
        return fail(f"cache {args.command}", exc)


def _open(directory: str | None) -> CompileCache:
    where = directory if directory is not None else settings().cache_dir
    if where is None:
        raise InvalidArgumentError(
            "no cache directory: give --cache-dir DIR or set CROSSRT_CACHE_DIR",
            details={"cache_dir": None},
        )
    path = Path(where).expanduser()
    if not (path / TAG).is_file():
        # Never create a cache here, or prune files in a directory that is not one.
        what = "does not exist" if not path.exists() else f"is not a crossrt cache (no {TAG})"
        raise InvalidArgumentError(
            f"cache directory {str(path)!r} {what}; check the path, or create the cache by "
            "compiling with --cache-dir",
            code=StatusCode.NOT_FOUND,
            details={"cache_dir": str(path)},
        )
    return CompileCache(path)


def _ls(cache: CompileCache, as_json: bool) -> int:
    entries = cache.entries()
    total = sum(e.size for e in entries)
    if as_json:
        doc = {
            "cache_dir": str(cache.directory),
            "entries": [e.to_dict() for e in entries],
            "total_bytes": total,
        }
        print(json.dumps(doc, indent=2))  # JSON escapes every control character itself
        return 0
    if not entries:
        say(f"no entries in {cache.directory}")
        return 0
    say(
        f"{'key':<12}  {'model':<20} {'driver':<13} {'device':<7} {'size':>10} "
        f"{'version':>7}  last used"
    )
    for e in entries:
        version = "?" if e.version is None else str(e.version)
        say(
            f"{e.key[:12]:<12}  {e.model[:20]:<20} {e.driver[:13]:<13} {e.device:<7} "
            f"{human_bytes(e.size):>10} {version:>7}  {_when(e.last_used)}"
        )
    say(f"{len(entries)} entries, {human_bytes(total)} in {cache.directory}")
    return 0


def _verify(cache: CompileCache, fix: bool) -> int:
    entries = cache.entries()
    bad = dict((e.key, why) for e, why in cache.verify(fix=fix))
    for e in entries:
        state = "ok" if e.key not in bad else ("REMOVED" if fix else "CORRUPT")
        reason = f": {bad[e.key]}" if e.key in bad else ""
        say(f"{state:<8} {e.key[:12]}  {e.model}{reason}")
    say(f"{len(entries) - len(bad)} ok, {len(bad)} corrupt{' (removed)' if fix and bad else ''}")
    return 1 if bad else 0


def _prune(cache: CompileCache, args: argparse.Namespace) -> int:
    if args.key is not None:
        entry = cache.entry(args.key)
        cache.remove(entry.key)
        evicted: list[CacheEntry] = [entry]
    else:
        if args.all:
            limit = 0
        elif args.max_size is not None:
            limit = parse_size(args.max_size, "--max-size")
        elif (budget := settings().cache_max_bytes) is not None:
            limit = budget
        else:
            raise InvalidArgumentError(
                "no size to prune to: give --max-size SIZE (e.g. 500M), --all or --key KEY, "
                "or set CROSSRT_CACHE_MAX_SIZE"
            )
        evicted = cache.prune(limit)
    for e in evicted:
        say(f"removed  {e.key[:12]}  {e.model} ({human_bytes(e.size)})")
    left = cache.entries()
    say(
        f"removed {len(evicted)} entries ({human_bytes(sum(e.size for e in evicted))}); "
        f"{len(left)} left, {human_bytes(sum(e.size for e in left))}"
    )
    return 0


def _when(seconds: float) -> str:
    ago = time.time() - seconds
    if ago < 60:
        return "just now"
    if ago < 3600:
        return f"{ago / 60:.0f} min ago"
    if ago < 86400:
        return f"{ago / 3600:.0f} h ago"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))
