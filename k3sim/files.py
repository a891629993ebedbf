"""Every file k3sim writes goes through here: whole or not at all, only where the user asked, never over a
file k3sim did not write.

Three rules, one module (issue 19):

- **Output directories** (`output_dir(path, kind=...)`: `plan`, `sweep`, `serve --out`, `cp --sweep`, ...).
  A directory k3sim writes is marked by a manifest, `.k3sim-manifest.json`: by kind of output (the command)
  the relative paths k3sim wrote (one directory may hold several kinds, e.g. reports/decode). An existing directory is accepted only if it is empty or a previous
  k3sim output of the same kind; anything else is refused with one line before any work starts. The files
  are built in a staging directory inside the output directory and moved into place at the end (with
  SIGINT / SIGTERM held back while they move), so a failed or interrupted run leaves the previous output as
  it was and no staging directory. Of a previous output, only the files its manifest lists are replaced or
  removed; a file k3sim did not write is never deleted or overwritten. Writers do not need to know: inside
  the block, `atomic_path` / `atomic_write_text` / `save_figure` on a path under the directory write into
  the staging copy, so the paths they return and print are the final ones.
- **Output files** (`check_output_file`: `pipeline --gantt/--trace`, `calibrate fit --out`): the path must be
  absent or a regular file. A directory, device (`/dev/full`, `/dev/stdout`), FIFO, socket or symbolic link
  (to anything: an atomic replace would swap the link, or the device, for a regular file) is refused, except
  `-` for stdout where the format allows it. A file is written to a temp name beside it and renamed.
- **Names from inputs** (a scenario `name`, a trace stem) that become a path component go through
  `safe_name`: `.`, `..`, a separator, an empty name or a control character is refused (never mapped: a
  mapped name could silently collide with another output).

Defaults: every command's default output is under the working directory, `./k3sim-out/<name>/`
(`default_out`); the committed `reports/` are regenerated only by `scripts/reports.sh`. A text file whose
only change would be ISO timestamps, or any file whose bytes are unchanged, is left as it is, so
regenerating an unchanged report leaves git clean. `project_path` resolves the project's own input files
(models, scenarios, traces) from any working directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import unicodedata
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator

from k3sim.errors import InputError
from k3sim.procs import signals_blocked  # the one signal mask: files move with SIGINT/SIGTERM held

MANIFEST_NAME = ".k3sim-manifest.json"
STAGING_PREFIX = ".k3sim-staging-"
OUT_ROOT = Path("k3sim-out")  # relative: default outputs land under the working directory
STDOUT = "-"
# Longest name component most file systems take (ext4, xfs, btrfs: 255 bytes).
NAME_MAX_BYTES = 255
# Files larger than this are compared by size and bytes in chunks, not as text (timestamp rule).
_TEXT_COMPARE_BYTES = 64 * 2**20


def _why(err: OSError) -> str:
    return err.strerror or err.__class__.__name__


# ----------------------------------------------------------------------------------------------- names

def safe_name(name: object, *, source: str, field: str | None = None) -> str:
    """`name` if it is one path component k3sim may create; otherwise one InputError line naming the file
    and field it came from. Refused, not mapped: `a/b` mapped to `a_b` could overwrite another output."""
    text = "" if name is None else str(name)
    bad = None
    if text.strip() == "":
        bad = "is empty"
    elif text in (".", ".."):
        bad = f"is {text!r}, which names a directory, not a new one"
    elif "/" in text or "\\" in text:
        bad = f"contains a path separator ({text!r})"
    elif any(unicodedata.category(c) == "Cc" for c in text):
        bad = "contains a control character"
    elif len(text.encode("utf-8", "surrogateescape")) > NAME_MAX_BYTES:
        bad = f"is longer than {NAME_MAX_BYTES} bytes"
    if bad is None:
        return text
    raise InputError(f"the name {bad}; it names the output directory, so it must be one file name "
                     "(letters, digits, - _ .), or give --out DIR", source=source, field=field)


def default_out(*names: str) -> Path:
    """`./k3sim-out/<names...>`: where a command writes when no --out is given (never the project tree)."""
    return OUT_ROOT.joinpath(*names)


# ------------------------------------------------------------------------------------------ file kinds

def _kind_of(mode: int) -> str:
    for test, what in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return what
    return "not a regular file"


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # absent (a file on the way: the caller names it)
        return None
    except OSError as err:
        raise InputError(f"cannot check the output path ({_why(err)})", source=str(path)) from None


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if os.path.lexists(p):
            return p
    return Path(".")


def _check_writable_dir(d: Path, source: str, target: Path) -> None:
    """`d` (an existing directory) must let us create entries. Tried, not guessed from permission bits:
    root passes os.access everywhere, yet a read-only mount or /proc refuses it (the probe is an empty
    directory, removed at once)."""
    if not d.is_dir():
        raise InputError(f"{d} is {_kind_of(os.stat(d).st_mode)}, not a directory", source=f"{source} {target}")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=STAGING_PREFIX + "probe-", dir=d))
    except OSError as err:
        raise InputError(f"cannot write under {d} ({_why(err)}); give a writable place",
                         source=f"{source} {target}") from None


def check_output_file(path: str | Path, *, source: str, stdout_ok: bool = False,
                      make_parents: bool = False) -> Path | None:
    """Refuse, before any work, an output file path that k3sim must not replace; None means stdout (`-`).

    Accepted: an absent path in a writable directory (with `make_parents`, the caller creates the missing
    directories: its nearest existing ancestor must be writable), or an existing regular file (replaced
    atomically). Refused: a directory, device, FIFO, socket or symbolic link (to anything), and `-` when
    the format cannot go to stdout."""
    if str(path) == STDOUT:
        if stdout_ok:
            return None
        raise InputError("'-' (stdout) is not possible for this format; give a file path", source=source)
    path = Path(path)
    st = _lstat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        fix = ("k3sim never writes through a link; give a regular file path" if stat.S_ISLNK(st.st_mode)
               else "give a regular file path")
        raise InputError(f"{path} is {_kind_of(st.st_mode)}; k3sim replaces only regular files ({fix})",
                         source=source)
    if st is None and not make_parents and not os.path.isdir(path.parent):
        raise InputError(f"cannot write {path}: directory {path.parent} does not exist", source=source)
    _check_writable_dir(_nearest_existing(path.parent), source, path)  # the temp file and the rename go there
    return path


# ------------------------------------------------------------------------------------ output directories

@dataclass
class _Staged:
    """One open output directory: where its files really go (`final`) and where they are built (`stage`)."""
    final: Path
    stage: Path
    kind: str
    part: str
    written: set[str] = field(default_factory=set)

    def redirect(self, target: Path) -> Path | None:
        """The staging path of `target` if it lies under the final directory, else None."""
        t = Path(os.path.abspath(target))
        for root in {Path(os.path.abspath(self.final)), Path(os.path.realpath(self.final))}:
            if t != root and t.is_relative_to(root):
                rel = t.relative_to(root).as_posix()
                self.written.add(rel)
                return self.stage / rel
        return None


_OPEN: list[_Staged] = []


def _staged_target(path: Path) -> Path | None:
    for s in reversed(_OPEN):  # innermost first
        p = s.redirect(path)
        if p is not None:
            return p
    return None


def _clean_rel(rel: object, where: Path) -> str:
    """A manifest entry as a safe relative path inside the directory (a hostile manifest listing `../x`
    or an absolute path must not make k3sim delete files elsewhere)."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or "\\" in rel:
        raise InputError("is not a k3sim manifest (bad file entry); remove it or give another --out",
                         source=str(where / MANIFEST_NAME))
    p = PurePosixPath(rel)
    if p.is_absolute() or any(part in ("", ".", "..") for part in rel.split("/")) or \
            rel == MANIFEST_NAME or rel.startswith(STAGING_PREFIX):
        raise InputError(f"is not a k3sim manifest (entry {rel[:60]!r} leaves the directory); remove it or "
                         "give another --out", source=str(where / MANIFEST_NAME))
    return rel


def read_manifest(d: Path) -> dict | None:
    """The manifest of directory `d`, None if it has none: {"k3sim_version", "outputs": {kind: {part:
    [rel, ...]}}} (one directory may hold the outputs of several kinds, e.g. reports/decode). A malformed
    one is an InputError: k3sim cannot tell what it wrote there."""
    m = Path(d) / MANIFEST_NAME
    st = _lstat(m)
    if st is None:
        return None
    bad = "is not a k3sim manifest ({}); remove it or give another --out"
    if not stat.S_ISREG(st.st_mode) or st.st_size > 16 * 2**20:
        raise InputError(bad.format("not a small regular file"), source=str(m))
    try:
        data = json.loads(m.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise InputError(bad.format("unreadable JSON"), source=str(m)) from None
    outputs = data.get("outputs") if isinstance(data, dict) else None
    if not isinstance(outputs, dict) or not all(
            isinstance(parts, dict) and all(isinstance(v, list) for v in parts.values()) for parts in outputs.values()):
        raise InputError(bad.format("no outputs by kind and part"), source=str(m))
    data["outputs"] = {str(k): {str(p): [_clean_rel(r, Path(d)) for r in v] for p, v in parts.items()}
                       for k, parts in outputs.items()}
    return data


def _listed(manifest: dict | None) -> dict[str, tuple[str, str]]:
    """rel path -> (kind, part), over every kind and part of a manifest."""
    return {rel: (kind, part) for kind, parts in (manifest or {}).get("outputs", {}).items()
            for part, rels in parts.items() for rel in rels}


def _no_link_on_the_way(out: Path, rel: str, source: str) -> None:
    """Every directory between `out` and `out/rel` must be a real directory inside `out` (a symlinked
    subdirectory would send a replace or a removal outside it)."""
    p = out
    for part in PurePosixPath(rel).parts[:-1]:
        p = p / part
        st = _lstat(p)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise InputError(f"{p} is {_kind_of(st.st_mode)}, where k3sim keeps a directory of its output; "
                             "move it away or give another --out", source=f"{source} {out}")


def check_output_dir(path: str | Path, *, kind: str, source: str = "--out") -> dict | None:
    """Refuse, before any work, an output directory k3sim may not write; returns its manifest (None when
    the directory is absent or empty).

    Accepted: an absent path under a writable directory, an empty directory, or a previous k3sim output of
    the same `kind` (its manifest's files must still be regular files). A symbolic link to a directory is
    judged by its target (writes go inside it; the link itself is never replaced)."""
    out = Path(path)
    what = f"{source} {out}"
    st = _lstat(out)
    if st is None:
        _check_writable_dir(_nearest_existing(out.parent), source, out)
        return None
    if not out.is_dir():
        raise InputError(f"exists and is {_kind_of(os.stat(out).st_mode if out.exists() else st.st_mode)}, "
                         "not a directory; give a directory", source=what)
    manifest = read_manifest(out)
    if manifest is None:
        try:
            others = [e for e in os.listdir(out) if not e.startswith(STAGING_PREFIX)]
        except OSError as err:
            raise InputError(f"cannot list the directory ({_why(err)})", source=what) from None
        if others:
            raise InputError(f"holds files k3sim did not write ({shorten_list(others)}); give an empty or new "
                             f"directory, or a previous k3sim {kind} output", source=what)
    elif kind not in manifest["outputs"]:
        kinds = " and ".join(sorted(manifest["outputs"])) or "empty"
        raise InputError(f"is a k3sim {kinds} output, not a {kind} output; give an empty or new directory, "
                         f"or a previous k3sim {kind} output", source=what)
    else:
        for rel, (k, _part) in _listed(manifest).items():
            _no_link_on_the_way(out, rel, source)
            fst = _lstat(out / rel)
            if k == kind and fst is not None and not stat.S_ISREG(fst.st_mode):
                raise InputError(f"{out / rel} (a file of the previous output) is now {_kind_of(fst.st_mode)}; "
                                 "move it away or give another --out", source=what)
    _check_writable_dir(out, source, out)
    return manifest


def shorten_list(names: list[str], limit: int = 3) -> str:
    names = sorted(names)
    shown = ", ".join(n[:40] for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@contextmanager
def output_dir(path: str | Path, *, kind: str = "output", source: str = "--out", part: str = "") -> Iterator[Path]:
    """Open the output directory `path` for a block that writes `kind` files (rules: module docstring).

    Checks come first (`check_output_dir`): call this before the computation, so a refused --out costs
    nothing. The block writes to `path/...` through `atomic_path`, `atomic_write_text` or `save_figure`;
    the files go to a staging directory inside `path` and are moved into place when the block ends without
    an exception. `part` names one run's share of a directory that holds several (`decode --sweep-batch`
    stems, `prefix-cache --sweep --name`): a previous file of the same part that this run does not write
    again is removed; other parts are left alone. Re-entering the directory already open (a library function
    that opens it too) joins the open block. Yields `path`."""
    out = Path(path)
    for s in _OPEN:
        if os.path.abspath(s.final) == os.path.abspath(out):
            if (s.kind, s.part) != (kind, part):
                raise ValueError(f"{out} is open as {s.kind} part {s.part!r}, not {kind} part {part!r}")
            yield out
            return
    manifest = check_output_dir(out, kind=kind, source=source)
    created = [p for p in (out, *out.parents) if not os.path.lexists(p)]  # deepest first
    stage = staged = None
    try:
        with signals_blocked():  # an interrupt lands before the directories exist or once they are tracked
            try:
                out.mkdir(parents=True, exist_ok=True)
                stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
            except OSError as err:
                raise InputError(f"cannot create the output directory ({_why(err)}); give a writable place",
                                 source=f"{source} {out}") from None
            staged = _Staged(out, stage, kind, part)
            _OPEN.append(staged)
        yield out
        _OPEN.remove(staged)
        with signals_blocked():
            try:
                _commit(staged, manifest, source)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
    finally:
        if staged in _OPEN:
            _OPEN.remove(staged)
        with signals_blocked():  # a second Ctrl-C must not cut the clean-up short
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
            if not os.path.lexists(out / MANIFEST_NAME):  # nothing committed: no new empty directories left
                _remove_empty(created)


def _remove_empty(dirs: list[Path]) -> None:
    """rmdir each directory (deepest first) while it is empty: never removes anything but empty dirs."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break


def _unchanged(new: Path, old: Path) -> bool:
    """True if the old file may stay: same bytes, or text that differs only in ISO timestamps."""
    try:
        ns, os_ = new.stat().st_size, old.stat().st_size
        if ns > _TEXT_COMPARE_BYTES or os_ > _TEXT_COMPARE_BYTES:
            if ns != os_:
                return False
            with open(new, "rb") as a, open(old, "rb") as b:
                while True:
                    x, y = a.read(2**20), b.read(2**20)
                    if x != y:
                        return False
                    if not x:
                        return True
        a, b = new.read_bytes(), old.read_bytes()
    except OSError:
        return False
    if a == b:
        return True
    try:
        return same_but_timestamps(b.decode("utf-8"), a.decode("utf-8"))
    except UnicodeDecodeError:
        return False


def _manifest_text(outputs: dict[str, dict[str, list[str]]]) -> str:
    """The manifest's bytes: sorted, so the same files give the same manifest (git stays clean)."""
    from k3sim import __version__

    body = {"k3sim_version": __version__,
            "note": "written by k3sim: the files it made here, by kind of output; k3sim replaces or removes "
                    "only these",
            "outputs": {k: {p: sorted(set(v)) for p, v in sorted(parts.items()) if v}
                        for k, parts in sorted(outputs.items())}}
    return json.dumps(body, indent=1) + "\n"


def _commit(s: _Staged, manifest: dict | None, source: str) -> None:
    """Move the staged files into `s.final`, remove this part's stale files, write the manifest; on any
    error undo every move, so the previous output stays whole."""
    out, stage = s.final, s.stage
    listed = _listed(manifest)
    new = sorted(rel for rel in s.written if (stage / rel).is_file())
    fresh = set(new)
    for rel in new:  # refuse before the first move: a file k3sim may not replace where this run writes
        _no_link_on_the_way(out, rel, source)
        st = _lstat(out / rel)
        if st is None:
            continue
        if rel not in listed:
            raise InputError(f"{out / rel} is not a file k3sim wrote; move it away or give another --out "
                             "(nothing was changed)", source=f"{source} {out}")
        if listed[rel][0] != s.kind:
            raise InputError(f"{out / rel} belongs to the k3sim {listed[rel][0]} output there; give another "
                             "--out (nothing was changed)", source=f"{source} {out}")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{out / rel} is now {_kind_of(st.st_mode)}; move it away (nothing was changed)",
                             source=f"{source} {out}")
    backup = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX + "old-", dir=out))
    undo: list[tuple[Path, Path | None]] = []  # (path now, where it came from; None: it was new)
    made: list[Path] = []

    def set_aside(rel: str) -> None:
        _make_dirs((backup / rel).parent, backup, [])
        os.rename(out / rel, backup / rel)
        undo.append((backup / rel, out / rel))

    try:
        for rel in new:
            dst = out / rel
            if os.path.lexists(dst) and _unchanged(stage / rel, dst):
                continue
            _make_dirs(dst.parent, out, made)
            if os.path.lexists(dst):
                set_aside(rel)
            os.chmod(stage / rel, 0o644)
            os.rename(stage / rel, dst)
            undo.append((dst, None))
        outputs = {k: {p: [r for r in v if r not in fresh] for p, v in parts.items()}
                   for k, parts in (manifest or {}).get("outputs", {}).items()}
        outputs.setdefault(s.kind, {})[s.part] = new
        for rel, (k, p) in listed.items():  # stale files of this kind and part: removed
            if (k, p) == (s.kind, s.part) and rel not in fresh:
                st = _lstat(out / rel)
                if st is not None and stat.S_ISREG(st.st_mode):
                    set_aside(rel)
        text = _manifest_text(outputs)
        mpath = out / MANIFEST_NAME
        old_text = mpath.read_text(encoding="utf-8") if manifest is not None else None
        if old_text != text:
            tmp = stage / MANIFEST_NAME
            tmp.write_text(text, encoding="utf-8")
            os.chmod(tmp, 0o644)
            if old_text is not None:
                set_aside(MANIFEST_NAME)
            os.rename(tmp, mpath)
            undo.append((mpath, None))
    except BaseException as err:
        for now, origin in reversed(undo):
            try:
                if origin is None:
                    os.unlink(now)
                else:
                    os.rename(now, origin)
            except OSError:
                pass
        _remove_empty(list(reversed(made)))
        shutil.rmtree(backup, ignore_errors=True)
        if isinstance(err, OSError):
            raise InputError(f"cannot move the output into place ({_why(err)}); the previous output is kept",
                             source=f"{source} {out}") from None
        raise
    shutil.rmtree(backup, ignore_errors=True)
    for rel in sorted(listed, key=lambda r: -r.count("/")):  # subdirectories emptied by removed stale files
        _remove_empty([out / p for p in PurePosixPath(rel).parents if str(p) != "."])


def mark_output(path: str | Path, *, kind: str, files: list[str], part: str = "") -> None:
    """Record existing files of directory `path` as k3sim's `kind` output (part `part`), e.g. a report
    committed before manifests existed; the next run of that kind may then replace them."""
    out = Path(path)
    manifest = read_manifest(out) or {"outputs": {}}
    rels = [_clean_rel(r, out) for r in files]
    for rel in rels:
        if not (out / rel).is_file() or (out / rel).is_symlink():
            raise InputError("is not a regular file; only files can be marked", source=str(out / rel))
    outputs = manifest["outputs"]
    outputs.setdefault(kind, {})[part] = sorted(set(outputs.get(kind, {}).get(part, [])) | set(rels))
    atomic_write_text(out / MANIFEST_NAME, _manifest_text(outputs))


def _make_dirs(d: Path, root: Path, made: list[Path]) -> None:
    """mkdir -p `d` under `root`, noting each directory made (to remove it again on undo)."""
    missing = [p for p in (d, *d.parents) if p != root and p.is_relative_to(root) and not os.path.lexists(p)]
    for p in reversed(missing):
        p.mkdir()
        made.append(p)


# ------------------------------------------------------------------------------------------ single files

@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` when the block ends, delete it if it raises.

    Under an open `output_dir` the file goes to its staging copy instead (moved into place with the rest).
    Elsewhere `path` must be absent or a regular file, checked again right before the rename: a device,
    FIFO, socket, directory or symbolic link there is never replaced."""
    path = Path(path)
    staged = _staged_target(path)
    target = staged if staged is not None else path
    if staged is not None:
        staged.parent.mkdir(parents=True, exist_ok=True)
    else:
        _refuse_non_regular(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix or ".tmp", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; outputs are ordinary files
        if staged is None:
            _refuse_non_regular(path)
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _refuse_non_regular(path: Path) -> None:
    st = _lstat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise InputError(f"is {_kind_of(st.st_mode)}; k3sim replaces only regular files", source=str(path))


# ISO-8601 date-times as reports write them (2026-11-30T03:29:47+00:00, 20261130T032947Z, ...).
_TIMESTAMP = re.compile(r"\d{4}-?\d{2}-?\d{2}[T ]\d{2}:?\d{2}:?\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")


def same_but_timestamps(old: str, new: str) -> bool:
    """True if `old` and `new` differ at most in ISO-8601 date-times (a report regenerated from the same data)."""
    return _TIMESTAMP.sub("<time>", old) == _TIMESTAMP.sub("<time>", new)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically; an OSError becomes an InputError naming the path.

    If the file exists and differs from `text` only in timestamps, it is kept untouched: the committed copy
    of a report regenerated from unchanged data stays byte-identical (git clean). Only a regular file is
    read for that comparison (reading a FIFO or /dev/stdout would block)."""
    path = Path(path)
    if _staged_target(path) is None:
        st = _lstat(path)
        if st is not None and stat.S_ISREG(st.st_mode):
            try:
                if same_but_timestamps(path.read_text(), text):
                    return
            except (OSError, UnicodeDecodeError):
                pass
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(text)
    except OSError as err:
        raise InputError(f"cannot write ({_why(err)})", source=str(path)) from None


def save_figure(fig, path: str | Path, **savefig_kw) -> Path:
    """Write a matplotlib figure as PNG atomically and close it."""
    import matplotlib.pyplot as plt

    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", **savefig_kw)
    finally:
        plt.close(fig)
    return Path(path)


# -------------------------------------------------------------------------------------------- inputs

def project_root() -> Path:
    """The project checkout the package runs from (k3sim is installed editable from it)."""
    return Path(__file__).resolve().parents[1]


def project_path(path: str | Path) -> Path:
    """A relative input path as given if it exists from the working directory, else the project's copy
    (`models/kimi-k3.yaml`, `data/traces/...`, `scenarios/default.yaml`) if that exists; otherwise as given,
    so the caller's "file not found" names what the user typed."""
    p = Path(path)
    try:
        if p.is_absolute() or p.exists():
            return p
        candidate = project_root() / p
        return candidate if candidate.exists() else p
    except OSError:  # a name too long for the file system: not ours to find; the caller reports it
        return p
