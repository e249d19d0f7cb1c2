"""The programs chaoskit runs on a node are real modules (chaoskit/nodeside): stdlib only, importable here without
running anything, and the job-scope rule the agent and the crash loop share is one function, tested here as plain
Python. Their behaviour on a node is tested where each fault is (test_gpu_faults, test_oom_faults, ...)."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import sys

import chaoskit
import chaoskit.nodeside
from chaoskit.nodeside.jobscope import job_marks, job_owns, uid_of
from tests.conftest import ROOT

STDLIB = set(sys.stdlib_module_names)


def test_every_node_program_is_stdlib_only_and_imports_without_running():
    names = [m.name for m in pkgutil.iter_modules(chaoskit.nodeside.__path__)]
    assert {"jobscope", "crashloop", "storage_tool", "memory_tool", "ballast", "cpu_tool", "nodefs", "procstat", "agent",
            "watchdog"} <= set(names)
    for name in names:
        source = chaoskit.nodeside.source(name)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                roots = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            # a sibling of this package: on a node its source is bundled in front (nodefs.bundle), and only the
            # controller, importing the program, takes this import (the agent's and the watchdog's fallback)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("chaoskit.nodeside."):
                continue
            # regex: the crash loop's bounded matcher where the node has it (else re with SIGALRM); mfusepy: the
            # storage io daemon's FUSE binding, imported only by its server (the node needs chaoskit[fuse] for it)
            assert roots <= STDLIB | {"regex", "mfusepy"}, f"nodeside/{name}.py imports {roots - STDLIB} (a node has the stdlib only)"
        before = set(sys.modules)
        module = importlib.import_module(f"chaoskit.nodeside.{name}")
        assert not {m for m in set(sys.modules) - before if m.startswith("chaoskit.") and not m.startswith("chaoskit.nodeside.")}


def test_no_python_program_hides_in_a_string_literal():
    """Node programs are files (linted, reviewed); only short ``-c`` lines (the agent's boot, Ray's launcher) are
    programs in a string."""
    found = []
    for path in (ROOT / "chaoskit").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                text = node.value
                if text.count("\n") > 5 and ("\nimport " in "\n" + text or "\ndef " in "\n" + text):
                    try:
                        ast.parse(text)
                    except SyntaxError:
                        continue
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, found


def test_the_job_scope_rule():
    job = {"run_id": "ours", "uid": 1000, "slurm_job": None, "pending": False}
    worker = {"TORCHELASTIC_RUN_ID": "ours", "RANK": "1"}
    assert job_marks(1000, worker, job) and job_owns(1000, worker, job)
    assert not job_marks(1001, worker, job), "another uid's process with our run id"
    assert not job_marks(1000, {**worker, "TORCHELASTIC_RUN_ID": "theirs"}, job)
    assert job_owns(1000, {}, job) and not job_marks(1000, {}, job), "an agent (no run id) is owned, not marked"
    assert not job_marks(1000, worker, {**job, "pending": True}), "nothing is the job's while it is being chosen"
    slurm = {**job, "slurm_job": "42"}
    assert job_owns(1000, {"SLURM_JOB_ID": "42"}, slurm) and not job_owns(1000, {"SLURM_JOB_ID": "43"}, slurm)
    assert uid_of(os.getpid()) == os.getuid() and uid_of(2 ** 22 + 7) is None


def test_the_agent_and_the_crash_loop_carry_the_same_rule():
    """Both programs, as the controller bundles them, define the rule once: jobscope's source, then their own."""
    from chaoskit.cluster.transports.channel import agent_program
    from chaoskit.faults.gpu import CRASHLOOP

    rule = chaoskit.nodeside.source("jobscope")
    agent = agent_program(None).decode()
    for program in (agent, CRASHLOOP):
        assert program.count(rule) == 1
        assert program.count("def job_marks(") == 1 and program.count("def job_owns(") == 1
