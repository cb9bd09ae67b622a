"""Builds the native recorder (a plain shared library for LD_PRELOAD, not a Python module)."""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class NativeBuild(build_ext):
    """Names the preload library libheapcast_recorder.so instead of a Python extension name."""

    def get_ext_filename(self, ext_name):
        if ext_name.endswith("libheapcast_recorder"):
            return ext_name.replace(".", "/") + ".so"
        return super().get_ext_filename(ext_name)

    def get_export_symbols(self, ext):
        return []  # no PyInit_*: this library is preloaded, never imported


recorder = Extension(
    "heapcast.libheapcast_recorder",
    sources=["native/recorder/recorder.c"],
    extra_compile_args=["-std=gnu11", "-O2", "-fvisibility=hidden", "-fno-omit-frame-pointer",
                        "-ftls-model=initial-exec", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    extra_link_args=["-pthread", "-ldl"],
)

setup(ext_modules=[recorder], cmdclass={"build_ext": NativeBuild})
