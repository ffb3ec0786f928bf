"""Optional dependencies: which extra installs which package, and the one error a missing extra raises.

The engine (`spekula generate`, `spekula models`, the library) needs only the core dependencies of
pyproject.toml. The rest come in extras, imported only by the code that needs them:

    spekula[server]    `spekula serve` and spekula.server
    spekula[bench]     `spekula bench | tune | audit` and spekula.bench (plots, progress, endpoints, statistics)
    spekula[llamacpp]  the llama.cpp runtime (--backend llamacpp, and a built-in draft's default runtime)

    with needs_extra("bench"):
        from tqdm import tqdm
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from spekula.errors import SpekulaError

# extra -> the modules it installs (import names). pyproject.toml's [project.optional-dependencies]
# lists the same packages by distribution name (tests/unit/test_extras.py holds the two together).
EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "prometheus_client"),
    "bench": ("openai", "tqdm", "matplotlib", "psutil", "scipy"),
    "llamacpp": ("llama_cpp",),
}
NOTES = {"llamacpp": "; it builds llama.cpp from source, which takes minutes"}


class MissingExtra(SpekulaError, ImportError):
    """An optional package is not installed; the message names the extra that installs it."""

    def __init__(self, extra: str, module: str, what: str | None = None) -> None:
        self.extra = extra
        super().__init__(
            f"{what or 'this'} needs {module}, which the {extra!r} extra installs: pip install 'spekula[{extra}]'"
            + NOTES.get(extra, ""),
            name=module,
        )


@contextmanager
def needs_extra(extra: str, what: str | None = None) -> Iterator[None]:
    """Imports in this block come from `extra`: a missing one raises MissingExtra naming the extra.

    `what` says what needed it ("spekula serve"). A missing module that `extra` does not install is
    re-raised as it is: that is a broken installation, not a missing extra.
    """
    try:
        yield
    except ModuleNotFoundError as e:
        module = (e.name or "").partition(".")[0]
        if module not in EXTRAS[extra]:
            raise
        raise MissingExtra(extra, module, what) from e


def require_extra(extra: str, what: str | None = None) -> None:
    """Raise MissingExtra now unless every package of `extra` is installed: a command checks this first,
    so a missing package fails before minutes of model loading rather than after."""
    for module in EXTRAS[extra]:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(extra, module, what)
