"""torchrun with lm-resiliency's rendezvous backend registered: ``python torchrun_lmr.py <torchrun's arguments>``.

lm-resiliency 0.2.0 declares its backend as the entry point
``lm_resiliency = lm_resiliency.integrations.torchrun:create_rendezvous_handler`` (its wheel's
entry_points.txt), but torchrun (torch/distributed/elastic/rendezvous/registry.py,
_register_out_of_tree_handlers) calls what an entry point names with no argument and registers the creator it
returns. create_rendezvous_handler wants the rendezvous parameters, so plain ``torchrun --rdzv-backend
lm_resiliency`` fails with "TypeError: create_rendezvous_handler() missing 1 required positional argument:
'params'" then "ValueError: The rendezvous backend 'lm_resiliency' is not registered". The package's own
get_rendezvous_handler_creator is the function torchrun expects; registering its creator by hand is all this
does before handing over to torchrun's main.
"""

from __future__ import annotations

import sys

from lm_resiliency.integrations.torchrun import get_rendezvous_handler_creator
from torch.distributed.elastic.rendezvous import rendezvous_handler_registry
from torch.distributed.run import main

if __name__ == "__main__":
    rendezvous_handler_registry.register("lm_resiliency", get_rendezvous_handler_creator())
    sys.exit(main())
