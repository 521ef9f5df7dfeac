"""What a program's `models/model.json` may hold (chain.deploy.loader's strict reader): the
lifted inputs its configs must match, calls of aten, prims and backend-chain ops and a few
higher-order ops, guards and size expressions that are arithmetic only (torch evaluates
both: a guard with `exec`, a size through sympy), and no custom objects."""

from __future__ import annotations

import ast
import re
from typing import Any

from backends.common.payload import PayloadError

WEIGHTS, CONSTANTS = "data/weights/", "data/constants/"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def refuse(name: str, what: str) -> PayloadError:
    """The one-line refusal; control characters from the file shown as '?'."""
    return PayloadError(f"{name}: {_CONTROL.sub('?', what)}: refused, not loaded")


_MODEL_KEYS = {
    "graph_module", "opset_version", "range_constraints", "schema_version", "verifiers",
    "torch_version", "guards_code",
}  # fmt: skip
_INPUT_KINDS = {"user_input", "parameter", "buffer", "tensor_constant", "constant_input"}
_OBJECT_ARGS = {"as_custom_obj", "as_custom_objs", "custom_obj"}  # torch unpickles these
_OPS = re.compile(r"torch\.ops\.(aten|prims|backend_chain)\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z0-9_]+")
_FILE_OPS = {"from_file", "save"}  # aten ops that read or write (or mmap) a named file
_HIGHER_ORDER = {"wrap_with_set_grad_enabled", "wrap_with_autocast", "cond", "while_loop"}
_OPERATORS = {
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
    "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "xor", "not_", "invert", "lshift",
    "rshift",
}  # fmt: skip
_TORCH_FUNCTIONS = {
    "sym_float", "sym_int", "sym_max", "sym_min", "sym_not", "sym_sqrt", "sym_ite",
    "sym_sum", "_sym_sqrt",
}  # fmt: skip
_MATH = {"ceil", "floor", "trunc", "sqrt"}
# guards_code is Python that torch compiles with exec(): only size arithmetic on the inputs
_GUARD_TEXT = re.compile(r"[A-Za-z0-9_ \[\]'().,<>=!+\-*/%]*")
_GUARD_NODES = (
    ast.Expression, ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Subscript, ast.Call,
    ast.Attribute, ast.Name, ast.Constant, ast.Load, ast.And, ast.Or, ast.Not, ast.USub,
    ast.UAdd, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Eq,
    ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE,
)  # fmt: skip
_GUARD_NAMES = {"L", "math", "Max", "Min", "Mod", "PythonMod", "FloorDiv", "CleanDiv", "Abs"}
_GUARD_ATTRS = {"size", "stride", "storage_offset", "dim", "numel", *_MATH}
# sizes are sympy expressions that torch reads with sympy.sympify (eval): srepr-style calls
# of sympy classes over symbols and numbers; a string only as a Symbol's or Float's name
_SYM_FUNCTIONS = {
    "Symbol", "Integer", "Float", "Rational", "Add", "Mul", "Pow", "Mod", "Max", "Min",
    "Abs", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "Equality", "Unequality", "StrictLessThan",
    "LessThan", "StrictGreaterThan", "GreaterThan", "And", "Or", "Not", "Piecewise",
    "ExprCondPair", "floor", "ceiling", "sqrt", "FloorDiv", "ModularIndexing", "Where",
    "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt", "CeilDiv", "LShift", "RShift",
    "PowByNatural", "FloatPow", "FloatTrueDiv", "IntTrueDiv", "TruncToFloat", "TruncToInt",
    "RoundToInt", "RoundDecimal", "ToFloat", "Identity", "IsNonOverlappingAndDenseIndicator",
}  # fmt: skip
_SYM_CONSTANTS = {"oo", "zoo", "nan", "true", "false", "pi", "E"}
_SYM_NAME = re.compile(r"[a-z]{1,4}[0-9]{1,9}")  # s0, u3, zf1: torch's symbols
_SYM_STRING = re.compile(r"[A-Za-z0-9_.+\-]{1,64}")
_SYM_NODES = (
    ast.Expression, ast.Call, ast.keyword, ast.Name, ast.Constant, ast.Load, ast.BinOp,
    ast.UnaryOp, ast.Compare, ast.BoolOp, ast.And, ast.Or, ast.Not, ast.USub, ast.UAdd,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Eq, ast.NotEq,
    ast.Lt, ast.LtE, ast.Gt, ast.GtE,
)  # fmt: skip


def _lifted(name: str, graph_module: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Each weight and constant the signature lifts: fqn -> (its folder, the graph's
    tensor metadata of its placeholder, all sizes concrete)."""
    values = graph_module["graph"]["tensor_values"]
    lifted: dict[str, tuple[str, Any]] = {}
    for spec in graph_module["signature"]["input_specs"]:
        [(kind, body)] = spec.items()
        if kind not in _INPUT_KINDS:
            raise refuse(name, f"a program input of kind {kind[:40]!r}")
        if kind in ("parameter", "buffer", "tensor_constant"):
            fqn = body[f"{kind}_name"]
            persistent = kind == "parameter" or (kind == "buffer" and body["persistent"])
            meta = values[body["arg"]["name"]]
            if not all(set(s) == {"as_int"} for s in (*meta["sizes"], *meta["strides"])):
                raise refuse(name, f"a symbolic size for the lifted tensor {fqn[:80]!r}")
            lifted[fqn] = (WEIGHTS if persistent else CONSTANTS, meta)
    return lifted


def check_model(name: str, model: Any) -> dict[str, tuple[str, Any]]:
    """The model's JSON: known keys, guards that are size arithmetic, allowed call
    targets, no custom objects; returns what the signature lifts (see `_lifted`)."""
    if not isinstance(model, dict) or not set(model) <= _MODEL_KEYS:
        raise refuse(name, "models/model.json is not a program of this torch's schema")
    guards = model.get("guards_code", [])
    if not isinstance(guards, list):
        raise refuse(name, "guards_code is not a list")
    for guard in guards:
        _check_guard(name, guard)
    try:
        _check_graph(name, model)
        return _lifted(name, model["graph_module"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise refuse(name, f"models/model.json is malformed ({type(error).__name__})") from None


def _check_guard(name: str, guard: Any) -> None:
    """One guard: comparisons and arithmetic over input sizes, nothing else (it is exec'd)."""
    if not isinstance(guard, str) or len(guard) > 2000 or not _GUARD_TEXT.fullmatch(guard):
        raise refuse(name, f"a guard that is not size arithmetic ({str(guard)[:80]!r})")
    try:
        tree = ast.parse(guard, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        raise refuse(name, f"a guard that does not parse ({guard[:80]!r})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _GUARD_NODES) or not _guard_node_ok(node):
            raise refuse(name, f"a guard that is not size arithmetic ({guard[:80]!r})")


def _guard_node_ok(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _GUARD_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in _GUARD_ATTRS
    if isinstance(node, ast.Call):
        return not node.keywords
    if isinstance(node, ast.Constant):
        value = node.value
        return type(value) in (int, float, bool) or (
            isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9_]{0,100}", value) is not None
        )
    return True


def _check_sym_expr(name: str, text: Any) -> None:
    """One size expression (torch hands it to sympy.sympify, which evals it): calls of
    sympy classes over symbols and numbers only (see _SYM_FUNCTIONS)."""
    if not isinstance(text, str) or len(text) > 4000:
        raise refuse(name, f"a size expression that is not one ({str(text)[:80]!r})")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        raise refuse(name, f"a size expression that does not parse ({text[:80]!r})") from None
    named = {  # the one place a string may stand: the name of a Symbol or a Float
        id(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("Symbol", "Float")
        and node.args
    }
    for node in ast.walk(tree):
        if not isinstance(node, _SYM_NODES) or not _sym_node_ok(node, named):
            raise refuse(name, f"a size expression that is not sympy arithmetic ({text[:80]!r})")


def _sym_node_ok(node: ast.AST, named: set[int]) -> bool:
    if isinstance(node, ast.Call):
        return isinstance(node.func, ast.Name) and node.func.id in _SYM_FUNCTIONS
    if isinstance(node, ast.Name):
        return (
            node.id in _SYM_FUNCTIONS
            or node.id in _SYM_CONSTANTS
            or bool(_SYM_NAME.fullmatch(node.id))
        )
    if isinstance(node, ast.keyword):
        value = node.value
        return (
            bool(node.arg)
            and not str(node.arg).startswith("_")
            and (isinstance(value, ast.Constant) and type(value.value) in (bool, int))
        )
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return id(node) in named and _SYM_STRING.fullmatch(node.value) is not None
        return type(node.value) in (int, float, bool)
    return True


def _check_graph(name: str, data: Any) -> None:
    """Every call target anywhere in the model (nested graphs included) is allowed, every
    size expression is sympy arithmetic, and nothing names a custom object (torch
    unpickles those)."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key in _OBJECT_ARGS or (key == "custom_obj_values" and value):
                raise refuse(name, "a custom object in the graph")
            if key == "expr_str":
                _check_sym_expr(name, value)
            if key == "nodes" and isinstance(value, list):
                for node in value:
                    _check_target(name, node["target"])
            if key == "as_operator":
                _check_target(name, value)
            _check_graph(name, value)
    elif isinstance(data, list):
        for value in data:
            _check_graph(name, value)


def _check_target(name: str, target: Any) -> None:
    """A call target torch will resolve by name and call: aten, prims, our op, a few
    higher-order ops, arithmetic on sizes."""
    if not isinstance(target, str) or not _target_ok(target):
        raise refuse(name, f"a call of {str(target)[:80]!r}, not an allowed operator")


def _target_ok(target: str) -> bool:
    module, _, rest = target.partition(".")
    if module == "_operator":
        return rest in _OPERATORS
    if module == "math":
        return rest in _MATH
    if _OPS.fullmatch(target):
        return target.split(".")[3] not in _FILE_OPS
    if target.startswith("torch.ops.higher_order."):
        return target.removeprefix("torch.ops.higher_order.") in _HIGHER_ORDER
    return module == "torch" and rest in _TORCH_FUNCTIONS
