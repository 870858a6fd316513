"""
Put the fixed members in place in this interpreter, or take them out again.

All or nothing per process (a fixed scheduler beside stock producers strands events): at
the first import of a target, every target is judged (imported ones by their live members,
the others by their files, without importing them); if any is refused, none is patched and
one already patched is restored. A target is patched only on a supported Airflow whose
replaced members are the pristine ones (source fingerprint); idle when its source already
has the fix. Originals are kept once (first wins), so ``unpatch_module`` restores them
exactly. What is logged, and when: docs/activation.md, "What the shim guarantees".
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections import namedtuple
from types import ModuleType

from airflow_dataset_race_fix.targets import (
    SUPPORTED_AIRFLOW_VERSIONS,
    TARGET_MODULES,
    Member,
    environment_problem,
    fingerprint,
    members_of,
    release_of,
)

log = logging.getLogger("airflow_dataset_race_fix")

MARKER = "__airflow_dataset_race_fix_patched__"
_MISSING = object()

PATCHED = "patched"  # fixed members installed by this interpreter
PATCHABLE = "patchable"  # pristine Airflow code, not patched in this interpreter
SOURCE_PATCHED = "source-patched"  # the module's source already carries the fix
REFUSED = "refused"  # left untouched, see detail
PENDING = "pending"  # module not imported yet


class RefusedError(RuntimeError):
    """Raised in strict mode when a target cannot be patched."""


# A named tuple, not a frozen dataclass: cheaper to define, in every process that imports this module.
ModuleState = namedtuple("ModuleState", "module state detail", defaults=("",))


# (module, owner, name) -> original class attribute (or _MISSING); first original wins.
_originals: dict[tuple[str, str, str], object] = {}
_states: dict[str, ModuleState] = {}
# The refusal that keeps every target of this process unpatched (the first one found).
_refusal: ModuleState | None = None
# Reporting is once per process (hooks, apply() and reloads may see the same module again).
_announced: set[str] = set()  # targets whose "fix in place" line is logged
_warned = False  # the refusal's WARNING
_warned_half_source = False


def _forget_reports() -> None:
    """A forked child (LocalExecutor's task, a task runner's raw task) has its own task log: say it again."""
    global _warned
    _announced.clear()
    _warned = False


os.register_at_fork(after_in_child=_forget_reports)

# 'airflow' CLI commands that run for a while; every other one logs "fix in place" at DEBUG.
LONG_RUNNING_COMMANDS = tuple(
    tuple(command.split())
    for command in (
        "scheduler",
        "triggerer",
        "webserver",
        "dag-processor",
        "standalone",
        "celery worker",
        "tasks run",
        "tasks test",
        "dags test",
    )
)


def airflow_version() -> str | None:
    airflow = sys.modules.get("airflow")
    version = getattr(airflow, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("apache-airflow")
        except Exception:
            return None
    return version


def _fixed_attribute(member: Member) -> object:
    fixed_owner = getattr(importlib.import_module(member.fix_module), member.owner)
    return vars(fixed_owner)[member.name]


def _fingerprint_or_none(attribute: object) -> str | None:
    """Fingerprint, or None when the source cannot be read (defined in ``-c``, a REPL, a zip)."""
    try:
        return fingerprint(attribute)
    except (OSError, TypeError):
        return None


def _classify(module: ModuleType) -> ModuleState:
    """Decide, without changing anything, what patching the imported ``module`` would do."""

    def found(member: Member) -> tuple[bool, str | None, str]:
        owner = getattr(module, member.owner, None)
        current = vars(owner).get(member.name, _MISSING) if owner is not None else _MISSING
        if current is _MISSING:
            return False, None, "missing"
        sha = _fingerprint_or_none(current)
        if sha is None:
            return True, None, f"a replacement whose source cannot be read ({current!r})"
        return True, sha, f"sha256 {sha[:12]}"

    state = _judge(module.__name__, found, lambda member: fingerprint(_fixed_attribute(member)))
    if state.state == PATCHABLE:
        for member in members_of(module.__name__):
            try:
                _fixed_attribute(member)  # loaded now, so that patching cannot fail half way
            except Exception as err:
                return _unloadable(member, err)
    bypass = _custom_manager_bypass(module) if state.state != REFUSED else None
    return ModuleState(module.__name__, REFUSED, bypass) if bypass else state


def _custom_manager_bypass(module: ModuleType) -> str | None:
    """Why the instance of ``[core] dataset_manager_class`` that Airflow uses would run its own code instead
    of the fixed members, or None (the stock class, or a subclass that inherits every fixed member)."""
    custom = type(getattr(module, "dataset_manager", None))
    mro, base = custom.__mro__, getattr(module, "DatasetManager", None)
    own = mro[: mro.index(base)] if base in mro else mro[:-1]  # a class not derived from it: all but object
    overridden = [m.name for m in members_of(module.__name__) if any(m.name in vars(cls) for cls in own)]
    if not overridden:
        return None
    return (
        f"[core] dataset_manager_class is {custom.__module__}.{custom.__qualname__}, which overrides "
        f"the fixed DatasetManager.{', '.join(overridden)}: its own code would run instead of the fix, a "
        "producer without it beside fixed schedulers. Nothing was patched: drop the override (a subclass "
        "that overrides no fixed member inherits the fix), or leave dataset_manager_class unset"
    )


def _target_file(name: str) -> str | None:
    """The source file that importing ``name`` would run, found without importing anything."""
    from importlib.machinery import PathFinder

    path = None
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        package = sys.modules.get(prefix)
        spec = (
            getattr(package, "__spec__", None) if package is not None else PathFinder.find_spec(prefix, path)
        )
        if spec is None:
            return None
        if depth == len(parts):
            return spec.origin if spec.has_location else None
        path = spec.submodule_search_locations
        if path is None:
            return None
    return None


def _classify_file(name: str) -> ModuleState | None:
    """What patching ``name`` would do, judged by its file on disk (None: cannot tell from it)."""
    from airflow_dataset_race_fix.source_patches import members

    path = _target_file(name)
    try:
        with open(path, encoding="utf-8") as source:  # type: ignore[arg-type]
            lines = source.read().splitlines(keepends=True)
        for owner in {m.owner for m in members_of(name)}:
            members.member_starts(lines, owner)  # a file without its class is judged when imported
    except (TypeError, OSError, UnicodeDecodeError, SyntaxError, members.MemberNotFound):
        return None  # judged by its members when it is imported

    def found(member: Member) -> tuple[bool, str | None, str]:
        span = members.member_span(lines, member.owner, member.name)
        if span is None:
            return False, None, "missing"
        sha = members.dedented_sha256(lines[span[0] : span[1]])
        return True, sha, f"sha256 {sha[:12]} in {path}"

    # The fixed members from their files too: importing the fix imports Airflow modules,
    # which may be half initialized at this point.
    return _judge(name, found, lambda member: members.dedented_sha256(members.fixed_member_lines(member)))


def _judge(name: str, found, fixed_sha256) -> ModuleState:
    """Target ``name``'s state from ``found(member) -> (present, sha256|None, text)`` and
    ``fixed_sha256(member)``."""
    version = airflow_version()
    release = release_of(version)
    if release is None:
        return ModuleState(
            name,
            REFUSED,
            f"Airflow {version} is not a supported release (expected one of {SUPPORTED_AIRFLOW_VERSIONS[0]} "
            f"to {SUPPORTED_AIRFLOW_VERSIONS[-1]}, or a local build of one); nothing was patched: install a "
            "supported Airflow or a release of this package that supports yours",
        )
    try:
        from airflow import settings

        problem = environment_problem(getattr(settings, "SQL_ALCHEMY_CONN", None))
    except Exception:  # no readable configuration: nothing to judge
        problem = None
    if problem:
        return ModuleState(name, REFUSED, problem)
    kinds = set()
    for member in members_of(name):
        present, found_sha, found_text = found(member)
        # The original first: the fixed member's fingerprint is needed only where the original is not
        # found (a source-patched install), and computing it in every process cost 3 % of a task's run.
        if member.original_sha256 is None and not present:
            kinds.add(PATCHABLE)
            continue
        if found_sha is not None and found_sha == member.original_sha256:
            kinds.add(PATCHABLE)
            continue
        try:
            fixed_sha = fixed_sha256(member)
        except Exception as err:  # the fix cannot be loaded against this Airflow: never patch
            return _unloadable(member, err)
        if found_sha is not None and found_sha == fixed_sha:
            kinds.add(SOURCE_PATCHED)
        else:
            expected = "absent" if member.original_sha256 is None else f"sha256 {member.original_sha256[:12]}"
            changed = (
                f"{member.qualname} is not the Airflow {release} original "
                f"(found {found_text}, expected {expected})"
            )
            if version == release:
                return ModuleState(
                    name,
                    REFUSED,
                    f"{changed}; it was changed by another patch, plugin or a custom build. Nothing "
                    "was patched: remove the other change, or use a pristine Airflow, then check with "
                    "'airflow-dataset-race-fix status'",
                )
            return ModuleState(name, REFUSED, _local_build_refusal(version, changed))
    if kinds == {SOURCE_PATCHED}:
        return ModuleState(name, SOURCE_PATCHED, "the installed source already has the fix")
    if kinds == {PATCHABLE}:
        return ModuleState(name, PATCHABLE, "original Airflow code, not patched in this process")
    return ModuleState(
        name,
        REFUSED,
        "the installed source is half patched (some members fixed, some original); "
        "run 'airflow-dataset-race-fix check' and re-apply or revert the source patches",
    )


def _unloadable(member: Member, err: Exception) -> ModuleState:
    return ModuleState(
        member.module,
        REFUSED,
        f"the fixed {member.qualname} cannot be loaded ({type(err).__name__}: {err}); "
        "nothing was patched: report this with 'airflow-dataset-race-fix status --json'",
    )


def _local_build_refusal(version: str, changed: str) -> str:
    composer = "composer" in version.partition("+")[2].lower()
    own_fix = (
        " Cloud Composer's build carries its own partial fix of the race (apache/airflow#62501's: the event "
        "committed in its own session, a guarded upsert); this package cannot replace it safely."
    )
    return (
        f"Airflow {version} is a local build: {changed}, so the build changed "
        f"it.{own_fix if composer else ''} A member that is not byte-identical to the release's is never "
        "replaced: nothing was patched, the build's own code runs. What still works here, read-only: "
        "'airflow-dataset-race-fix audit', 'explain' and the Dataset runs page"
    )


def _is_marked(module: ModuleType) -> bool:
    owners = {m.owner for m in members_of(module.__name__)}
    return all(MARKER in vars(getattr(module, owner, object)) for owner in owners)


def patch_module(module: ModuleType, state: ModuleState | None = None) -> ModuleState:
    """Install the fixed members on an imported target module (idempotent)."""
    previous = _states.get(module.__name__)
    if previous is not None and previous.state == PATCHED and _is_marked(module):
        return previous  # a reload gives fresh classes without the marker: patch those again
    state = state or _classify(module)
    if state.state == PATCHABLE:
        for member in members_of(module.__name__):
            owner = getattr(module, member.owner)
            key = (member.module, member.owner, member.name)
            _originals.setdefault(key, vars(owner).get(member.name, _MISSING))
            setattr(owner, member.name, _fixed_attribute(member))
            setattr(owner, MARKER, True)
        state = ModuleState(module.__name__, PATCHED, "fixed members installed by the shim")
    _states[module.__name__] = state
    return state


def unpatch_module(module: ModuleType) -> None:
    """Restore the originals of a module patched by :func:`patch_module`."""
    for member in members_of(module.__name__):
        key = (member.module, member.owner, member.name)
        if key not in _originals:
            continue
        owner = getattr(module, member.owner)
        original = _originals.pop(key)
        if original is _MISSING:
            delattr(owner, member.name)
        else:
            setattr(owner, member.name, original)
        if MARKER in vars(owner):
            delattr(owner, MARKER)
    _states.pop(module.__name__, None)


def _refused_state(name: str) -> ModuleState:
    assert _refusal is not None
    if name == _refusal.module:
        return _refusal
    detail = (
        f"not patched, because the fix is all or nothing and {_refusal.module} was refused: {_refusal.detail}"
    )
    return ModuleState(name, REFUSED, detail)


def module_state(module_name: str) -> ModuleState:
    """What this interpreter did (or would do) with a target module; changes nothing."""
    if module_name in _states:
        return _states[module_name]
    if _refusal is not None:
        return _refused_state(module_name)
    module = sys.modules.get(module_name)
    if module is None:
        return ModuleState(module_name, PENDING, "not imported in this process yet")
    return _classify(module)


def _judge_now(name: str, importing: ModuleType) -> ModuleState | None:
    """A target's state while ``importing`` is handled: live if imported and complete, else from its file."""
    from airflow_dataset_race_fix import post_import

    module = importing if name == importing.__name__ else sys.modules.get(name)
    previous = _states.get(name)
    if previous is not None and module is not None and (previous.state != PATCHED or _is_marked(module)):
        return previous  # judged already (a reload gives fresh classes: judged again)
    if module is importing or (module is not None and name not in post_import.waiting()):
        return _classify(module)  # waiting: the module is still running its code
    return _classify_file(name)


def _refuse_all(refused: ModuleState, strict: bool) -> None:
    """Keep every target of this process unpatched because of ``refused``."""
    global _refusal
    _refusal = refused
    for name in TARGET_MODULES:
        module = sys.modules.get(name)
        if module is None:
            continue
        if strict and module_state(name).state == PATCHED:
            continue  # fixed code may stay: in strict mode the refused target never imports
        unpatch_module(module)
        _states[name] = _refused_state(name)


def command_name() -> str | None:
    """The long-running 'airflow' command this process runs ('scheduler', 'tasks run', ...), '' for another
    'airflow' command, None outside the 'airflow' program (a test, a script, gunicorn's workers)."""
    argv = sys.argv or [""]
    program = argv[0] or ""
    if os.path.basename(program) != "airflow" and not program.endswith(
        os.path.join("airflow", "__main__.py")
    ):
        return None
    words = tuple(arg for arg in argv[1:] if not arg.startswith("-"))
    return next((" ".join(c) for c in LONG_RUNNING_COMMANDS if words[: len(c)] == c), "")


def announce_level() -> int:
    """INFO in processes that run for a while, DEBUG in short 'airflow' CLI commands."""
    return logging.DEBUG if command_name() == "" else logging.INFO


def report(state: ModuleState, strict: bool = False) -> None:
    """Log the outcome of patching once per process; in strict mode a refusal raises."""
    global _warned
    if state.state == REFUSED:
        refusal = _refusal or state
        if strict:
            raise RefusedError(
                f"airflow-dataset-race-fix (strict): {state.module} refused; every import of "
                "a target module fails in this process (AIRFLOW_DATASET_RACE_FIX_STRICT=1): "
                f"{refusal.module}: {refusal.detail}"
            )
        if not _warned:
            _warned = True
            log.warning(
                "airflow-dataset-race-fix: the fix is NOT in place: no target module is patched in this "
                "process, because %s was refused: %s",
                refusal.module,
                refusal.detail,
            )
        return
    if state.state not in (PATCHED, SOURCE_PATCHED):
        return
    how = (
        "patched by the shim"
        if state.state == PATCHED
        else "the installed source already has the fix, shim idle"
    )
    if state.module in _announced:
        log.debug("airflow-dataset-race-fix: %s: %s", state.module, how)
        return
    # One line per target, each as it is fixed: a worker never imports the scheduler, and a
    # scheduler's log then says that its own code is fixed.
    _announced.add(state.module)
    log.log(
        announce_level(),
        "airflow-dataset-race-fix: fix in place (%s: %s; Airflow %s)",
        state.module,
        how,
        airflow_version(),
    )


def announce_imported() -> None:
    """Log each imported target's state that this process has not logged yet."""
    for name in TARGET_MODULES:
        if name in sys.modules and name not in _announced:
            report(module_state(name))


def decisions() -> tuple:
    """What this interpreter decided so far: it changes when a target is imported, patched or refused."""
    return _refusal, tuple((sys.modules.get(n), _states.get(n)) for n in TARGET_MODULES)


def _warn_half_source(states: list[ModuleState]) -> None:
    """Source patches on some target files only: this process is made whole, others are not."""
    global _warned_half_source
    fixed_by_source = [s.module for s in states if s.state == SOURCE_PATCHED]
    stock = [s.module for s in states if s.state in (PATCHABLE, PATCHED)]
    if _warned_half_source or not (fixed_by_source and stock):
        return
    _warned_half_source = True
    log.warning(
        "airflow-dataset-race-fix: the source patches are half applied in this installation (%s has the fix, "
        "%s does not); the shim fixes the rest in this process, but a process without the shim runs half "
        "fixed: run 'airflow-dataset-race-fix apply' (or 'revert')",
        ", ".join(fixed_by_source),
        ", ".join(stock),
    )


def on_import(module: ModuleType, strict: bool = False) -> ModuleState:
    """Post-import hook body: judge every target, patch ``module`` only if none is refused, report."""
    if _refusal is None:
        plan = [_judge_now(name, module) for name in TARGET_MODULES]
        known = [s for s in plan if s is not None]
        refused = next((s for s in known if s.state == REFUSED), None)
        if refused is not None:
            _refuse_all(refused, strict)
        else:
            patch_module(module, plan[TARGET_MODULES.index(module.__name__)])
            _warn_half_source(known)
    if _refusal is not None and not (strict and module_state(module.__name__).state == PATCHED):
        _states[module.__name__] = _refused_state(module.__name__)
    state = _states[module.__name__]
    report(state, strict)
    return state


def refuse(state: ModuleState, strict: bool = False) -> None:
    """Refuse every target for a reason found outside an import hook (the plugin route, too late)."""
    if _refusal is None:
        _refuse_all(state, strict)
    report(_refusal or state, strict)


def apply(strict: bool = False) -> list[ModuleState]:
    """Import and patch the target modules now, all or nothing; a refusal is logged (raised if strict)."""
    for name in TARGET_MODULES:
        on_import(importlib.import_module(name), strict)
    return [module_state(name) for name in TARGET_MODULES]


def unapply() -> None:
    """Restore every original that this interpreter replaced, and forget any refusal."""
    global _refusal
    for name in TARGET_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            unpatch_module(module)
    _refusal = None
