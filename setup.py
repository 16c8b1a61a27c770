"""The one build step pyproject.toml cannot say: ragchains.server is the module server.py.

pyproject.toml's package-dir installs the folders at the top of the repository under ragchains
(chains/ as ragchains.chains, ...) and maps ragchains.server to "server": a module's path less
its suffix, which is how setuptools' editable install finds modules (server/, else server.py).
Its build_py looks for modules inside folders only; this one builds a name that package-dir
maps to a file as that one module, so the wheel holds ragchains/server.py as the editable
install imports it.
"""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        module_file = package_dir + ".py"
        if not os.path.isdir(package_dir) and os.path.isfile(module_file):
            parent, _, module = package.rpartition(".")
            return [(parent, module, module_file)]
        return super().find_package_modules(package, package_dir)

    def build_packages(self) -> None:
        # distutils' loop, less its check that each module found lies in the package scanned:
        # a module built from a file lies in the package above its name.
        for package in self.packages or ():
            found = self.find_package_modules(package, self.get_package_dir(package))
            for parent, module, module_file in found:
                self.build_module(module, module_file, parent)


setup(cmdclass={"build_py": BuildPy})
