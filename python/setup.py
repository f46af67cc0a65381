"""The package's build, beside pyproject.toml (which holds everything declarative): only says
that a package carrying libweightbridge.so (`make python` copies it into build/python) is built
for this platform, so a wheel made of it is tagged for it (cp311-cp311-linux_x86_64, not
py3-none-any); the checkout's python/ carries no library and stays pure."""

import os

from setuptools import setup
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
CARRIES_LIB = os.path.exists(os.path.join(HERE, "weightbridge", "libweightbridge.so"))


class _Dist(Distribution):
    def has_ext_modules(self):
        return CARRIES_LIB


setup(distclass=_Dist)
