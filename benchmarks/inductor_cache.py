"""Inductor's on-disk cache, one directory for each CPU capability a process runs under.

Inductor keeps the code it generates in TORCHINDUCTOR_CACHE_DIR and reuses it by a key that does
not hold the capability the process is capped to (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA,
MKL_ENABLE_INSTRUCTIONS): code compiled under one ran under another. On an AVX-512/AMX Xeon,
`train_pytorch.py --compile` aborted natively ("malloc(): unaligned tcache chunk detected", three
times in a row) after a run under the AVX2 cap had filled the cache, and ran with a fresh one.

Every script that compiles imports this module before torch: unless TORCHINDUCTOR_CACHE_DIR is
set (the user's choice stands), the cache goes to a directory named by the capability switches
and by the CPU's own flags (a home directory shared by machines of other kinds), beside
Inductor's default one.
"""
import getpass
import hashlib
import os
import tempfile

SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def cpu_flags():
    """The CPU's flags as /proc/cpuinfo lists them ("" where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def capability_key(environ=None):
    """A directory name for the capability a process with `environ` runs under: the three
    switches ("native" where unset) and a digest of the CPU's flags."""
    environ = os.environ if environ is None else environ
    switches = "-".join(environ.get(name) or "native" for name in SWITCHES).lower()
    return "%s-cpu%s" % (switches, hashlib.sha256(cpu_flags().encode()).hexdigest()[:8])


def use_capability_cache():
    """Points TORCHINDUCTOR_CACHE_DIR at this capability's directory, unless it is set; returns
    the cache directory."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"]
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    path = os.path.join(tempfile.gettempdir(), "torchinductor_" + user, capability_key())
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


USER_CHOSEN = bool(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))  # the user's directory stands
use_capability_cache()
