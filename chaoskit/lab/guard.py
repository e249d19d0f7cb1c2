"""Keep this machine's other users out of a lab's networks.

A lab's nodes listen on addresses this machine reaches (the netns and Slurm labs' bridges, the docker lab's
networks): the job's rendezvous store, which unpickles what a client writes, its workers' stores, each node's
sshd. An nftables table of the lab's rejects every packet this machine sends to the lab's networks from a socket
of any user but root (chaoskit's own connections); what the nodes send each other never passes this machine's
output hook. The table's name starts with :data:`GUARD_PREFIX` (not ``chaoskit_``: those are faults' tables).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess

from chaoskit.core.errors import InfraError

__all__ = ["GUARD_PREFIX", "guard_table", "guard", "unguard"]

GUARD_PREFIX = "cklab_guard_"


def guard_table(lab_id: str) -> str:
    """The guard table's name for a lab."""
    return GUARD_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", lab_id)[:48]


def guard(table: str, networks: list[str], allow: list[tuple[str, int]] = ()) -> None:
    """Make (or remake) ``table``: only root may send to ``networks`` (CIDRs) from this machine, but for the
    services in ``allow`` ((address, TCP port): a lab's slurmctld, which every user's ``sbatch`` talks to, with
    munge as its login)."""
    nets = [str(ipaddress.ip_network(n, strict=False)) for n in networks]
    if not nets:
        return
    v4 = [n for n in nets if ":" not in n]
    v6 = [n for n in nets if ":" in n]
    rules = "".join(f"  {'ip6' if ':' in str(ipaddress.ip_address(a)) else 'ip'} daddr {ipaddress.ip_address(a)} "
                    f"tcp dport {int(port)} accept\n" for a, port in allow)
    rules += "".join(f"  {fam} daddr {{ {', '.join(group)} }} meta skuid != 0 reject\n"
                     for fam, group in (("ip", v4), ("ip6", v6)) if group)
    ruleset = (f"table inet {table} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n"
               f"{rules} }}\n}}\n")
    unguard(table)
    res = subprocess.run(["nft", "-f", "-"], input=ruleset, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise InfraError(f"could not keep other users out of the lab's networks: nft: {res.stderr.strip()}",
                         hint="apt-get install nftables")


def unguard(table: str) -> None:
    """Remove ``table`` (idempotent)."""
    if table.startswith(GUARD_PREFIX):
        subprocess.run(["nft", "delete", "table", "inet", table], capture_output=True, text=True, timeout=30)
