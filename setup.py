"""The compiled core (shmload/_core/_native.c): built when a C compiler and Python's
headers are present; without them the install goes on and shmload runs pure Python
(``shmload.compiled_core()`` says which, and SHMLOAD_PURE_PYTHON=1 forces pure Python).
Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a missing compiler, missing headers or a
    failed compile leave the pure-Python path, and say so in one line."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # (setuptools raises several kinds: no compiler, a failed spawn...)
            self._skipped(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skipped(exc)

    @staticmethod
    def _skipped(exc):
        first = str(exc).splitlines()[0] if str(exc) else ""
        print(f"shmload: compiled core not built ({type(exc).__name__}: {first}); "
              "using the pure-Python path, which gives the same batches")


def extensions():
    try:
        import numpy
    except ImportError:  # (pyproject's build requirements bring numpy; without it: pure Python)
        return []
    # NPY_TARGET_VERSION: the oldest numpy the built module loads under, the one pyproject.toml allows
    return [Extension("shmload._core._native", ["shmload/_core/_native.c", "shmload/_core/_queue.c",
                                                    "shmload/_core/_views.c"],
                      depends=["shmload/_core/_native.h"], include_dirs=[numpy.get_include()],
                      define_macros=[("NPY_TARGET_VERSION", "NPY_1_22_API_VERSION")],
                      extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                          "-Wno-missing-field-initializers"])]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
