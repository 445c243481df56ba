"""Turn generated C99 + OpenMP source text into a loaded shared library, with caching.

This module owns the compiler command line, the OpenMP runtime the kernels link
against, and the two-level cache.  It knows nothing about what the source does.

Public API: ``compile_library(source, *, tag="kernel") -> ctypes.CDLL``,
``have_compiler() -> bool``, ``num_threads() -> int``, ``threads_for(work) -> int``,
``cache_dir() -> Path``, ``vector_bytes() -> int``,
``openmp_runtime() -> str | None``, ``clear_cache() -> None``.

Environment (read at call time): ``SCORCH_CC`` (default ``cc``); ``SCORCH_CFLAGS``
(appended to the flags); ``SCORCH_CFLAGS_OVERRIDE`` (replaces ``DEFAULT_FLAGS`` when not empty);
``SCORCH_CACHE_DIR`` (else ``$XDG_CACHE_HOME/scorch`` or ``~/.cache/scorch``);
``SCORCH_NO_CACHE=1`` (no disk cache: build in a private per-process temp dir).

OpenMP: the process must hold ONE OpenMP runtime, the one torch loaded.  On Linux
the kernel is linked against that exact file (found in ``/proc/self/maps`` or
``torch/lib``) with ``-Wl,--as-needed`` before it, so the ``-lgomp`` the driver
adds for ``-fopenmp`` is dropped (all GOMP_* symbols are already resolved) and the
library's only NEEDED entry is torch's runtime, found via its RUNPATH.

Thread contract: kernels take the thread count as an ``int`` argument and use it in
``num_threads(n)`` clauses; callers pass ``threads_for(work)``: ``num_threads()`` (=
``torch.get_num_threads()``, so kernels follow ``torch.set_num_threads``), or 1 for a loop nest
smaller than ``scorch.config.parallel_min_work``.

Cache: in-process dict key -> CDLL (a repeat call is a hash + dict lookup); on disk
``{tag}-{key[:20]}.so`` plus the ``.c`` and the ``.so``'s SHA-256 (``.sum``) beside it.  The
key hashes ``CACHE_VERSION``, the compiler's path and ``--version`` line, the CPU (under
``-march=native``), the full command line and the source.  Files are written to a temp name in
the same directory and ``os.replace``d (modes as the umask gives), so concurrent processes never
see a partial file; a cached ``.so`` that is truncated, corrupt or not what its ``.sum`` says is
rebuilt.  Fork-safe: a child gets a new build lock and its own private dir.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import re
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

from scorch import config
from scorch.errors import CompilerError, InternalError, NotSupportedError, ScorchValueError

CACHE_VERSION = 1
# -ffp-contract=fast: ISO C mode (-std=c99) turns off fusing a * b + c into one FMA, which GNU C
# does by default: one instruction and one rounding instead of two.
DEFAULT_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c99", "-ffp-contract=fast")
_OMP_NAME = re.compile(r"^lib(gomp|iomp\d*|omp)\b[\w.-]*\.(so|dylib)")

_memory: dict[str, ctypes.CDLL] = {}
_compilers: dict[str, str | None] = {}  # SCORCH_CC value -> identity line, None if unusable
_vector_bytes: dict[tuple, int] = {}    # (cc, flags) -> widest vector register of the target
_runtime: list[str | None] = []  # memo: [path of torch's OpenMP runtime or None]
_private_dir: list[Path] = []
_warned: set[str] = set()
_lock = threading.Lock()


def num_threads() -> int:
    """Thread count to pass to kernels: follows ``torch.set_num_threads``."""
    return torch.get_num_threads()


def threads_for(work: int) -> int:
    """Threads for a kernel whose loop nest does about ``work`` inner iterations: one below
    ``config.parallel_min_work`` (waking a sleeping OpenMP thread costs more than it saves on
    small problems), else ``num_threads()``.  Every kernel call asks this first, so it also
    refuses a call a tracer would record wrongly (:func:`check_untraced`)."""
    if _dispatch_modes() or _jit_tracing():
        check_untraced()
    return 1 if work < config.parallel_min_work else max(1, num_threads())


_dispatch_modes = torch._C._len_torch_dispatch_stack   # (~30 ns each: on every kernel call)
_jit_tracing = torch._C._is_tracing
_TRACING_MODES = (torch._C._TorchDispatchModeKey.PROXY, torch._C._TorchDispatchModeKey.FAKE,
                  torch._C._TorchDispatchModeKey.FUNCTIONAL)


def check_untraced() -> None:
    """Refuse to run a kernel under ``torch.jit.trace`` or a tracing dispatch mode (``make_fx``,
    ``torch.export``, FakeTensorMode): a kernel writes its result through a raw pointer, which the
    trace cannot see -- it would record an uninitialised buffer as the result."""
    if _jit_tracing():
        raise NotSupportedError("torch.jit.trace cannot record scorch's kernels (they write through raw "
                                "pointers): trace the dense parts only, or run eagerly")
    if any(torch._C._get_dispatch_mode(k) is not None for k in _TRACING_MODES):
        raise NotSupportedError("scorch's kernels cannot run under a tracing mode (make_fx, torch.export, "
                                "FakeTensorMode): they write through raw pointers, which the trace cannot "
                                "see; trace the dense parts only, or run eagerly")


def clear_cache() -> None:
    """Forget the in-process cache (loaded libraries stay mapped; the disk cache stays)."""
    _memory.clear()


def cache_dir() -> Path:
    """The configured on-disk cache directory (may not exist yet)."""
    if os.environ.get("SCORCH_CACHE_DIR"):
        return Path(os.environ["SCORCH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scorch"


def _cc() -> list[str]:
    """``$SCORCH_CC`` (default ``cc``) as a command: a program and its own arguments (``ccache gcc``,
    ``gcc -m64``), shell-quoted."""
    return _split("SCORCH_CC") or ["cc"]


def _compiler_identity() -> str | None:
    cc = os.environ.get("SCORCH_CC") or "cc"
    if cc not in _compilers:
        command, line = _cc(), None
        exe = shutil.which(command[0])
        try:
            out = subprocess.run([exe or command[0], *command[1:], "--version"], capture_output=True, text=True,
                                 timeout=60)
            if out.returncode == 0:
                line = (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
        _compilers[cc] = f"{shlex.join([str(exe), *command[1:]])}|{line}" if exe and line else None
    return _compilers[cc]


_cpu: list[str] = []


def _cpu_identity() -> str:
    """What ``-march=native`` compiles for: the CPU's model and feature flags (Linux), else the
    platform's processor string; a kernel built on another CPU may use instructions this one lacks."""
    if not _cpu:
        ident = ""
        try:
            with open("/proc/cpuinfo") as f:
                lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features", "CPU part"))]
            ident = hashlib.sha256("".join(dict.fromkeys(lines)).encode()).hexdigest()[:16]
        except OSError:
            import platform
            ident = platform.machine() + "|" + platform.processor()
        _cpu.append(ident)
    return _cpu[0]


def have_compiler() -> bool:
    """Whether ``$SCORCH_CC`` runs; checked once per process per ``SCORCH_CC`` value."""
    return _compiler_identity() is not None


def openmp_runtime() -> str | None:
    """Path of the OpenMP runtime torch loaded, or None if there is none to share."""
    if not _runtime:
        found = None
        if sys.platform.startswith("linux"):
            torch_lib = Path(torch.__file__).parent / "lib"
            try:
                with open("/proc/self/maps") as f:
                    mapped = {line.split()[-1] for line in f if "/" in line}
            except OSError:
                mapped = set()
            mapped |= {str(p) for p in torch_lib.glob("lib*omp*.so*")}
            hits = sorted((not p.startswith(str(torch_lib)), p) for p in mapped
                          if _OMP_NAME.match(os.path.basename(p)) and os.path.isfile(p))
            found = hits[0][1] if hits else None
        # None (torch built without OpenMP, or not Linux, where --as-needed and RUNPATH
        # differ): plain -fopenmp linking; then the compiler's runtime is the only one.
        _runtime.append(found)
    return _runtime[0]


def _flags() -> list[str]:
    # SCORCH_CFLAGS_OVERRIDE set but blank counts as unset, as an empty SCORCH_CC does (no flags at
    # all built no library, and the error blamed scorch)
    override = os.environ.get("SCORCH_CFLAGS_OVERRIDE", "")
    flags = _split("SCORCH_CFLAGS_OVERRIDE") if override.strip() else list(DEFAULT_FLAGS)
    return flags + _split("SCORCH_CFLAGS")


def _split(name: str) -> list[str]:
    """The environment variable ``name`` as a shell-quoted argument list (its error names it)."""
    value = os.environ.get(name, "")
    try:
        return shlex.split(value)
    except ValueError as e:
        raise ScorchValueError(f"{name}={value!r} is not a valid argument list ({e})") from None


def vector_bytes() -> int:
    """The width in bytes of the target's widest vector registers under the current compiler
    and flags, read off the compiler's predefined macros: 64 (AVX-512F), 32 (AVX), else 16.

    The generated code sizes its vector types by it: a GCC vector wider than the registers is
    split into register-sized pieces that gcc keeps on the stack (SpMM with K=16 and 64-byte
    vectors on an AVX2 machine ran 2.5-4x slower than with 32-byte ones).  Checked once per
    process per compiler and flags; 64 when no compiler runs (no kernel is built then)."""
    env = os.environ
    key = (env.get("SCORCH_CC") or "cc", env.get("SCORCH_CFLAGS_OVERRIDE"), env.get("SCORCH_CFLAGS"))
    if key not in _vector_bytes:   # the raw settings key the memo: no flag parsing per call
        flags = [f for f in _flags() if f not in ("-shared", "-fPIC")]
        try:
            out = subprocess.run([*_cc(), *flags, "-dM", "-E", "-x", "c", os.devnull],
                                 capture_output=True, text=True, timeout=60)
            macros = out.stdout if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            macros = None
        if macros is None:
            width = 64
        else:
            width = 64 if "#define __AVX512F__ " in macros else 32 if "#define __AVX__ " in macros else 16
        _vector_bytes[key] = width
    return _vector_bytes[key]


def _command(cc: list[str], src: Path, out: Path) -> list[str]:
    flags = _flags()
    link = []
    if (rt := openmp_runtime()) is not None:
        # --as-needed: the driver's own -lgomp (added after our inputs) is then unused.
        link = ["-Wl,--as-needed", rt, f"-Wl,-rpath,{os.path.dirname(rt)}"]
    return [*cc, *flags, "-o", str(out), str(src), *link]


def _check_elf(path: Path, data: bytes) -> None:
    """Raise OSError if ``data`` (the file ``path``) is not a complete ELF file (a truncated .so
    dlopens into SIGBUS)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        if data[:4] != b"\x7fELF":
            raise ValueError("no ELF magic")
        end = "<" if data[5] == 1 else ">"
        is64 = data[4] == 2
        hdr = struct.unpack_from(end + ("QQQIHHHHHH" if is64 else "IIIIHHHHHH"), data, 24)
        phoff, shoff, phentsize, phnum, shentsize, shnum = hdr[1], hdr[2], *hdr[5:7], *hdr[7:9]
        need = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
        for i in range(phnum):  # every segment's bytes must be in the file
            at = phoff + i * phentsize
            off, filesz = (struct.unpack_from(end + "QQQQ", data, at + 8)[::3] if is64
                           else struct.unpack_from(end + "IIII", data, at + 4)[::3])
            need = max(need, off + filesz)
    except (ValueError, struct.error, IndexError) as e:
        raise OSError(f"{path}: not a valid shared library ({e})") from None
    if len(data) < need:
        raise OSError(f"{path}: truncated ({len(data)} < {need} bytes)")


_MAX_LIBRARY_BYTES = 1 << 28   # a kernel library is tens of KB


def _load(path: Path, *, verify: bool = True) -> ctypes.CDLL:
    """Load a built library; ``verify``: a cached one, whose bytes must be what the build wrote
    (the SHA-256 in the ``.sum`` file beside it, written after the library): a file corrupted in
    place but still ELF-shaped would be run (a segfault) -- it and a missing sum read as absent."""
    info = path.stat()   # (a shared cache dir: a FIFO there blocked the read, /dev/zero never ended it)
    if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_LIBRARY_BYTES:
        raise OSError(f"{path}: not a regular file of a kernel's size")
    data = path.read_bytes()
    _check_elf(path, data)
    if verify:
        try:
            want = path.with_suffix(".sum").read_text().strip()
        except (OSError, UnicodeDecodeError):
            raise OSError(f"{path}: no checksum beside it") from None
        if hashlib.sha256(data).hexdigest() != want:
            raise OSError(f"{path}: its bytes are not the ones built (checksum mismatch)")
    return ctypes.CDLL(str(path))


def _private() -> Path:
    """This process's private build dir (``SCORCH_NO_CACHE=1``, or an unwritable cache dir),
    removed when the process that made it exits.  A forked child builds into its parent's (file
    names are content hashes, written atomically): a child of its own made one that outlived it,
    since forked workers leave by ``os._exit``, past atexit -- one per DataLoader worker, for ever.
    A child whose parent exited (the dir removed) makes its own."""
    if not _private_dir or not _private_dir[0].is_dir():
        _private_dir.clear()
        d = Path(tempfile.mkdtemp(prefix="scorch-"))
        atexit.register(_remove_private, d, os.getpid())
        _private_dir.append(d)
    return _private_dir[0]


def _remove_private(d: Path, owner: int) -> None:
    if os.getpid() == owner:
        shutil.rmtree(d, ignore_errors=True)


def _after_fork_in_child() -> None:
    """A child forked while another thread held the build lock (compiling) would wait on it
    forever: the child gets a new lock (it shares the parent's private dir: :func:`_private`)."""
    global _lock
    _lock = threading.Lock()


def _before_fork() -> None:
    """With ``SCORCH_NO_CACHE=1`` the parent makes its private dir before a fork, so that the children
    (DataLoader workers started before the first kernel) share it rather than each making one that
    outlives it (:func:`_private`)."""
    if os.environ.get("SCORCH_NO_CACHE") == "1" and not _private_dir:
        try:
            _private()
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()   # (read once: os.umask sets it to read it)


def write_atomic(directory: Path, name: str, data: bytes, mode: int = 0o666) -> Path:
    """``directory / name`` holding ``data``, written under a temp name and renamed (readers
    never see part of it), with ``mode`` as the umask lets it (mkstemp's 0600 would keep a cache
    dir shared by several users unreadable to the others)."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode & ~_UMASK)
        os.replace(tmp, directory / name)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return directory / name


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
        return True
    except OSError:
        return False


_COMPILE_TIMEOUT = 600   # seconds; a kernel compiles in 0.05-2


def _remove_stale(directory: Path, stem: str) -> None:
    """Remove this kernel's temp libraries left by builds killed mid-way (the linker outlives a killed
    compiler driver) -- those older than any build takes: another process may be building it now."""
    now = time.time()
    for p in directory.glob(f".{stem}.*.so.tmp"):
        try:
            if now - p.stat().st_mtime > 2 * _COMPILE_TIMEOUT:
                p.unlink()
        except OSError:
            pass


def _build(source: str, directory: Path, stem: str) -> ctypes.CDLL:
    """Compile into ``directory`` (temp name, then os.replace) and load the result."""
    cc = _cc()
    c_path = write_atomic(directory, f"{stem}.c", source.encode())
    _remove_stale(directory, stem)
    fd, tmp_so = tempfile.mkstemp(dir=directory, prefix=f".{stem}.", suffix=".so.tmp")
    os.close(fd)
    try:
        cmd = _command(cc, c_path, Path(tmp_so))
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT)
        except subprocess.TimeoutExpired:   # (a hung compiler held the build lock: every thread waited)
            raise _build_error(f"C compiler did not finish in {_COMPILE_TIMEOUT} s: {shlex.join(cmd)}\n"
                               f"source kept at {c_path}") from None
        if proc.returncode != 0:
            err = proc.stderr.strip()
            err = err if len(err) <= 2000 else err[:2000] + "\n... (truncated)"
            raise _build_error(f"C compiler failed: {shlex.join(cmd)}\nsource kept at {c_path}\n{err}")
        os.chmod(tmp_so, 0o777 & ~_UMASK)
        os.replace(tmp_so, directory / f"{stem}.so")
    finally:
        if os.path.exists(tmp_so):
            os.unlink(tmp_so)
    so = directory / f"{stem}.so"
    try:
        lib = _load(so, verify=False)
    except OSError as e:
        raise _build_error(f"compiled library does not load ({e}); source kept at {c_path}") from None
    write_atomic(directory, f"{stem}.sum", hashlib.sha256(so.read_bytes()).hexdigest().encode())
    return lib


def _build_error(msg: str) -> Exception:
    """A failed build: the user's compiler settings' (named) when any is set, else a scorch bug."""
    chosen = {v: os.environ[v] for v in ("SCORCH_CC", "SCORCH_CFLAGS", "SCORCH_CFLAGS_OVERRIDE") if os.environ.get(v)}
    if chosen:
        return CompilerError(f"{msg}\n(with {', '.join(f'{k}={v!r}' for k, v in chosen.items())}: check these settings, "
                             "or unset them for the defaults)")
    return InternalError(msg)


# ctypes converts a Python int to a void * in ~half the time it takes for an int64_t (11 arguments
# of SpMV: 0.91 -> 0.66 us a call); both travel in the same 64-bit register or stack slot on every
# 64-bit ABI, so int64_t parameters are declared as void * there.
_INT64_ARG = ctypes.c_void_p if ctypes.sizeof(ctypes.c_void_p) == 8 else ctypes.c_int64
_SCALAR_ARGS = {"int64_t": _INT64_ARG, "float": ctypes.c_float, "double": ctypes.c_double}


def set_signature(fn, params) -> None:
    """Declare ``fn``'s ctypes argument types from a generated kernel's ``params`` (pointers,
    ``int64_t``, ``float``, ``double``) and its return type (void)."""
    fn.restype = None
    types = []
    for p in params:
        if p.ctype.endswith("*"):
            types.append(ctypes.c_void_p)
        elif p.ctype in _SCALAR_ARGS:
            types.append(_SCALAR_ARGS[p.ctype])
        else:
            raise InternalError(f"build: no ctypes type for kernel parameter {p.name!r} of C type {p.ctype!r}")
    fn.argtypes = types


def compile_library(source: str, *, tag: str = "kernel") -> ctypes.CDLL:
    """Compile C99 ``source`` into a shared library (cached) and load it with ctypes."""
    ident = _compiler_identity()
    if ident is None:
        raise NotSupportedError(
            f"compiled kernels need a C compiler, but SCORCH_CC={os.environ.get('SCORCH_CC') or 'cc'!r}"
            " does not run; install gcc/clang or set SCORCH_CC, or use the torch fallback")
    cmd = _command(["$CC"], Path("$SRC"), Path("$OUT"))
    cpu = _cpu_identity() if any("=native" in f for f in cmd) else ""   # (a cache dir shared by machines)
    key = hashlib.sha256("\0".join([str(CACHE_VERSION), ident, cpu, *cmd, source]).encode()).hexdigest()
    if (lib := _memory.get(key)) is not None:
        return lib
    with _lock:
        if (lib := _memory.get(key)) is not None:
            return lib
        stem = f"{re.sub(r'[^A-Za-z0-9_]', '_', tag) or 'kernel'}-{key[:20]}"
        if os.environ.get("SCORCH_NO_CACHE") == "1":
            lib = _build(source, _private(), stem)
        else:
            directory = cache_dir()
            try:
                lib = _load(directory / f"{stem}.so")
            except OSError:  # missing, truncated or corrupt: (re)build it
                if not _writable(directory):
                    if str(directory) not in _warned:
                        _warned.add(str(directory))
                        warnings.warn(f"scorch: cache dir {directory} is not writable; compiling "
                                      "into a private temp dir", RuntimeWarning, stacklevel=2)
                    directory = _private()
                try:
                    lib = _build(source, directory, stem)
                except (IsADirectoryError, NotADirectoryError, PermissionError) as e:   # (a directory at the
                    if _private_dir and directory == _private_dir[0]:                   # library's path)
                        raise
                    warnings.warn(f"scorch: cannot write {stem} into the cache dir {directory} ({e}); compiling "
                                  "into a private temp dir", RuntimeWarning, stacklevel=2)
                    lib = _build(source, _private(), stem)
        _memory[key] = lib
        return lib
