"""Builds the compiled part of isrlab: the queue checker's native screen (Cython, C++).

Everything else is in pyproject.toml. `pip install -e .` builds it in place;
`python setup.py build_ext --inplace` rebuilds it after an edit of the .pyx (`make`
does this before the tests). Without it the checker runs, slower, in Python alone.
"""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "checkers.queue._screen",
                ["checkers/queue/_screen.pyx"],
                extra_compile_args=["-O2", "-std=c++17"],
                # No C++ compiler: install anyway, and check in Python alone (slower).
                optional=True,
            )
        ],
        compiler_directives={"language_level": 3},
    )
)
