"""Run a ``launch: command`` script from the copy chaoskit made of it when it checked it (issue 48, finding 5).

torchrun runs ``python -m chaoskit.workloads.checked_script COPY REAL [ARGS...]`` in each worker: the code is
COPY's (the bytes chaoskit read through the descriptor it checked, written into the job's folder), run as
``__main__`` as Python runs a script, under the name REAL (where the checked script really is): ``sys.argv[0]``,
``__file__`` and tracebacks say REAL, and REAL's folder is first on ``sys.path``, so the modules beside it are
imported and files read relative to ``__file__`` are found as when it ran by its own path.

What is not the checked bytes: modules the script imports and files it reads (the author's, as before), and a
``multiprocessing`` child started with ``spawn`` (it re-reads ``__main__`` from ``__file__``, REAL). Stdlib only:
it runs in the job's Python before the script.
"""

from __future__ import annotations

import os
import sys
import types

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Run COPY's code as REAL's ``__main__`` with ARGS (see the module)."""
    copy, real, *args = sys.argv[1:] if argv is None else argv
    with open(copy, "rb") as fh:
        code = compile(fh.read(), real, "exec")
    module = types.ModuleType("__main__")
    module.__file__ = real
    module.__builtins__ = __builtins__  # type: ignore[attr-defined]
    sys.modules["__main__"] = module  # what pickle and the script's own classes find as __main__
    sys.argv = [real, *args]
    folder = os.path.dirname(real)
    if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] == os.getcwd():
        sys.path[0] = folder  # -m put the working folder there, where Python puts a script's own folder
    else:
        sys.path.insert(0, folder)
    exec(code, module.__dict__)


if __name__ == "__main__":
    main()
