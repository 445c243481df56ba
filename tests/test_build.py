"""Tests for scorch.compiler.build: C source -> loaded, cached shared library."""

import ctypes
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from scorch.compiler import build
from scorch.errors import InternalError, NotSupportedError, ScorchError

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")

ADD = "int add(int a, int b) { return a + b; }\n"

SUM = textwrap.dedent("""
    #include <omp.h>
    double sum(const float *x, long n, int nthreads) {
        double s = 0.0;
        #pragma omp parallel for reduction(+:s) num_threads(nthreads)
        for (long i = 0; i < n; i++) s += x[i];
        return s;
    }
    int team(int n) {
        int t = 0;
        #pragma omp parallel num_threads(n)
        {
            #pragma omp single
            t = omp_get_num_threads();
        }
        return t;
    }
""")


@pytest.fixture(autouse=True)
def env(tmp_path, monkeypatch):
    """Own cache dir, default flags and an empty in-process cache for every test."""
    for var in ("SCORCH_CC", "SCORCH_CFLAGS", "SCORCH_CFLAGS_OVERRIDE", "SCORCH_NO_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(tmp_path / "cache"))
    build.clear_cache()
    yield tmp_path / "cache"
    build.clear_cache()


def _add(lib):
    lib.add.argtypes, lib.add.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return lib.add


def _sum(lib, x: torch.Tensor) -> float:
    lib.sum.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    lib.sum.restype = ctypes.c_double
    return lib.sum(x.data_ptr(), x.numel(), build.num_threads())


def _so_files(d):
    return sorted(p.name for p in d.glob("*.so"))


def test_add_and_disk_layout(env):
    lib = build.compile_library(ADD, tag="add")
    assert _add(lib)(2, 40) == 42
    (so,) = _so_files(env)
    assert so.startswith("add-") and len(so) == len("add-") + 20 + len(".so")
    assert (env / so.replace(".so", ".c")).read_text() == ADD
    assert not [p for p in env.iterdir() if p.name.endswith(".tmp")]  # temp files renamed away


def test_openmp_reduction_matches_torch():
    lib = build.compile_library(SUM, tag="sum")
    x = torch.rand(1_000_003, dtype=torch.float32)
    assert _sum(lib, x) == pytest.approx(torch.sum(x.double()).item(), rel=1e-9)
    y = np.arange(1000, dtype=np.float32)
    assert _sum(lib, torch.from_numpy(y)) == float(y.sum())


def test_one_openmp_runtime_in_process():
    lib = build.compile_library(SUM, tag="sum")
    assert lib.team(2) == 2  # a parallel region actually ran in the kernel's runtime
    torch.ones(10_000).sum()  # and torch's own pool too
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    omp = {os.path.realpath(p) for p in paths if build._OMP_NAME.match(os.path.basename(p))}
    assert len(omp) == 1, omp
    rt = build.openmp_runtime()
    if rt is not None:  # torch ships a runtime: it is the one, and the kernel asks for it by soname
        assert omp == {os.path.realpath(rt)}


def test_threads_follow_torch():
    lib = build.compile_library(SUM, tag="sum")
    old = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert build.num_threads() == n
            assert lib.team(build.num_threads()) == n
    finally:
        torch.set_num_threads(old)


def test_in_process_cache_is_fast():
    lib = build.compile_library(ADD)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        again = build.compile_library(ADD)
        times.append(time.perf_counter() - t0)
    assert again is lib
    assert min(times) < 100e-6, min(times)


def test_disk_cache_reused_across_processes(env):
    lib = build.compile_library(ADD)
    (so,) = _so_files(env)
    mtime = (env / so).stat().st_mtime_ns
    code = "from scorch.compiler import build; import sys; sys.exit(build.compile_library(%r).add(1, 2))" % ADD
    assert subprocess.run([sys.executable, "-c", code]).returncode == 3
    assert (env / so).stat().st_mtime_ns == mtime  # loaded, not rebuilt
    assert _add(lib)(1, 1) == 2


def test_key_depends_on_flags(env, monkeypatch):
    build.compile_library(ADD)
    monkeypatch.setenv("SCORCH_CFLAGS", "-DSOMETHING=1")
    assert _add(build.compile_library(ADD))(3, 4) == 7
    monkeypatch.setenv("SCORCH_CFLAGS_OVERRIDE", "-O0 -shared -fPIC")
    assert _add(build.compile_library(ADD))(5, 6) == 11
    assert len(_so_files(env)) == 3


def test_no_cache_keeps_memory_cache(env, monkeypatch):
    monkeypatch.setenv("SCORCH_NO_CACHE", "1")
    lib = build.compile_library(ADD)
    assert _add(lib)(1, 2) == 3
    assert build.compile_library(ADD) is lib
    assert not env.exists()


def test_compile_error_reports_stderr_and_source(env):
    with pytest.raises(InternalError) as info:
        build.compile_library("int broken(void) { return undeclared_name; }\n", tag="bad")
    msg = str(info.value)
    assert "undeclared_name" in msg  # the compiler's diagnostic
    (c,) = env.glob("bad-*.c")
    assert str(c) in msg


def test_failing_compiler_settings_are_named(env, monkeypatch):
    """A compiler or flags the user set that fail to build a kernel: a CompilerError naming the
    setting (it said "a scorch bug"); with the defaults a failed build stays an InternalError."""
    from scorch.errors import CompilerError
    monkeypatch.setenv("SCORCH_CFLAGS", "-fno-such-flag-here")
    with pytest.raises(CompilerError, match="SCORCH_CFLAGS='-fno-such-flag-here'"):
        build.compile_library(ADD, tag="flags")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "same size, headers kept", "no sum"])
def test_corrupt_cached_library_is_rebuilt(env, damage):
    build.compile_library(ADD)
    (so,) = env.glob("*.so")
    data = so.read_bytes()
    # A new inode: overwriting the file in place would SIGBUS this process, which has it mapped.
    bad = env / "bad.tmp"
    if damage == "no sum":   # (a cache written before the sums, or a sum lost)
        so.with_suffix(".sum").unlink()
        bad.write_bytes(data)
    else:   # the ELF headers kept and the code garbled passed the ELF check and segfaulted when run
        bad.write_bytes({"garbage": b"\x00garbage" * 100, "truncated": data[: len(data) // 2], "empty": b"",
                         "same size, headers kept": data[:4096] + bytes(len(data) - 4096)}[damage])
    os.replace(bad, so)
    with pytest.raises(OSError):
        build._load(so)  # detected before dlopen (a truncated ELF would otherwise SIGBUS)
    build.clear_cache()
    assert _add(build.compile_library(ADD))(20, 22) == 42
    build._load(so)  # the file on disk is whole again


def test_concurrent_processes_share_cache(env):
    src = SUM + "int magic(void) { return 1234; }\n"
    code = textwrap.dedent(f"""
        from scorch.compiler import build
        lib = build.compile_library({src!r}, tag="race")
        assert lib.team(2) == 2
        print(lib.magic())
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(4)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4
    assert [o.strip() for o in outs] == [b"1234"] * 4
    assert len(list(env.glob("race-*.so"))) == 1
    assert not [p for p in env.iterdir() if p.name.endswith(".tmp")]
    assert build.compile_library(src, tag="race").magic() == 1234


def _check_fallback(monkeypatch, cache):
    monkeypatch.setattr(build, "_warned", set())
    monkeypatch.setenv("SCORCH_CACHE_DIR", str(cache))
    with pytest.warns(RuntimeWarning, match="not writable") as rec:
        assert _add(build.compile_library(ADD))(2, 2) == 4
        assert _add(build.compile_library(ADD + "\n// other kernel\n"))(3, 3) == 6
    assert len(rec) == 1  # one warning, not one per kernel


def test_cache_dir_under_a_file_falls_back(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a directory")
    _check_fallback(monkeypatch, tmp_path / "file" / "cache")


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores chmod; the under-a-file variant covers this")
def test_read_only_cache_dir_falls_back(tmp_path, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _check_fallback(monkeypatch, ro)
        assert not list(ro.iterdir())
    finally:
        ro.chmod(0o700)


def test_no_compiler(monkeypatch):
    monkeypatch.setenv("SCORCH_CC", "/nonexistent/cc")
    assert build.have_compiler() is False
    with pytest.raises(NotSupportedError, match="C compiler") as info:
        build.compile_library(ADD)
    assert isinstance(info.value, ScorchError) and isinstance(info.value, NotImplementedError)
    monkeypatch.delenv("SCORCH_CC")  # re-checked when SCORCH_CC changes back
    assert build.have_compiler() is True
    assert _add(build.compile_library(ADD))(1, 1) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF/RUNPATH linking is Linux-only")
def test_link_names_only_torch_runtime_even_with_hashed_soname(tmp_path, monkeypatch):
    """Wheels often ship e.g. libgomp-a34b3233.so.1; the driver's -lgomp must not add a second one."""
    rt = build.openmp_runtime()
    data = open(rt, "rb").read() if rt else b""
    if b"libgomp.so.1\0" not in data or not build.shutil.which("readelf"):
        pytest.skip("needs torch's libgomp.so.1 and readelf")
    fake = tmp_path / "libgomp-ab.1"  # same length as the real soname, so a byte patch suffices
    fake.write_bytes(data.replace(b"libgomp.so.1\0", b"libgomp-ab.1\0"))
    monkeypatch.setattr(build, "_runtime", [str(fake)])
    (tmp_path / "k.c").write_text(SUM)
    cmd = build._command(build._cc(), tmp_path / "k.c", tmp_path / "k.so")
    subprocess.run(cmd, check=True, capture_output=True)  # built only: loading it would add a runtime
    dyn = subprocess.run(["readelf", "-d", str(tmp_path / "k.so")], capture_output=True, text=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
    assert [n for n in needed if "omp" in n] == ["libgomp-ab.1"], needed
    assert f"[{tmp_path}]" in dyn  # RUNPATH/RPATH points at the runtime's directory


def test_set_signature_passes_every_scalar_kind(env):
    """Kernel arguments as ctypes passes them (int64_t declared as void * on 64-bit ABIs): a C
    function copies what it received; oracle: the values given, negative and past 32 bits too."""
    from scorch.compiler.ir import Param
    lib = build.compile_library(textwrap.dedent("""
        #include <stdint.h>
        void echo(int64_t a, double b, float c, int64_t d, int64_t *out_i, double *out_d) {
            out_i[0] = a; out_i[1] = d; out_d[0] = b; out_d[1] = c;
        }
    """))
    params = [Param("a", "int64_t", ("size", "i")), Param("b", "double", ("x",)), Param("c", "float", ("x",)),
              Param("d", "int64_t", ("size", "j")), Param("out_i", "int64_t *", ("out",)),
              Param("out_d", "double *", ("out",))]
    build.set_signature(lib.echo, params)
    out_i, out_d = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.float64)
    lib.echo(-5, 0.25, -1.5, 2**40 + 3, out_i.data_ptr(), out_d.data_ptr())
    assert out_i.tolist() == [-5, 2**40 + 3] and out_d.tolist() == [0.25, -1.5]
    with pytest.raises(InternalError, match="'q'.*'int32_t'"):
        build.set_signature(lib.echo, [Param("q", "int32_t", ("size", "i"))])


@pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")
def test_generated_sources_compile_without_optimisation(monkeypatch):
    """SCORCH_CFLAGS=-O0 (a debugging build): the shift of the row sums' lane shuffle was an
    immediate only once the optimiser folded it; the source failed to compile."""
    import scorch
    A = scorch.as_sparse(torch.eye(40), "csr")
    sources = [scorch.explain(eq, A.to(dt), *ops).source for dt in (torch.float32, torch.float64)
               for eq, ops in (("ij,j->i", (torch.ones(40, dtype=dt),)), ("ij,jk->ik", (torch.ones(40, 3, dtype=dt),)))]
    monkeypatch.setenv("SCORCH_CFLAGS", "-O0")
    for src in sources:
        assert build.compile_library(src, tag="o0") is not None


def test_cache_files_follow_the_umask(env):
    old = os.umask(0o022)
    try:
        mask = build._UMASK
        build.compile_library(ADD, tag="modes")
    finally:
        os.umask(old)
    (so,) = env.glob("modes-*.so")
    assert so.stat().st_mode & 0o777 == 0o777 & ~mask
    assert so.with_suffix(".c").stat().st_mode & 0o777 == 0o666 & ~mask
    assert so.with_suffix(".sum").stat().st_mode & 0o777 == 0o666 & ~mask


def test_a_fork_during_a_compile_and_a_no_cache_child(env, tmp_path):
    """A child forked while another thread compiles gets a new build lock (it waited forever on
    the copied, held one) and a private dir of its own: its exit leaves the parent's alone (its
    atexit removed it, and the parent's next build failed)."""
    slow = tmp_path / "slowcc.sh"
    slow.write_text("#!/bin/sh\nsleep 2\nexec cc \"$@\"\n")
    slow.chmod(0o755)
    code = textwrap.dedent(f"""
        import os, sys, threading, time
        os.environ["SCORCH_NO_CACHE"] = "1"
        from scorch.compiler import build
        os.environ["SCORCH_CC"] = {str(slow)!r}
        assert build.have_compiler()   # (its --version, slow too, out of the way)
        build.compile_library("int z(void) {{ return 0; }}\\n")   # the private dir made before the fork
        t = threading.Thread(target=build.compile_library, args=("int a(void) {{ return 1; }}\\n",))
        t.start()
        time.sleep(0.5)   # the thread holds the build lock, compiling
        pid = os.fork()
        if pid == 0:
            lib = build.compile_library("int b(void) {{ return 2; }}\\n")
            sys.exit(0 if lib.b() == 2 else 3)   # (a normal exit: atexit handlers run)
        _, status = os.waitpid(pid, 0)
        t.join()
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert build.compile_library("int c(void) {{ return 3; }}\\n").c() == 3   # the parent's dir is whole
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_forked_workers_leave_no_private_dir_behind(tmp_path):
    """Forked workers exit by os._exit, past atexit: a private dir of their own (SCORCH_NO_CACHE=1)
    stayed in the temp dir for ever, one per DataLoader worker; they build into the parent's."""
    code = textwrap.dedent("""
        import os, sys
        os.environ["SCORCH_NO_CACHE"] = "1"
        from scorch.compiler import build
        assert build.compile_library("int z(void) { return 0; }\\n").z() == 0
        for k in range(3):
            pid = os.fork()
            if pid == 0:
                lib = build.compile_library(f"int b(void) {{ return {k}; }}\\n")
                os._exit(0 if lib.b() == k else 3)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, status
        print("ok")
    """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert not list(tmp_path.glob("scorch-*"))   # the parent removed its dir; the children made none


def test_compiler_settings_parsed_or_named(env, monkeypatch):
    from scorch.errors import CompilerError, ScorchValueError
    monkeypatch.setenv("SCORCH_CFLAGS_OVERRIDE", "")   # set but empty: the defaults (no flags built nothing)
    assert _add(build.compile_library(ADD, tag="empty"))(1, 2) == 3
    monkeypatch.delenv("SCORCH_CFLAGS_OVERRIDE")
    monkeypatch.setenv("SCORCH_CFLAGS", '-O2 "-DX=1')   # (a bare shlex ValueError)
    with pytest.raises(ScorchValueError, match="SCORCH_CFLAGS="):
        build.compile_library(ADD, tag="quotes")
    monkeypatch.delenv("SCORCH_CFLAGS")
    monkeypatch.setenv("SCORCH_CC", "cc -O1")   # a compiler with arguments (ccache gcc): it was "no compiler"
    build.clear_cache()
    assert build.have_compiler() and _add(build.compile_library(ADD, tag="args"))(2, 3) == 5
    hang = env.parent / "hangcc.sh"   # answers --version and -dM, then hangs on a build
    hang.write_text('#!/bin/sh\ncase "$*" in *--version*|*-dM*) exec cc "$@";; esac\nsleep 30\n')
    hang.chmod(0o755)
    monkeypatch.setenv("SCORCH_CC", str(hang))
    monkeypatch.setattr(build, "_COMPILE_TIMEOUT", 1)
    with pytest.raises(CompilerError, match="did not finish in 1 s"):
        build.compile_library(ADD, tag="hang")


def test_odd_files_in_a_shared_cache_dir(env):
    """A directory where a kernel's library goes (IsADirectoryError from os.replace) falls back to a
    private dir; a FIFO there (the read blocked for ever) or a link to /dev/zero (read without end)
    counts as absent."""
    lib = build.compile_library(ADD, tag="odd")
    (so,) = env.glob("odd-*.so")
    build.clear_cache()
    so.unlink()
    so.mkdir()
    with pytest.warns(RuntimeWarning, match="private temp dir"):
        assert _add(build.compile_library(ADD, tag="odd"))(1, 1) == 2
    so.rmdir()
    for make in (lambda p: os.mkfifo(p), lambda p: os.symlink("/dev/zero", p)):
        build.clear_cache()
        make(so)
        with pytest.raises(OSError, match="not a regular file"):
            build._load(so)
        assert _add(build.compile_library(ADD, tag="odd"))(2, 2) == 4   # rebuilt over it
        so.unlink()
    assert lib is not None


def test_temp_libraries_of_killed_builds_are_removed(env):
    lib = build.compile_library(ADD, tag="tmp")
    (so,) = env.glob("tmp-*.so")
    stem = so.name[:-3]
    old, fresh = env / f".{stem}.abc123.so.tmp", env / f".{stem}.def456.so.tmp"
    old.write_bytes(b"half a library")
    fresh.write_bytes(b"another process's build in progress")
    os.utime(old, (time.time() - 3 * build._COMPILE_TIMEOUT,) * 2)
    so.unlink()
    build.clear_cache()
    assert _add(build.compile_library(ADD, tag="tmp"))(3, 4) == 7 and lib is not None
    assert not old.exists() and fresh.exists()
