"""Builds isrlab: its five packages under one ``isrlab`` namespace, and the native screen.

The top-level folders (broker/, harness/, nemeses/, checkers/, pipeline/) install as
``isrlab.broker``, ``isrlab.harness``, ... (setuptools' package-dir mapping), so nothing
collides with other distributions' generic names; this holds for `pip install -e .` and for the
wheel the harness ships to nodes alike. Everything else is in pyproject.toml.

The compiled parts are the queue checker's screen (Cython, C++), the linearizability search's
loop (Cython, C++) and the log cleaner's record scan (Cython, C): `pip install -e .` builds them
in place; `python setup.py build_ext --inplace`
rebuilds them after an edit of a .pyx (`make` does this before the tests). Without them the
checker and the cleaner run, slower, in Python alone.
"""

from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
FOLDERS = ("broker", "harness", "nemeses", "checkers", "pipeline")
SCREEN = "checkers/queue/_screen.pyx"
CLEANER_SCAN = "broker/log/_cleaner_scan.pyx"
LINEAR_SEARCH = "checkers/linear/_search.pyx"


def _packages(folder: str) -> list[str]:
    """``isrlab.<folder>`` and every directory below it that holds Python modules, with or
    without an ``__init__.py`` (broker/network has none: find_packages would leave it out of
    the wheel, and the nodes' brokers could not import it)."""
    base = ROOT / folder
    subs = {
        p.parent.relative_to(base).parts
        for p in base.rglob("*.py")
        if "__pycache__" not in p.parts and p.parent != base
    }
    return [f"isrlab.{folder}", *sorted(".".join((f"isrlab.{folder}", *s)) for s in subs)]


def _extensions() -> list[Extension]:
    # The harness's node wheel is built from the .py sources alone: no screen there.
    if not (ROOT / SCREEN).exists():
        return []
    from Cython.Build import cythonize

    return cythonize(
        [
            Extension(
                "isrlab.checkers.queue._screen",
                [SCREEN],
                extra_compile_args=["-O2", "-std=c++17"],
                # No C++ compiler: install anyway, and check in Python alone (slower).
                optional=True,
            ),
            # The linearizability search's loop (C++); without it search.py's Python loop.
            *(
                [
                    Extension(
                        "isrlab.checkers.linear._search",
                        [LINEAR_SEARCH],
                        extra_compile_args=["-O2", "-std=c++17"],
                        optional=True,
                    )
                ]
                if (ROOT / LINEAR_SEARCH).exists()
                else []
            ),
            # The log cleaner's record scan (C); without it cleaner_records.py's Python twin.
            *(
                [
                    Extension(
                        "isrlab.broker.log._cleaner_scan",
                        [CLEANER_SCAN],
                        extra_compile_args=["-O2"],
                        optional=True,
                    )
                ]
                if (ROOT / CLEANER_SCAN).exists()
                else []
            ),
        ],
        compiler_directives={"language_level": 3},
    )


setup(
    package_dir={f"isrlab.{f}": f for f in FOLDERS if (ROOT / f).is_dir()},
    packages=[pkg for f in FOLDERS if (ROOT / f).is_dir() for pkg in _packages(f)],
    ext_modules=_extensions(),
)
