"""Ships libkiln and the kiln command inside the package, so that `pip install
./python` needs nothing installed by hand beyond scripts/setup.sh: built by CMake in
the build tree $KILN_BUILD_DIR, else the checkout's build/ where it is configured,
else build-python/ (configured here, without the tests). The package's version is
the C library's (CMakeLists.txt's)."""
import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

root = Path(__file__).resolve().parent.parent
version = re.search(r"project\(kiln VERSION ([0-9.]+)", (root / "CMakeLists.txt").read_text()).group(1)


class BuildWithLibkiln(build_py):
    def run(self):
        super().run()
        build = Path(os.environ.get("KILN_BUILD_DIR") or root / "build")
        if "KILN_BUILD_DIR" not in os.environ and not (build / "CMakeCache.txt").exists():
            build = root / "build-python"
        if not (build / "CMakeCache.txt").exists():
            subprocess.check_call(["cmake", "-S", str(root), "-B", str(build), "-DKILN_TESTS=OFF"])
        subprocess.check_call(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1),
                               "--target", "libkiln", "kiln"])
        out = Path(self.build_lib) / "kiln"
        (out / "_lib").mkdir(parents=True, exist_ok=True)
        for name in ("libkiln.so", "kiln"):
            shutil.copy2(build / name, out / "_lib" / name)
        (out / "_version.py").write_text(f'__version__ = "{version}"\n')


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # the wheel holds a shared library: tag it for this platform
        return True


setup(version=version, packages=["kiln"], cmdclass={"build_py": BuildWithLibkiln},
      distclass=BinaryDistribution)
