"""chaoskit's bootstrap for the training processes of a job chaoskit starts (launch: reference / command).

chaoskit puts this folder first on the job's ``PYTHONPATH``, so every Python process of the job imports it at
start-up. In a torchrun worker (``RANK`` set) with ``$CHAOSKIT_INPROC_DIR`` set it starts the in-process fault
channel's watcher (:mod:`chaoskit.sdk.inproc`, stdlib only; torch is touched only once an order is armed);
anywhere else it does nothing. A ``sitecustomize`` of the job's own further along the path is imported after it,
as Python would have without this one.
"""

import os
import sys

if os.environ.get("CHAOSKIT_INPROC_DIR") and os.environ.get("RANK", "").isdigit():
    _here = os.path.dirname(os.path.abspath(__file__))
    _added = False
    try:
        import importlib.util

        if importlib.util.find_spec("chaoskit") is None:  # a job's own Python without chaoskit: the package beside this folder
            sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(_here))))
            _added = True
        from chaoskit.sdk import probe as _probe  # noqa: F401 - what the channel's events go through
        from chaoskit.sdk import inproc as _inproc

        _inproc.start()
    except Exception as _exc:  # noqa: BLE001 - the bootstrap never stops the job from starting
        print(f"chaoskit: in-process fault channel not started: {type(_exc).__name__}: {_exc}", file=sys.stderr)
    finally:
        if _added:
            sys.path.pop()


def _chain():
    """Import the next ``sitecustomize`` on the path (the job's or the environment's own), if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_chain()
