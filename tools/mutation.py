"""Mutation testing of aioload's core modules, run by hand (not by pytest, not by CI).

Each module is mutated with mutmut 3 (the ``mutation`` extra) in a scratch copy of
the repository, never in the working tree: mutmut writes its mutants, their
trampolines and its caches under the copy's ``mutants/`` folder. Each module runs
with the focused test files that cover it (:data:`MODULES`); mutmut records which of
their tests call each mutated function and runs only those, ``-x``, for each mutant.

mutmut's ``forkserver`` isolation keeps pytest and aioload's own process machinery
out of mutmut's main process: every mutant's tests run in a fresh fork, so the
worker processes a test starts (aioload's fork server, ``spawn`` children) start
with that mutant active and import the mutated copy. Only calls made in the test
process itself count when mutmut maps tests to functions, so a function that runs
only in worker processes has "no tests" unless an in-process test calls it too.

The results go to ``tools/mutation_results.json`` (merged per mutant across runs:
the status of the first run that checked it is kept as ``baseline``) and the report
to ``docs/testing/mutation.md``, with the resolution of every survivor read from
``tools/mutation_notes.toml``: the test that kills it (``--verify`` runs that test
against the mutant and against the unmutated code) or why it is equivalent.

Usage::

    python tools/mutation.py --modules received             # one module, every mutant
    python tools/mutation.py --sample 60                    # every module, 60 mutants each
    python tools/mutation.py --again "survived,no tests"    # once tests were added
    python tools/mutation.py --verify                       # check the notes' killing tests
    python tools/mutation.py --report-only                  # rewrite the report

Run it under ``nice -n 19``: it runs one test process at a time.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import difflib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "tools" / "mutation_results.json"
NOTES = ROOT / "tools" / "mutation_notes.toml"
REPORT = ROOT / "docs" / "testing" / "mutation.md"

# Everything pytest needs besides aioload/ and tests/ (mutmut copies those two).
ALSO_COPY = ["examples/", "benchmarks/", "docs/", "README.md", "mkdocs.yml"]


@dataclasses.dataclass(frozen=True)
class Module:
    """One module to mutate and the focused tests that cover it."""

    path: str
    tests: tuple[str, ...]
    # "-m" expression: "not slow" where the slow tests add time but no kills.
    marker: str = "not slow"


# The focused tests of each module: those written for it, and the loader tests that
# exercise what it does for users (ordering, exactly-once, resume, memory bounds).
MODULES: dict[str, Module] = {
    "received": Module(
        "aioload/pipeline/received.py",
        (
            "tests/test_mutation_kills_received.py",
            "tests/test_checkpoint.py",
            "tests/test_checkpoint_fit.py",
        ),
    ),
    "samplers": Module(
        "aioload/samplers/builtin.py",
        (
            "tests/test_samplers.py",
            "tests/test_sampler_state.py",
            "tests/test_mutation_kills_samplers.py",
        ),
        marker="",  # the torch tests are slow; the others are fast anyway
    ),
    "batch_sampler": Module(
        "aioload/samplers/batch.py",
        (
            "tests/test_samplers.py",
            "tests/test_sampler_state.py",
            "tests/test_mutation_kills_batch_sampler.py",
        ),
    ),
    "checkpoint": Module(
        "aioload/pipeline/checkpoint.py",
        (
            "tests/test_checkpoint.py",
            "tests/test_checkpoint_fit.py",
            "tests/test_mutation_kills_checkpoint.py",
        ),
        marker="",  # a torch test is slow; the others are not marked
    ),
    "scheduler": Module(
        "aioload/pipeline/scheduler.py",
        (
            "tests/test_window_budget.py",
            "tests/test_loader_order.py",
            "tests/test_loader_errors.py",
            "tests/test_loader_hangs.py",
            "tests/test_mutation_kills_scheduler.py",
        ),
    ),
    "mix": Module(
        "aioload/sources/mix.py",
        ("tests/test_mix.py", "tests/test_mutation_kills_mix.py"),
    ),
    "cache": Module(
        "aioload/sources/cache/local.py",
        ("tests/test_sources_cache.py", "tests/test_mutation_kills_cache.py"),
    ),
    "transport": Module(
        "aioload/memory/segments.py",
        ("tests/test_workers.py", "tests/test_mutation_kills_transport.py"),
    ),
    "streamed": Module(
        "aioload/collate/streamed.py",
        ("tests/test_collate_as_read.py", "tests/test_big_batches.py"),
    ),
}

# mutmut's exit-code statuses, folded into the report's columns.
COLUMNS = ("killed", "survived", "timeout", "no tests", "suspicious", "other")


def column(status: str) -> str:
    return status if status in COLUMNS else "other"


def run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
    """Runs ``cmd`` niced, its output appended to ``log``; returns its exit code."""
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        return subprocess.run(
            ["nice", "-n", "19", *cmd], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode


def tracked_files() -> list[str]:
    """The repository's files as git sees them (tracked, and untracked but not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def make_scratch(base: Path, name: str, module: Module, args: argparse.Namespace) -> Path:
    """A copy of the repository with mutmut's settings for ``module`` in its pyproject."""
    scratch = base / name
    if scratch.exists():
        shutil.rmtree(scratch)
    for rel in tracked_files():
        target = scratch / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)
    tests = [t for t in module.tests if (scratch / t).exists()]
    pytest_args = ["-p", "no:cacheprovider", "-o", f"timeout={args.test_timeout}"]
    if module.marker:
        pytest_args += ["-m", module.marker]
    settings = {
        "source_paths": ["aioload"],
        "only_mutate": [module.path],
        "also_copy": ALSO_COPY,
        "pytest_add_cli_args": pytest_args,
        "pytest_add_cli_args_test_selection": tests,
        "process_isolation": "forkserver",
        "timeout_multiplier": args.timeout_multiplier,
        "timeout_constant": args.timeout_constant,
        "use_git_change_detection": False,
    }
    lines = ["", "[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    with (scratch / "pyproject.toml").open("a") as pyproject:
        pyproject.write("\n".join(lines) + "\n")
    return scratch


def mutmut_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Child interpreters (a test's ``python -c``, spawn workers) import the mutated copy,
    # and so does mutmut's own process: the folder exists before it starts, or Python
    # would remember it as missing and find an installed (editable) aioload instead.
    (scratch / "mutants").mkdir(exist_ok=True)
    env["PYTHONPATH"] = str(scratch / "mutants")
    env.pop("MUTANT_UNDER_TEST", None)
    return env


def meta_of(scratch: Path, module: Module) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((scratch / "mutants" / (module.path + ".meta")).read_text())
    return meta


def mutmut() -> list[str]:
    # The venv's console script: ``python -m mutmut`` imports mutmut's main module twice.
    return [str(Path(sys.executable).parent / "mutmut")]


def generate_mutants(scratch: Path, log: Path) -> None:
    """Has mutmut write the mutants (and its test stats) without running any of them."""
    # A run with a pattern that matches no mutant generates the mutants and collects the
    # stats, then stops on that pattern: the mutants are then known by name.
    run(
        [*mutmut(), "run", "--max-children", "1", "__list_only__"],
        scratch,
        mutmut_env(scratch),
        log,
    )


def sample(names: list[str], n: int, seed: int, module_name: str) -> list[str]:
    """``n`` of ``names``, the same ones for the same names, ``n`` and seed."""
    digest = hashlib.sha256(f"{seed}:{module_name}".encode()).digest()
    picked = random.Random(int.from_bytes(digest[:8], "big")).sample(sorted(names), n)
    return sorted(picked)


MESSAGE_CALLS = {"warn", "warning", "debug", "info", "error", "exception", "critical"}


class _BlankMessages(ast.NodeTransformer):
    """Blanks the string constants of ``raise`` statements and warning or log calls."""

    def __init__(self) -> None:
        self.depth = 0

    def _blank_inside(self, node: ast.AST) -> ast.AST:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        return node

    def visit_Raise(self, node: ast.Raise) -> ast.AST:
        return self._blank_inside(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in MESSAGE_CALLS:
            return self._blank_inside(node)
        self.generic_visit(node)
        return node

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if self.depth and isinstance(node.value, str):
            return ast.Constant("")
        return node


def _blanked(function: ast.AST) -> str:
    copy = ast.parse(ast.unparse(function))
    body = copy.body[0]
    assert isinstance(body, ast.FunctionDef | ast.AsyncFunctionDef)
    body.name = "f"
    return ast.dump(_BlankMessages().visit(copy))


@dataclasses.dataclass
class Mutant:
    """One generated mutant: its diff against the original function and where it is."""

    name: str
    removed: list[str]
    added: list[str]
    # lines from the changed line to the end of its function (the line in the real file)
    from_end: int
    message_only: bool
    line: int | None = None


def read_mutants(scratch: Path, module: Module) -> dict[str, Mutant]:
    """The mutants mutmut generated for ``module``, read from its mutated copy."""
    mutated = (scratch / "mutants" / module.path).read_text()
    dotted = module.path.removesuffix(".py").replace("/", ".")
    functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(ast.parse(mutated)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and "__mutmut_" in node.name:
            functions[node.name] = node
    lines = mutated.splitlines()
    found: dict[str, Mutant] = {}
    for name, node in functions.items():
        stem, _, number = name.rpartition("__mutmut_")
        if number == "orig":
            continue
        orig = functions[f"{stem}__mutmut_orig"]
        old, new = _body(lines, orig), _body(lines, node)
        matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
        removed: list[str] = []
        added: list[str] = []
        first: int | None = None
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                removed += old[i1:i2]
                added += new[j1:j2]
                first = i1 if first is None else first
        if first is None:  # the signature changed (a default value)
            removed, added, first = [_signature(orig)], [_signature(node)], -1
        found[f"{dotted}.{name}"] = Mutant(
            name=f"{dotted}.{name}",
            removed=[line.strip() for line in removed],
            added=[line.strip() for line in added],
            from_end=len(old) - 1 - first if first >= 0 else -1,
            message_only=_blanked(orig) == _blanked(node),
        )
    source = (ROOT / module.path).read_text()
    for mutant in found.values():
        mutant.line = locate(source, mutant)
    return found


def _body(lines: list[str], function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return lines[function.body[0].lineno - 1 : function.end_lineno]


def _signature(function: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return (
        "def "
        + function.name.rsplit("__mutmut_", 1)[0].split("ǁ")[-1].removeprefix("x_")
        + ("(" + ast.unparse(function.args) + ")")
    )


def function_span(source: str, mutant: str) -> tuple[int, int] | None:
    """The lines of the function a mutant (``mod.xǁClassǁname__mutmut_3``) changes."""
    local = mutant.rpartition(".")[2].rsplit("__mutmut_", 1)[0]
    if local.startswith("xǁ"):
        _, cls, func = local.split("ǁ")
        path = [cls, func]
    else:
        path = [local.removeprefix("x_")]
    scope: ast.AST = ast.parse(source)
    for part in path:
        match = next(
            (
                child
                for child in ast.walk(scope)
                if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and child.name == part
            ),
            None,
        )
        if match is None:
            return None
        scope = match
    assert isinstance(scope, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
    return scope.lineno, scope.end_lineno or scope.lineno


def locate(source: str, mutant: Mutant) -> int | None:
    """The line of the real file that ``mutant`` changes (its function's, for a default)."""
    span = function_span(source, mutant.name)
    if span is None:
        return None
    if mutant.from_end < 0:
        return span[0]
    return span[1] - mutant.from_end


def pick(mutants: dict[str, Mutant], args: argparse.Namespace, name: str) -> list[str]:
    """The mutants to run: every one that changes more than a message, or a sample."""
    runnable = sorted(m for m, mutant in mutants.items() if not mutant.message_only)
    if args.sample and args.sample < len(runnable):
        return sample(runnable, args.sample, args.seed, name)
    return runnable


def run_module(name: str, args: argparse.Namespace, results: dict[str, Any], base: Path) -> None:
    module = MODULES[name]
    scratch = make_scratch(base, name, module, args)
    log = base / f"{name}.log"
    env = mutmut_env(scratch)
    started = time.monotonic()
    stored = results.setdefault(name, {"mutants": {}})
    generate_mutants(scratch, log)
    mutants = read_mutants(scratch, module)
    if args.again:
        wanted = sorted(
            m for m, r in stored["mutants"].items() if r["status"] in args.again and m in mutants
        )
        if not wanted:
            print(f"{name}: no mutant is {' or '.join(args.again)}")
            return
    else:
        wanted = pick(mutants, args, name)
        messages = sum(1 for m in mutants.values() if m.message_only)
        stored["generated"] = len(mutants)
        stored["message_only"] = messages
        stored["sampled"] = (
            {"n": len(wanted), "of": len(mutants) - messages, "seed": args.seed}
            if len(wanted) < len(mutants) - messages
            else None
        )
    code = run([*mutmut(), "run", "--max-children", "1", *wanted], scratch, env, log)
    meta = meta_of(scratch, module)
    statuses = status_names()
    checked = 0
    for mutant in wanted:
        exit_code = meta["exit_code_by_key"].get(mutant)
        if exit_code is None:
            continue  # not run (mutmut stopped: see the log); an earlier result stands
        checked += 1
        status = statuses.get(exit_code, "suspicious")
        entry = stored["mutants"].setdefault(mutant, {"baseline": status})
        found = mutants[mutant]
        entry.update(status=status, line=found.line, removed=found.removed, added=found.added)
    if checked < len(wanted):
        print(f"{name}: {len(wanted) - checked} mutants not checked: mutmut stopped (see {log})")
    stored["path"] = module.path
    stored["tests"] = list(module.tests)
    stored["marker"] = module.marker
    stored.setdefault("runs", []).append(
        {
            "date": datetime.date.today().isoformat(),
            "mutants": checked,
            "seconds": round(time.monotonic() - started),
            "mutmut_exit": code,
            "again": sorted(args.again),
        }
    )
    save(results)
    counts = tally(stored)
    print(f"{name}: {counts} in {stored['runs'][-1]['seconds']} s (log {log})", flush=True)


def status_names() -> dict[int | None, str]:
    from mutmut.stats import status_by_exit_code

    return dict(status_by_exit_code)


def tally(stored: dict[str, Any]) -> dict[str, int]:
    counts = dict.fromkeys(COLUMNS, 0)
    for entry in stored["mutants"].values():
        counts[column(entry["status"])] += 1
    return counts


def save(results: dict[str, Any]) -> None:
    RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def load() -> dict[str, Any]:
    if RESULTS.exists():
        data: dict[str, Any] = json.loads(RESULTS.read_text())
        return data
    return {}


def notes() -> dict[str, dict[str, Any]]:
    if not NOTES.exists():
        return {}
    return tomllib.loads(NOTES.read_text())


def verify(args: argparse.Namespace, results: dict[str, Any], base: Path) -> bool:
    """Each note's killing test fails with its mutant active and passes without it."""
    ok = True
    for name in args.modules:
        module = MODULES[name]
        stored = results.get(name, {}).get("mutants", {})
        killers = {m: n["killed_by"] for m, n in notes().get(name, {}).items() if "killed_by" in n}
        unknown = sorted(set(killers) - set(stored))
        if unknown:
            print(f"{name}: notes name mutants no run has checked: {unknown}")
            ok = False
        if not killers:
            continue
        scratch = base / name
        log = base / f"{name}-verify.log"
        if (scratch / "mutants" / module.path).exists():
            # The copy of an earlier run: its mutants, with the tests as they are now.
            shutil.copytree(ROOT / "tests", scratch / "mutants" / "tests", dirs_exist_ok=True)
        else:
            scratch = make_scratch(base, name, module, args)
            generate_mutants(scratch, log)
        env = mutmut_env(scratch)
        for mutant, tests in sorted(killers.items()):
            if mutant not in stored:
                continue
            tests = [tests] if isinstance(tests, str) else tests
            cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
            cmd += ["-o", f"timeout={args.test_timeout}", *tests]
            clean = run(cmd, scratch / "mutants", env | {"MUTANT_UNDER_TEST": ""}, log)
            mutated = run(cmd, scratch / "mutants", env | {"MUTANT_UNDER_TEST": mutant}, log)
            verdict = clean == 0 and mutated not in (0, 4, 5)
            ok &= verdict
            print(f"{'ok ' if verdict else 'BAD'} {mutant}: clean {clean}, mutant {mutated}")
            stored[mutant]["verified"] = verdict
        save(results)
    return ok


def md_code(text: str) -> str:
    return "`` " + text.replace("|", "\\|") + " ``"


def mutation_text(entry: dict[str, Any]) -> str:
    """The mutant's changed lines as ``old`` → ``new`` (of a signature, the changed parameter)."""
    old = " ".join(entry.get("removed", [])) or "(nothing)"
    new = " ".join(entry.get("added", [])) or "(nothing)"
    if old.startswith("def ") and new.startswith("def "):
        before, after = old.split(", "), new.split(", ")
        if len(before) == len(after):
            changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
            old = ", ".join(a for a, _ in changed).removeprefix("def ").rstrip(")")
            new = ", ".join(b for _, b in changed).removeprefix("def ").rstrip(")")
    return f"{md_code(old)} → {md_code(new)}"


INTRO = """\
# Mutation testing

A mutation test changes one thing in the code (a `<` into `<=`, a `+ 1` into `+ 2`, a
value into `None`) and runs the tests that cover it: a test that fails *kills* the
mutant; a mutant that every test passes *survives*, and points at a behaviour no test
pins down. `tools/mutation.py` mutates the core modules with
[mutmut](https://mutmut.readthedocs.io/) 3 (the `mutation` extra) in a scratch copy of
the repository, each module with the focused test files that cover it (a mapping in the
script), one test process at a time. It is run by hand, not in CI:

```console
pip install -e '.[test,mutation]'
nice -n 19 python tools/mutation.py --sample 30            # 30 mutants a module
nice -n 19 python tools/mutation.py --modules received      # every mutant of one module
nice -n 19 python tools/mutation.py --again "survived,no tests"   # once tests were added
nice -n 19 python tools/mutation.py --verify                # the notes' killing tests
```

This page is its report (`--report-only` rewrites it from `tools/mutation_results.json`).
Every mutant that survived the first run, or that no focused test reached, is listed
with its resolution, from `tools/mutation_notes.toml`: the new test that kills it
(*verified*: `--verify` ran that test against the mutant, where it fails, and against
the original code, where it passes), or why it cannot be told apart from the original
(*equivalent*) or is not worth a test (*explained*).

How the mutants were chosen: a mutant that changes only the text of an error or
warning message (a string inside a `raise` or a `warn(...)` call) is counted but not
run; the others are run all, or sampled (`--sample N`: the same N for the same seed,
module and code). The sample is small because the run shares two cores with other
work: a surviving mutant costs a full run of its tests, several seconds to a minute.

The first run had the project's tests only; the tests that kill its survivors were
written after it, in `tests/test_mutation_kills_<module>.py` (each module's section lists
them first), and the mutants were run again with them (`--again`).

Only calls made in the test process count when mutmut maps tests to the functions they
reach, so a function that runs only in worker processes has *no tests* unless an
in-process test calls it too; a *timeout* (the tests ran past the per-mutant limit, a
hang) counts as caught.
"""


def resolution(name: str, mutant: str, entry: dict[str, Any]) -> tuple[str, str]:
    """The category of a first-run survivor (killed, equivalent, explained, open) and its text."""
    note = notes().get(name, {}).get(mutant, {})
    if "killed_by" in note and entry["status"] in ("killed", "timeout"):
        tests = note["killed_by"]
        tests = [tests] if isinstance(tests, str) else tests
        text = "killed by " + ", ".join(f"`{t.rpartition('::')[2] or t}`" for t in tests)
        return "killed", text + (" (verified)" if entry.get("verified") else "")
    if entry["status"] in ("killed", "timeout"):
        return "killed", "killed by the focused tests in a later run"
    if "equivalent" in note:
        return "equivalent", "equivalent: " + note["equivalent"]
    if "explained" in note:
        return "explained", "explained: " + note["explained"]
    return "open", "**open**"


def report(results: dict[str, Any]) -> str:
    totals = [0] * 9
    out = [
        INTRO,
        "## Summary",
        "",
        "*Run*: mutants run (of those generated; the others change only a message, or were"
        " not in the sample). *First run*: how they fared before the tests written for the"
        " survivors. *Resolved*: the first run's survivors and untested mutants, killed by"
        " a new test / equivalent or explained / left open.",
        "",
        "| module | generated | run | first run: killed / timeout / survived / no tests "
        "| resolved: killed / equivalent or explained / open |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    sections: list[str] = []
    for name in MODULES:
        stored = results.get(name)
        if not stored or not stored.get("mutants"):
            continue
        mutants = stored["mutants"]
        first = {k: 0 for k in COLUMNS}
        for entry in mutants.values():
            first[column(entry["baseline"])] += 1
        listed = sorted(
            (m for m, e in mutants.items() if e["baseline"] not in ("killed", "timeout")),
            key=lambda m: (mutants[m].get("line") or 0, m),
        )
        resolved = {"killed": 0, "equivalent": 0, "explained": 0, "open": 0}
        rows = []
        for mutant in listed:
            entry = mutants[mutant]
            kind, text = resolution(name, mutant, entry)
            resolved[kind] += 1
            local = mutant.rpartition(".")[2].removeprefix("xǁ").removeprefix("x_")
            short = local.replace("ǁ", ".").replace("__mutmut_", " #")
            rows.append(
                f"| {entry.get('line') or '?'} | `{short}` | {mutation_text(entry)} "
                f"| {entry['baseline']} | {text} |"
            )
        sampled = stored.get("sampled")
        run_text = f"{len(mutants)}" + (f" (sample of {sampled['of']})" if sampled else "")
        messages = stored.get("message_only", 0)
        row = [
            stored.get("generated", len(mutants)),
            len(mutants),
            first["killed"],
            first["timeout"],
            first["survived"],
            first["no tests"],
            resolved["killed"],
            resolved["equivalent"] + resolved["explained"],
            resolved["open"],
        ]
        totals = [t + r for t, r in zip(totals, row, strict=True)]
        out.append(
            f"| `{stored['path']}` | {stored.get('generated', len(mutants))}"
            + (f" ({messages} messages)" if messages else "")
            + f" | {run_text} | {first['killed']} / {first['timeout']} / {first['survived']}"
            f" / {first['no tests']}"
            + (f" (+{first['other'] + first['suspicious']} other)" if first["other"] else "")
            + f" | {resolved['killed']} / {resolved['equivalent'] + resolved['explained']}"
            f" / {resolved['open']} |"
        )
        runs = ", ".join(
            f"{r['date']}: {r['mutants']} mutants in {r['seconds']} s"
            + (f" (again: {', '.join(r['again'])})" if r.get("again") else "")
            + (" (mutmut stopped, see below)" if r["mutmut_exit"] and not r["mutants"] else "")
            for r in stored.get("runs", [])
        )
        sections += [
            "",
            f"## `{stored['path']}`",
            "",
            "Tests: "
            + ", ".join(f"`{t}`" for t in stored["tests"])
            + (f' (`-m "{stored["marker"]}"`)' if stored["marker"] else " (all, slow included)")
            + f". Runs: {runs}.",
            "",
        ]
        if any(r["mutmut_exit"] and not r["mutants"] for r in stored.get("runs", [])):
            sections += [
                "A run stopped before any mutant: a test failed in mutmut's stats run (the",
                "focused tests under its trampolines, no mutant active), which mutmut does",
                "not name; run alone, the same tests passed, and the next run went through.",
                "",
            ]
        if not rows:
            sections.append("Every mutant run was killed.")
            continue
        sections += [
            "| line | mutant | mutation | first run | resolution |",
            "| --- | --- | --- | --- | --- |",
            *rows,
        ]
    out.append(
        f"| all | {totals[0]} | {totals[1]} | {totals[2]} / {totals[3]} / {totals[4]} / "
        f"{totals[5]} | {totals[6]} / {totals[7]} / {totals[8]} |"
    )
    return "\n".join(out + sections) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", default=",".join(MODULES), help="comma-separated names")
    parser.add_argument("--sample", type=int, default=0, help="mutants per module (0: all)")
    parser.add_argument("--seed", type=int, default=30, help="the sample's seed")
    parser.add_argument(
        "--again",
        default="",
        help="re-run the mutants whose last status is one of these (comma-separated, "
        "e.g. 'survived,no tests'), once tests were added",
    )
    parser.add_argument("--verify", action="store_true", help="check the notes' killing tests")
    parser.add_argument("--report-only", action="store_true", help="rewrite the report only")
    parser.add_argument("--test-timeout", type=int, default=30, help="pytest-timeout, seconds")
    parser.add_argument("--timeout-multiplier", type=float, default=3.0)
    parser.add_argument("--timeout-constant", type=float, default=10.0)
    parser.add_argument("--scratch", type=Path, help="folder for the copies (default: a temp dir)")
    args = parser.parse_args()
    args.modules = [m for m in args.modules.split(",") if m]
    args.again = {status.strip() for status in args.again.split(",") if status.strip()}
    unknown = sorted(set(args.modules) - set(MODULES))
    if unknown:
        parser.error(f"unknown modules {unknown}; known: {', '.join(MODULES)}")
    results = load()
    ok = True
    if not args.report_only:
        base = args.scratch or Path(tempfile.mkdtemp(prefix="aioload-mutation-"))
        base.mkdir(parents=True, exist_ok=True)
        print(f"scratch copies and logs in {base}", flush=True)
        if args.verify:
            ok = verify(args, results, base)
        else:
            for name in args.modules:
                run_module(name, args, results, base)
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(report(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
