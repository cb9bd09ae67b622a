"""Builds heapcast's native code: plain shared libraries (the recorder, for LD_PRELOAD; the lab's
replay kernels and the trace encoder, loaded with ctypes), not Python extension modules."""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class NativeBuild(build_ext):
    """Names the native libraries libheapcast_*.so (plain shared libraries, not Python extensions)."""

    def get_ext_filename(self, ext_name):
        if ext_name.endswith(("libheapcast_recorder", "libheapcast_lab", "libheapcast_codec",
                                  "libheapcast_drain", "libheapcast_policy",
                                  "libheapcast_stats", "libheapcast_forecast", "libheapcast_alloc",
                                  "libheapcast_alloc_mimalloc")):
            return ext_name.replace(".", "/") + ".so"
        return super().get_ext_filename(ext_name)

    def get_export_symbols(self, ext):
        return []  # no PyInit_*: this library is preloaded, never imported


recorder = Extension(
    "heapcast.libheapcast_recorder",
    sources=["native/recorder/recorder.c", "native/recorder/policy_hook.c",
             *[f"native/policy/{name}.c" for name in ("policy", "rnn", "table", "modmap")]],
    depends=["native/recorder/raw_format.h", "native/recorder/pyframes.h",
             "native/recorder/pymalloc.h", "native/recorder/own_file.h", "native/recorder/quiet.h",
             "native/recorder/policy_hook.h", "native/policy/heapcast_policy.h",
             "native/policy/internal.h", "native/recorder/exports.map"],
    extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-fno-omit-frame-pointer",
                        "-ffp-contract=off", "-Wno-psabi",
                        "-ftls-model=initial-exec", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread", "-ldl", "-lm", "-Wl,--version-script=native/recorder/exports.map"],
)

# The allocator lab's replay kernels: a plain shared library loaded with ctypes (heapcast.lab.native).
lab = Extension(
    "heapcast.libheapcast_lab",
    sources=[f"native/lab/{name}.c" for name in ("util", "fitheap", "pages", "policy", "pol_fit",
                                                 "pol_buddy", "pol_seg", "pol_glibc", "pol_life",
                                                 "pol_pack", "predictor", "driver")],
    depends=["native/lab/lab.h", "native/alloc/pack_params.h"],
    extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra",
                        "-Wno-unused-parameter", "-pthread"],
    extra_link_args=["-pthread"],
)

# The trace writer's EVENTS block encoder and the raw-file decoder of `heapcast finalize`: a plain
# shared library loaded with ctypes (heapcast.trace.native_codec, heapcast.trace.native_raw).
codec = Extension(
    "heapcast.libheapcast_codec",
    sources=["native/codec/encode.c", "native/codec/raw_decode.c", "native/codec/match.c",
             "native/codec/steps.c", "native/codec/decode.c"],
    depends=["native/recorder/raw_format.h"],
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra"],
    libraries=["m"],
)

# The drainer that `heapcast record` runs beside the program to recycle full chunks
# (heapcast.recorder.drain): a plain shared library loaded with ctypes.
drain = Extension(
    "heapcast.libheapcast_drain",
    sources=["native/recorder/drain.c"],
    depends=["native/recorder/raw_format.h"],
    extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-pthread", "-Wall", "-Wextra"],
    extra_link_args=["-pthread"],
)

# The policy runtime (heapcast.policy.native, and compiled into the recorder and the allocator):
# no FMA contraction, so that every SIMD width computes the same bits (native/policy/rnn.c).
policy = Extension(
    "heapcast.libheapcast_policy",
    sources=[f"native/policy/{name}.c" for name in ("policy", "rnn", "table", "modmap")],
    depends=["native/policy/heapcast_policy.h", "native/policy/internal.h"],
    # -fno-semantic-interposition: the runtime's own calls to its exported functions (hc_run
    # calling hc_stream_predict per event) are direct, not through the PLT
    extra_compile_args=["-std=gnu11", "-O3", "-fvisibility=hidden", "-ffp-contract=off",
                        "-fno-semantic-interposition", "-Wall", "-Wextra", "-Wno-psabi"],
    libraries=["m"],
)

# The live-block map of `heapcast stats` and `heapcast report` (heapcast.stats.matching) and the
# size classes' bit lengths (heapcast.stats.classes): a plain shared library loaded with ctypes.
stats = Extension(
    "heapcast.libheapcast_stats",
    sources=["native/stats/livemap.c", "native/stats/classes.c"],
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra"],
)

# The forecasting kernels (heapcast.forecast.native): a freed block's recency rank, the n-gram's
# context hashes and its k best labels per row; a plain shared library loaded with ctypes.
forecast = Extension(
    "heapcast.libheapcast_forecast",
    sources=["native/forecast/ranks.c", "native/forecast/contexts.c",
             "native/forecast/ngram_topk.c"],
    # no FMA contraction: ngram_topk.c's scores are numpy's, bit for bit
    extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-ffp-contract=off", "-Wall",
                        "-Wextra"],
)

# heapcast's allocator (`heapcast run`): its packer, one set of spans per lifetime group, fed by the
# policy runtime (native/policy, compiled in), with glibc's own malloc beside it for what the
# packer does not serve. Nothing else is linked in (no libm, no mimalloc): it is preloaded into
# every program it runs, and a loaded library's pages count in the program's resident memory.
def _alloc_library(name, fallback, libraries):
    return Extension(
        f"heapcast.{name}",
        sources=[f"native/alloc/{src}.c" for src in ("alloc", "classify", "oracle", "pack", "stats",
                                                    fallback)] + policy.sources,
        depends=["native/alloc/alloc.h", "native/alloc/pack.h", "native/alloc/pack_params.h",
                 "native/alloc/exports.map", *policy.depends],
        define_macros=[("HC_HAVE_POLICY_RUNTIME", "1")],
        extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-fno-omit-frame-pointer",
                            "-ftls-model=initial-exec", "-ffp-contract=off", "-pthread", "-Wall",
                            "-Wextra", "-Wno-unused-parameter", "-Wno-frame-address", "-Wno-psabi"],
        extra_link_args=["-pthread", "-Wl,--as-needed", "-ldl",
                         "-Wl,--version-script=native/alloc/exports.map"],
        libraries=libraries,
    )


def _find_header(name):
    dirs = [d for d in os.environ.get("CPATH", "").split(":") if d] + ["/usr/local/include", "/usr/include"]
    return any(os.path.exists(os.path.join(d, name)) for d in dirs)


native_exts = [recorder, lab, codec, drain, policy, stats, forecast,
               _alloc_library("libheapcast_alloc", "fallback_glibc", [])]
# The same allocator with mimalloc beside the packer, or as the backend of every block (`heapcast
# run --backend mimalloc`: one mimalloc heap per lifetime group and thread). Needs Debian's
# libmimalloc-dev; without it the rest installs and `--backend mimalloc` says what is missing.
if _find_header("mimalloc.h"):
    native_exts.append(_alloc_library("libheapcast_alloc_mimalloc", "fallback_mimalloc",
                                      ["mimalloc", "m"]))
else:
    print("heapcast: mimalloc.h not found (Debian: apt-get install libmimalloc-dev): `heapcast run "
          "--backend mimalloc` is not built; everything else is", file=sys.stderr)

setup(ext_modules=native_exts, cmdclass={"build_ext": NativeBuild})
