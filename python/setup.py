"""pip install --no-build-isolation ./python: builds the compiled module with CMake from this
source tree (no network) and ships it with libsketchsgd beside it."""

import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        os.makedirs(build, exist_ok=True)
        config = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                  f"-DPython_EXECUTABLE={sys.executable}", "-DSKETCHSGD_PYTHON=ON",
                  "-DSKETCHSGD_TESTS=OFF", "-DSKETCHSGD_BENCHMARKS=OFF", "-DSKETCHSGD_SERVER=OFF",
                  "-DSKETCHSGD_DEMO=OFF", f"-DSKETCHSGD_CUDA={os.environ.get('SKETCHSGD_CUDA', 'AUTO')}"]
        if shutil.which("ninja"):
            config += ["-G", "Ninja"]
        subprocess.check_call(config)
        subprocess.check_call(["cmake", "--build", build, "--target", "sketchsgd_python",
                               "-j", str(os.cpu_count() or 1)])
        target = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(target, exist_ok=True)
        for module in glob.glob(os.path.join(build, "python", "sketchsgd", "_core*.so")):
            shutil.copy2(module, target)
        # The library under its soname, which the module's RPATH ($ORIGIN) finds beside it.
        shutil.copy2(os.path.realpath(os.path.join(build, "libsketchsgd.so.0")),
                     os.path.join(target, "libsketchsgd.so.0"))


setup(ext_modules=[Extension("sketchsgd._core", sources=[])], cmdclass={"build_ext": CMakeBuild})
