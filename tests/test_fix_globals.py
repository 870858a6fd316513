"""
The fixed members can be spliced into Airflow's source: every global name they use means
the same object in Airflow's module as in our fix module (or is a builtin).

Checked twice: on the installed Airflow with the real objects, and statically on each
supported release's pristine file (its module-level imports bind the same names to the
same ``module.attribute``), so that a patch for 2.10.0 is judged on 2.10.0's imports.
"""

from __future__ import annotations

import ast
import builtins
import dis
import importlib
import inspect
import textwrap
from types import CodeType, SimpleNamespace

import pytest
from matrix import ON_SQLITE_ONLY
from source_patch_support import release

from airflow_dataset_race_fix.source_patches import members
from airflow_dataset_race_fix.targets import MEMBERS, SUPPORTED_AIRFLOW_VERSIONS
from tools.patchgen import generator

pytestmark = ON_SQLITE_ONLY

GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL"}


def global_names(code: CodeType) -> set[str]:
    """Global names a code object and its nested code objects (functions, comprehensions) use."""
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names |= global_names(const)
    return names


def _fixed_function(member):
    fix_module = importlib.import_module(member.fix_module)
    attribute = vars(getattr(fix_module, member.owner))[member.name]
    if isinstance(
        attribute, type
    ):  # a nested class (a typed value): its decorators and body, as a function's
        (node,) = ast.parse(textwrap.dedent("".join(members.fixed_member_lines(member)))).body
        body = [ast.Expr(decorator) for decorator in node.decorator_list] + node.body
        function = ast.FunctionDef(node.name, ast.arguments([], [], None, [], [], None, []), body, [], None)
        module = ast.fix_missing_locations(ast.Module([function], []))
        return fix_module, SimpleNamespace(__code__=compile(module, member.qualname, "exec"))
    # Through decorators (register_dataset_change's internal_api_call and provide_session):
    # their wrappers' globals are their own modules', not the member's.
    return fix_module, inspect.unwrap(getattr(attribute, "__func__", attribute))


@pytest.mark.parametrize("member", MEMBERS, ids=[m.qualname for m in MEMBERS])
def test_globals_are_the_same_objects_in_airflow(member):
    fix_module, function = _fixed_function(member)
    airflow_module = importlib.import_module(member.module)
    names = global_names(function.__code__)
    wrong = {}
    for name in sorted(names):
        if name in vars(fix_module):
            ours = vars(fix_module)[name]
            if vars(airflow_module).get(name, wrong) is not ours:
                wrong[name] = (
                    f"{ours!r} in the fix, {vars(airflow_module).get(name, 'undefined')!r} in Airflow"
                )
        elif not hasattr(builtins, name):
            wrong[name] = "neither defined in the fix module nor a builtin"
    assert not wrong, f"{member.qualname}: {wrong}"


def test_the_walk_reaches_nested_code():
    slow_path = next(m for m in MEMBERS if m.name == "_slow_path_queue_dagruns")
    # ``exc`` is only used inside the nested _queue_dagrun_if_needed.
    assert {"exc", "DatasetDagRunQueue"} <= global_names(_fixed_function(slow_path)[1].__code__)


def module_bindings(source: str) -> dict[str, str]:
    """Names bound by module-level imports (not those under ``if TYPE_CHECKING``) -> 'module.attr'."""
    bindings: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                bindings[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bindings[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
    return bindings


@pytest.mark.parametrize("version", SUPPORTED_AIRFLOW_VERSIONS)
def test_globals_are_imported_alike_in_each_release(version):
    files = release(version).files
    problems = []
    for member in MEMBERS:
        fix_source = members.fix_module_path(member).read_text(encoding="utf-8")
        ours = module_bindings(fix_source)
        theirs = module_bindings(files[generator.target_path(member.module)].decode())
        _, function = _fixed_function(member)
        for name in sorted(global_names(function.__code__)):
            if name in ours and theirs.get(name) != ours[name]:
                problems.append(
                    f"{member.name}: {name} is {ours[name]} in the fix, {theirs.get(name)} in {version}"
                )
            elif name not in ours and not hasattr(builtins, name):
                problems.append(f"{member.name}: {name} is neither imported by the fix module nor a builtin")
    assert not problems
