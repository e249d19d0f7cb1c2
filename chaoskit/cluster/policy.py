"""A cluster's site policy: what drills on it may do, set by the cluster's owners.

An inventory carries it inline (``policy: {...}``) or names a file (``policy: FILE``,
relative to the inventory). Scenarios are written by many people; the policy is the
cluster owners' word on what those scenarios may ask of root on the nodes. A scenario
that asks for more is refused by ``chaoskit validate`` (and by ``run``, which validates
first) at its own line, before anything connects. Example::

    policy:
      faults: [process.kill, process.freeze, network.*]   # allowed kinds (shell-style patterns)
      slurm: false                                        # no slurm.* fault, whatever faults: says
      log_roots: [/var/log/train]                         # probes.log_files.path must lie under one
      checkpoint_roots: [/scratch/ckpt]                   # workload.checkpoint_dir must lie under one
      python: [/usr/bin/python3]                          # the only ssh.python the agent may run
      max_nodes: 2                                        # safety.max_nodes and each fault's targets
      launches: [reference, attach]                       # no author's program runs (not command, not sbatch)
      script_roots: [/srv/gameday]                        # workload.command / script, compose files: inside one
      env: [PYTHONPATH]                                   # workload.env may set these LD_*/PYTHON* names too
      prometheus_urls: [http://prom.example:9090]         # every Prometheus / Pushgateway URL: under one

A policy file is refused when anyone but its owner can write it, when its folder is
writable by anyone but its owner, or when it is a symbolic link: a policy that a
scenario's author could rewrite would be no policy. An unset field allows what
chaoskit allows without a policy.

A scenario's author can write an inventory of their own, with no ``policy:``. So a
controller (a site's login node, its CI runner) also has a machine-wide policy,
:data:`SITE_POLICY_FILE` (``/etc/chaoskit/policy.yaml``, root's, trusted as above): when
it exists it applies to every inventory run from this machine, and an inventory's own
policy can only narrow it (:func:`narrowest`). It applies to the built-in labs too (their
``workload.command``, compose files and log files are the author's as much as an inventory is).

``CHAOSKIT_SITE_POLICY=FILE`` (:data:`SITE_POLICY_ENV`) names one more policy, trusted like this
machine's (root's, nobody else can write it or its folder): it can only narrow, never replace, the
one at :data:`SITE_POLICY_FILE`, so whoever can set a run's environment (a CI job's author) gains
nothing by pointing it at a permissive file, and one that is not root's refuses every run. (Tests
and sites that keep several policies use it.) Where a policy came from travels with it (:func:`origin`):
``validate`` and ``doctor`` say which one applied.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import stat
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, PrivateAttr, ValidationError, field_validator

from chaoskit.core.errors import ScenarioError
from chaoskit.core.limits import MAX_COUNT
from chaoskit.core.models import StrictModel, check_each, check_http_url
from chaoskit.core.shell import check_path
from chaoskit.core.state import lstat_no_link
from chaoskit.core.yaml_source import SourceMap, load_yaml, validation_errors

__all__ = ["SitePolicy", "JobsRule", "SITE_POLICY_FILE", "SITE_POLICY_ENV", "load_policy_file", "site_policy", "narrowest",
           "validate_policy", "under_roots", "under_urls", "policy_file_problem", "origin", "with_origin"]

SITE_POLICY_FILE = Path("/etc/chaoskit/policy.yaml")
"""This machine's policy for every run from it (root's; absent: none)."""
SITE_POLICY_ENV = "CHAOSKIT_SITE_POLICY"
"""A second policy file, root's, that narrows :data:`SITE_POLICY_FILE`'s (never replaces it)."""

_KIND_PATTERN = r"^[a-z0-9_.*?\[\]-]{1,64}$"
Launch = Literal["reference", "uninstrumented", "command", "ray-train", "attach", "sbatch"]


class JobsRule(StrictModel):
    """Whose jobs a drill may attach to (each list unset: any)."""

    users: list[str] | None = Field(None, description="User names (or uids) whose jobs may be drilled.")
    accounts: list[str] | None = Field(None, description="Slurm accounts whose jobs may be drilled.")
    partitions: list[str] | None = Field(None, description="Slurm partitions whose jobs may be drilled.")

    @field_validator("users", "accounts", "partitions")
    @classmethod
    def _names(cls, v: list[str] | None) -> list[str] | None:
        return check_each(v, r"[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}", "name")

    def refuses_slurm(self, fields: dict[str, str]) -> str | None:
        """Why the Slurm job whose ``scontrol`` fields these are may not be drilled, or ``None``."""
        user = (fields.get("UserId") or "").split("(")[0]
        uid = (fields.get("UserId") or "").partition("(")[2].rstrip(")")
        if self.users is not None and user not in self.users and uid not in self.users:
            return f"its user {fields.get('UserId') or '?'} is not one of the site policy's jobs.users ({', '.join(self.users)})"
        for key, allowed in (("Account", self.accounts), ("Partition", self.partitions)):
            if allowed is not None and fields.get(key) not in allowed:
                return (f"its {key.lower()} {fields.get(key) or '?'} is not one of the site policy's "
                        f"jobs.{key.lower()}s ({', '.join(allowed)})")
        return None


class SitePolicy(StrictModel):
    """What drills on this cluster may do (unset: no limit beyond chaoskit's own)."""

    faults: list[str] | None = Field(None, description=(
        "Fault kinds a scenario may use, as shell-style patterns (process.kill, network.*); default any."))
    slurm: bool = Field(True, description="false: no slurm.* fault (drain, requeue) on this cluster, whatever faults: allows.")
    log_roots: list[str] | None = Field(None, description=(
        "Absolute folders on the nodes; every probes.log_files.path must be an absolute path inside one."))
    checkpoint_roots: list[str] | None = Field(None, description=(
        "Absolute folders on the nodes; workload.checkpoint_dir must be inside one."))
    python: list[str] | None = Field(None, description=(
        "The Pythons the node agent may run (ssh.python): absolute paths of a root-owned interpreter that nobody "
        "else can write; checked at load, and on each node when the agent starts."))
    max_nodes: int | None = Field(None, ge=1, le=MAX_COUNT, description=(
        "The most nodes one drill may touch: safety.max_nodes, each fault's targets and all faults together."))
    ssh_roots: list[str] | None = Field(None, description=(
        "Absolute folders on this machine: every ssh.config (and what it includes), ssh.key and ssh.known_hosts "
        "must lie inside one; default the operator's ~/.ssh and the inventory's folder."))
    power_programs: list[str] | None = Field(None, description=(
        "Absolute paths of the programs a node's power: commands may run (on this machine, as the operator); "
        "default any program only root can change."))
    ray_addresses: list[str] | None = Field(None, description=(
        "The Ray clusters (HOST:PORT, or auto) an inventory's ray: may join as a driver; default any."))
    jobs: JobsRule | None = Field(None, description=(
        "Whose jobs launch: attach may drill: users (checked against the job's uid on the node), Slurm accounts and "
        "partitions (checked against Slurm's record of workload.slurm_job); default anyone's. users also bounds "
        "whom launch: sbatch submits a batch script as."))
    launches: list[Launch] | None = Field(None, description=(
        "The workload launches a drill may use (reference, uninstrumented, command, ray-train, attach, sbatch); "
        "default any. Leave out command and sbatch to run no program an author wrote (on a lab too)."))
    script_roots: list[str] | None = Field(None, description=(
        "Absolute folders on this machine: workload.command's script, workload.script (launch: sbatch) and a "
        "docker lab's compose file must lie inside one, links resolved; default anywhere."))
    env: list[str] | None = Field(None, description=(
        "Shell-style patterns of the LD_* and PYTHON* variables (what code a process loads: LD_PRELOAD, PYTHONPATH, "
        "...) that a scenario's workload.env may set or unset; default none of them. Other names need no leave."))
    prometheus_urls: list[str] | None = Field(None, description=(
        "http(s) URL prefixes: every Prometheus a scenario queries (probes.prometheus url, safety.stop_when "
        "prometheus) and every Pushgateway a --push names must lie under one (same scheme, host and port, its path "
        "inside the prefix's on a '/' boundary); default any."))
    _origin: list[str] = PrivateAttr(default_factory=list)
    """Where it was read: each file (or inventory's inline policy) that narrowed it, widest first."""

    @field_validator("faults")
    @classmethod
    def _kinds(cls, v: list[str] | None) -> list[str] | None:
        return check_each(v, _KIND_PATTERN, "fault kind pattern")

    @field_validator("env")
    @classmethod
    def _env_patterns(cls, v: list[str] | None) -> list[str] | None:
        return check_each(v, r"[A-Za-z_*?][A-Za-z0-9_*?]{0,127}", "variable name pattern",
                          "letters, digits, _ and the wildcards * and ?")

    @field_validator("ray_addresses")
    @classmethod
    def _addresses(cls, v: list[str] | None) -> list[str] | None:
        for address in v or []:
            if address != "auto" and not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]{1,255}:\d{1,5}", address):
                raise ValueError(f"{address!r} is neither auto nor HOST:PORT")
        return v

    @field_validator("prometheus_urls")
    @classmethod
    def _urls(cls, v: list[str] | None) -> list[str] | None:
        for url in v or []:
            check_http_url(url, "prometheus_urls prefix")
            if _dot_segments(urlsplit(url).path):
                raise ValueError(f"prometheus_urls prefix {url!r}: no '.' or '..' in its path")
        return v

    @field_validator("log_roots", "checkpoint_roots", "python", "ssh_roots", "power_programs", "script_roots")
    @classmethod
    def _absolute(cls, v: list[str] | None) -> list[str] | None:
        for path in v or []:
            check_path(path)
            if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or "/../" in path + "/":
                raise ValueError(f"{path!r} is not a plain absolute path (no '..', no '//', no trailing '/.')")
        return v

    def allows_kind(self, kind: str) -> str | None:
        """Why ``kind`` is not allowed here, or ``None``."""
        if kind.startswith("slurm.") and not self.slurm:
            return f"the site policy allows no slurm.* fault on this cluster (policy slurm: false), so not {kind}"
        if self.faults is not None and not any(fnmatch.fnmatchcase(kind, p) for p in self.faults):
            return f"the site policy does not allow {kind} on this cluster (allowed: {', '.join(self.faults) or 'none'})"
        return None

    def allows_url(self, url: str) -> str | None:
        """Why the Prometheus or Pushgateway at ``url`` is not allowed here, or ``None``."""
        if self.prometheus_urls is None or under_urls(url, self.prometheus_urls):
            return None
        return (f"{url} is not under the site policy's prometheus_urls "
                f"({', '.join(self.prometheus_urls) or 'none'}); chaoskit talks to those servers only")


def _jobs(a: "JobsRule | None", b: "JobsRule | None", both: Any) -> "JobsRule | None":
    if a is None or b is None:
        return b if a is None else a
    return JobsRule(users=both(a.users, b.users), accounts=both(a.accounts, b.accounts),
                    partitions=both(a.partitions, b.partitions))


def under_roots(path: str, roots: list[str]) -> bool:
    """Whether ``path`` (absolute, no ``..``) names a file inside one of ``roots`` (or a root itself)."""
    if not path.startswith("/") or ".." in path.split("/"):
        return False
    norm = posixpath.normpath(path)
    return any(norm == root.rstrip("/") or norm.startswith(root.rstrip("/") + "/") for root in roots)


def under_urls(url: str, prefixes: list[str]) -> bool:
    """Whether the http(s) ``url`` lies under one of ``prefixes``: the same scheme, host and port (an absent port
    being the scheme's), and a path equal to the prefix's or inside it on a ``/`` boundary. Compared parsed, never as
    text, so ``http://prom:9090`` covers neither ``http://prom:9090.evil.com`` nor ``http://prom:90901``; a URL
    with a user, a query, a fragment or a ``.``/``..`` segment in its path (even %-encoded) is under none."""
    mine = _url_key(url)
    if mine is None:
        return False
    scheme, host, port, path = mine
    for prefix in prefixes:
        theirs = _url_key(prefix)
        if theirs is None or theirs[:3] != (scheme, host, port):
            continue
        root = theirs[3].rstrip("/")
        if path == root or path.startswith(root + "/"):
            return True
    return False


def _url_key(url: str) -> tuple[str, str, int, str] | None:
    try:
        check_http_url(url)
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}[parts.scheme]
    except (ValueError, KeyError):
        return None
    if _dot_segments(parts.path):
        return None
    return parts.scheme, parts.hostname or "", port, parts.path


def _dot_segments(path: str) -> bool:
    # the server would resolve them: /allowed/../admin is /admin (and %2e%2e is ..)
    return any(seg in (".", "..") for seg in unquote(path).replace("\\", "/").split("/"))


def policy_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be trusted as a policy, or ``None``: a link, not a regular file, writable
    by anyone but its owner, or in a folder that anyone but its owner (or root) can write."""
    st = lstat_no_link(path, unreadable="cannot read policy file {path}: {error}",
                       link="policy file {path} is a symbolic link; name the file itself")
    if isinstance(st, str):
        return st
    if not stat.S_ISREG(st.st_mode):
        return f"policy file {path} is not a regular file"
    if st.st_mode & 0o022:
        return (f"policy file {path} is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):04o}); only its owner may write it: chmod go-w")
    folder = path.parent
    fst = os.stat(folder)
    if fst.st_mode & 0o022 or fst.st_uid not in (0, st.st_uid):
        return (f"the folder of policy file {path} ({folder}, mode {stat.S_IMODE(fst.st_mode):04o}, uid {fst.st_uid}) "
                "can be written by someone other than the file's owner, who could replace it")
    return None


def load_policy_file(path: Path) -> "SitePolicy | list[ScenarioError]":
    """The policy in ``path``, or the errors that refuse it (its trust first, then its format)."""
    problem = policy_file_problem(path)
    if problem:
        return [ScenarioError(problem)]
    data, smap = load_yaml(path, what="policy")
    if isinstance(data, dict) and set(data) == {"policy"}:
        data = data["policy"]
        smap = _strip(smap, "policy")
    return validate_policy(data, smap)


def validate_policy(data: Any, smap: SourceMap) -> "SitePolicy | list[ScenarioError]":
    """A policy document read by :func:`~chaoskit.core.yaml_source.load_yaml`, or its errors at their lines."""
    if not isinstance(data, dict):
        return [ScenarioError("a site policy is a mapping (faults:, log_roots:, max_nodes:, ...)", pos=smap.at(()))]
    try:
        return SitePolicy.model_validate(data)
    except ValidationError as exc:
        return validation_errors(exc, data, smap, SitePolicy)


def _strip(smap: SourceMap, key: str) -> SourceMap:
    """The map of a document's ``key:`` value, as if it were the whole document."""
    def cut(table: dict) -> dict:
        return {p[1:]: pos for p, pos in table.items() if p[:1] == (key,)}
    return SourceMap(smap.file, cut(smap.values), cut(smap.keys))


def site_policy(path: Path | None = None) -> "SitePolicy | None | list[ScenarioError]":
    """This machine's policy: :data:`SITE_POLICY_FILE` (or ``path``) narrowed by the one :data:`SITE_POLICY_ENV`
    names; ``None`` when there is neither, else the policy, or the errors that refuse it (a machine-wide
    policy must also be root's: another user's is no site's word)."""
    files = [SITE_POLICY_FILE if path is None else Path(path)]
    named = os.environ.get(SITE_POLICY_ENV) if path is None else None
    if named:
        if not os.path.isabs(named):
            return [ScenarioError(f"{SITE_POLICY_ENV}={named!r}: name an absolute path (a root-owned policy file)")]
        files.append(Path(named))
    found: SitePolicy | None = None
    for i, file in enumerate(files):
        res = _machine_file(file, required=i > 0)
        if isinstance(res, list):
            return res
        if res is not None:
            found = res if found is None else narrowest(found, res)
    return found


def _machine_file(path: Path, required: bool) -> "SitePolicy | None | list[ScenarioError]":
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not required:
            return None
        return [ScenarioError(f"{SITE_POLICY_ENV} names {path}, which does not exist; every run is refused until it "
                              "names root's policy file or is unset")]
    except OSError as exc:
        return [ScenarioError(f"cannot read this machine's site policy {path}: {exc.strerror}")]
    if st.st_uid != 0 and not stat.S_ISLNK(st.st_mode):
        return [ScenarioError(f"this machine's site policy {path} is owned by uid {st.st_uid}, not root; "
                              "it is refused (and so is every run until root owns it or removes it)")]
    res = load_policy_file(path)
    if isinstance(res, list):
        for err in res:
            if err.pos is None:
                err.message = f"{err.message} (this machine's site policy)"
        return res
    return with_origin(res, [f"{path} (this machine's{', named by ' + SITE_POLICY_ENV if required else ''})"])


def with_origin(policy: SitePolicy, where: list[str]) -> SitePolicy:
    """``policy``, saying it was read from ``where``."""
    policy._origin = list(where)
    return policy


def origin(policy: "SitePolicy | None") -> str:
    """Which policy applied, from where, in one line (what ``validate`` and ``doctor`` print)."""
    if policy is None:
        return f"no site policy (none at {SITE_POLICY_FILE}, none in the inventory): chaoskit's own limits only"
    where = policy._origin or ["an inventory's policy"]
    return "site policy " + ", narrowed by ".join(where)


def narrowest(site: SitePolicy, own: SitePolicy | None) -> SitePolicy:
    """What both policies allow: this machine's (``site``) narrowed by an inventory's own (``own``).

    Kinds: the patterns of each that the other's patterns allow (exact for names and simple patterns such
    as ``network.*``); roots: the folders inside a root of both; Prometheus URL prefixes: those under a prefix of
    both (``http://prom:9090/team`` of it and ``http://prom:9090``); Pythons, programs, addresses, launches and
    users: those both name; ``max_nodes``:
    the smaller; ``slurm``: only if both allow it. An empty list allows nothing."""
    if own is None:
        return site

    def kinds(a: list[str] | None, b: list[str] | None) -> list[str] | None:
        if a is None or b is None:
            return b if a is None else a
        both = [p for p in b if any(fnmatch.fnmatchcase(p, q) for q in a)]
        both += [p for p in a if any(fnmatch.fnmatchcase(p, q) for q in b) and p not in both]
        return both

    def roots(a: list[str] | None, b: list[str] | None) -> list[str] | None:
        if a is None or b is None:
            return b if a is None else a
        both = [r for r in b if under_roots(r, a)]
        return both + [r for r in a if under_roots(r, b) and r not in both]

    def urls(a: list[str] | None, b: list[str] | None) -> list[str] | None:
        if a is None or b is None:
            return b if a is None else a
        both = [u for u in b if under_urls(u, a)]
        return both + [u for u in a if under_urls(u, b) and u not in both]

    def pythons(a: list[str] | None, b: list[str] | None) -> list[str] | None:
        if a is None or b is None:
            return b if a is None else a
        return [p for p in b if p in a]

    caps = [n for n in (site.max_nodes, own.max_nodes) if n is not None]
    both = SitePolicy(faults=kinds(site.faults, own.faults), slurm=site.slurm and own.slurm,
                      log_roots=roots(site.log_roots, own.log_roots),
                      checkpoint_roots=roots(site.checkpoint_roots, own.checkpoint_roots),
                      python=pythons(site.python, own.python), max_nodes=min(caps) if caps else None,
                      ssh_roots=roots(site.ssh_roots, own.ssh_roots),
                      power_programs=pythons(site.power_programs, own.power_programs),
                      ray_addresses=pythons(site.ray_addresses, own.ray_addresses),
                      jobs=_jobs(site.jobs, own.jobs, pythons),
                      launches=pythons(site.launches, own.launches),  # type: ignore[arg-type]
                      script_roots=roots(site.script_roots, own.script_roots),
                      env=kinds(site.env, own.env),
                      prometheus_urls=urls(site.prometheus_urls, own.prometheus_urls))
    return with_origin(both, site._origin + own._origin)
