"""
Put the fixed members in place in this interpreter, or take them out again.

``patch_module(module)`` is all-or-nothing per target module and idempotent: it patches
only when the installed Airflow is a supported release and every member it replaces is
exactly the pristine one (source fingerprint); it stays idle when the source already has
the fix (source patches applied); anything else is refused with a reason and Airflow is
left untouched. Originals are kept in one registry (first original wins), so
``unpatch_module`` restores them exactly.

``on_import(module, strict)`` is what the start-up shim's post-import hook calls: it
patches, then reports once per process: one INFO line the first time a target is fixed,
one WARNING per distinct refusal (or :class:`RefusedError` in strict mode).
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass
from types import ModuleType

from airflow_dataset_race_fix.targets import (
    SUPPORTED_AIRFLOW_VERSIONS,
    TARGET_MODULES,
    Member,
    environment_problem,
    fingerprint,
    members_of,
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


@dataclass(frozen=True)
class ModuleState:
    module: str
    state: str
    detail: str = ""


# (module, owner, name) -> original class attribute (or _MISSING); first original wins.
_originals: dict[tuple[str, str, str], object] = {}
_states: dict[str, ModuleState] = {}
# Reporting is once per process: the first fixed target gets the INFO line, each distinct
# refusal one WARNING (hooks, apply() and reloads may see the same module again).
_announced = False
_warned: set[tuple[str, str]] = set()


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
    """Decide, without changing anything, what patching ``module`` would do."""
    version = airflow_version()
    if version not in SUPPORTED_AIRFLOW_VERSIONS:
        return ModuleState(
            module.__name__,
            REFUSED,
            f"Airflow {version} is not a supported release (expected one of "
            f"{SUPPORTED_AIRFLOW_VERSIONS[0]} to {SUPPORTED_AIRFLOW_VERSIONS[-1]}); nothing was "
            "patched: install a supported Airflow or a release of this package that supports yours",
        )
    try:
        from airflow import settings

        problem = environment_problem(getattr(settings, "SQL_ALCHEMY_CONN", None))
    except Exception:  # no readable configuration: nothing to judge
        problem = None
    if problem:
        return ModuleState(module.__name__, REFUSED, problem)
    kinds = set()
    for member in members_of(module.__name__):
        owner = getattr(module, member.owner, None)
        current = vars(owner).get(member.name, _MISSING) if owner is not None else _MISSING
        found_sha = None if current is _MISSING else _fingerprint_or_none(current)
        try:
            fixed_sha = fingerprint(_fixed_attribute(member))
        except Exception as err:  # the fix cannot be loaded against this Airflow: never patch
            return ModuleState(
                module.__name__,
                REFUSED,
                f"the fixed {member.qualname} cannot be loaded ({type(err).__name__}: {err}); "
                "nothing was patched: report this with 'airflow-dataset-race-fix status --json'",
            )
        if found_sha is not None and found_sha == fixed_sha:
            kinds.add(SOURCE_PATCHED)
        elif member.original_sha256 is None and current is _MISSING:
            kinds.add(PATCHABLE)
        elif found_sha is not None and found_sha == member.original_sha256:
            kinds.add(PATCHABLE)
        else:
            if current is _MISSING:
                found = "missing"
            elif found_sha is None:
                found = f"a replacement whose source cannot be read ({current!r})"
            else:
                found = f"sha256 {found_sha[:12]}"
            expected = "absent" if member.original_sha256 is None else f"sha256 {member.original_sha256[:12]}"
            return ModuleState(
                module.__name__,
                REFUSED,
                f"{member.qualname} is not the Airflow {version} original (found {found}, "
                f"expected {expected}); it was changed by another patch, plugin or a custom build. "
                "Nothing was patched: remove the other change, or use a pristine Airflow, then "
                "check with 'airflow-dataset-race-fix status'",
            )
    if kinds == {SOURCE_PATCHED}:
        return ModuleState(module.__name__, SOURCE_PATCHED, "the installed source already has the fix")
    if kinds == {PATCHABLE}:
        return ModuleState(module.__name__, PATCHABLE, "original Airflow code, not patched in this process")
    return ModuleState(
        module.__name__,
        REFUSED,
        "the installed source is half patched (some members fixed, some original); "
        "run 'airflow-dataset-race-fix check' and re-apply or revert the source patches",
    )


def _is_marked(module: ModuleType) -> bool:
    owners = {m.owner for m in members_of(module.__name__)}
    return all(MARKER in vars(getattr(module, owner, object)) for owner in owners)


def patch_module(module: ModuleType) -> ModuleState:
    """Install the fixed members on an imported target module (idempotent)."""
    previous = _states.get(module.__name__)
    if previous is not None and previous.state == PATCHED and _is_marked(module):
        return previous  # a reload gives fresh classes without the marker: patch those again
    state = _classify(module)
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


def module_state(module_name: str) -> ModuleState:
    """What this interpreter did (or would do) with a target module; changes nothing."""
    if module_name in _states:
        return _states[module_name]
    module = sys.modules.get(module_name)
    if module is None:
        return ModuleState(module_name, PENDING, "not imported in this process yet")
    return _classify(module)


def report(state: ModuleState, strict: bool = False) -> None:
    """Log the outcome of patching once per process; in strict mode a refusal raises."""
    global _announced
    if state.state == REFUSED:
        if strict:
            raise RefusedError(f"airflow-dataset-race-fix (strict): {state.module} left unpatched: {state.detail}")
        if (state.module, state.detail) not in _warned:
            _warned.add((state.module, state.detail))
            log.warning("airflow-dataset-race-fix: %s left unpatched: %s", state.module, state.detail)
        return
    if state.state not in (PATCHED, SOURCE_PATCHED):
        return
    how = "patched by the shim" if state.state == PATCHED else "the installed source already has the fix, shim idle"
    if _announced:
        log.debug("airflow-dataset-race-fix: %s: %s", state.module, how)
        return
    _announced = True
    log.info(
        "airflow-dataset-race-fix: fix in place (%s: %s; Airflow %s); other targets are handled when imported",
        state.module,
        how,
        airflow_version(),
    )


def on_import(module: ModuleType, strict: bool = False) -> ModuleState:
    """Post-import hook body: patch ``module`` if it is safe, then report (raise if strict)."""
    state = patch_module(module)
    report(state, strict)
    return state


def apply(strict: bool = False) -> list[ModuleState]:
    """Import the target modules and patch them now; refusals are logged (raised if strict)."""
    states = [patch_module(importlib.import_module(name)) for name in TARGET_MODULES]
    refused = [s for s in states if s.state == REFUSED]
    if refused and strict:
        raise RefusedError("; ".join(f"{s.module}: {s.detail}" for s in refused))
    for s in states:
        report(s)
    return states


def unapply() -> None:
    """Restore every original that this interpreter replaced."""
    for name in TARGET_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            unpatch_module(module)
