"""GUI actions as OSWorld defines them, parsed and checked before anything runs.

Two action spaces, both expressible as short text:
- `pyautogui`: Python code calling pyautogui (and `time`), e.g. `pyautogui.click(120, 40)` or
  `pyautogui.write('abc'); pyautogui.press('enter')`. Only pyautogui's input functions, `time.sleep` and a few harmless
  builtins are allowed; the check is on the syntax tree, so `import os` or `pyautogui.os.system(...)` is refused before it
  reaches the desktop (a parse error, not an exception).
- `computer_13`: a dict (or its JSON text) `{"action_type": "CLICK", "parameters": {"x": 120, "y": 40}}` with OSWorld's
  13 action types (MOVE_TO, CLICK, MOUSE_DOWN, MOUSE_UP, RIGHT_CLICK, DOUBLE_CLICK, DRAG_TO, SCROLL, TYPING, PRESS,
  KEY_DOWN, KEY_UP, HOTKEY), translated here to the equivalent pyautogui code.
Plus the special actions WAIT, DONE and FAIL (plain text, or as an action_type). Markdown code fences are stripped.
"""

from __future__ import annotations

import ast
import json
import math
import re
import string
from dataclasses import dataclass
from typing import Any

from envs.action_text import loads_json

SPECIAL_ACTIONS = ("WAIT", "DONE", "FAIL")
ACTION_SPACES = ("pyautogui", "computer_13", "any")
MAX_CODE_CHARS = 4000

#: pyautogui attributes an action may use: input functions, easing functions, and read-only queries.
PYAUTOGUI_ALLOWED = frozenset(
    [
        "click",
        "doubleClick",
        "tripleClick",
        "rightClick",
        "middleClick",
        "leftClick",
        "moveTo",
        "moveRel",
        "move",
        "dragTo",
        "dragRel",
        "drag",
        "scroll",
        "hscroll",
        "vscroll",
        "mouseDown",
        "mouseUp",
        "press",
        "keyDown",
        "keyUp",
        "hotkey",
        "write",
        "typewrite",
        "sleep",
        "position",
        "size",
        "onScreen",
        "isValidKey",
        "linear",
        "easeInQuad",
        "easeOutQuad",
        "easeInOutQuad",
        "easeInCubic",
        "easeOutCubic",
        "easeInOutCubic",
        "easeInBounce",
        "easeOutBounce",
        "easeInElastic",
        "easeOutElastic",
        "KEYBOARD_KEYS",
        "KEY_NAMES",
        "LEFT",
        "RIGHT",
        "MIDDLE",
        "PRIMARY",
        "SECONDARY",
    ]
)
TIME_ALLOWED = frozenset({"sleep", "time", "monotonic"})
MODULES = {"pyautogui": PYAUTOGUI_ALLOWED, "time": TIME_ALLOWED}
SAFE_BUILTINS = frozenset(
    [
        "abs",
        "bool",
        "dict",
        "enumerate",
        "float",
        "int",
        "len",
        "list",
        "max",
        "min",
        "print",
        "range",
        "reversed",
        "round",
        "sorted",
        "str",
        "sum",
        "tuple",
        "zip",
    ]
)

#: Key names pyautogui accepts (pyautogui.KEYBOARD_KEYS), written out so parsing never imports pyautogui (which needs an
#: X display at import time).
NAMED_KEYS = frozenset(
    [
        "accept",
        "add",
        "alt",
        "altleft",
        "altright",
        "apps",
        "backspace",
        "browserback",
        "browserfavorites",
        "browserforward",
        "browserhome",
        "browserrefresh",
        "browsersearch",
        "browserstop",
        "capslock",
        "clear",
        "convert",
        "ctrl",
        "ctrlleft",
        "ctrlright",
        "decimal",
        "del",
        "delete",
        "divide",
        "down",
        "end",
        "enter",
        "esc",
        "escape",
        "execute",
        "f1",
        "f2",
        "f3",
        "f4",
        "f5",
        "f6",
        "f7",
        "f8",
        "f9",
        "f10",
        "f11",
        "f12",
        "f13",
        "f14",
        "f15",
        "f16",
        "f17",
        "f18",
        "f19",
        "f20",
        "f21",
        "f22",
        "f23",
        "f24",
        "final",
        "fn",
        "hanguel",
        "hangul",
        "hanja",
        "help",
        "home",
        "insert",
        "junja",
        "kana",
        "kanji",
        "launchapp1",
        "launchapp2",
        "launchmail",
        "launchmediaselect",
        "left",
        "modechange",
        "multiply",
        "nexttrack",
        "nonconvert",
        "num0",
        "num1",
        "num2",
        "num3",
        "num4",
        "num5",
        "num6",
        "num7",
        "num8",
        "num9",
        "numlock",
        "pagedown",
        "pageup",
        "pause",
        "pgdn",
        "pgup",
        "playpause",
        "prevtrack",
        "print",
        "printscreen",
        "prntscrn",
        "prtsc",
        "prtscr",
        "return",
        "right",
        "scrolllock",
        "select",
        "separator",
        "shift",
        "shiftleft",
        "shiftright",
        "sleep",
        "space",
        "stop",
        "subtract",
        "tab",
        "up",
        "volumedown",
        "volumemute",
        "volumeup",
        "win",
        "winleft",
        "winright",
        "yen",
        "command",
        "option",
        "optionleft",
        "optionright",
    ]
)
KEYBOARD_KEYS = NAMED_KEYS | frozenset(c for c in string.printable if c not in "\x0b\x0c\r") | frozenset({"\n", "\t"})


KEY_FUNCTIONS = frozenset({"press", "keyDown", "keyUp", "hotkey"})
TYPE_FUNCTIONS = frozenset({"write", "typewrite"})
#: pyautogui functions whose first two positional arguments (or x=, y=, xOffset=, yOffset=) are screen coordinates.
POINTER_FUNCTIONS = frozenset(
    {"click", "doubleClick", "tripleClick", "rightClick", "middleClick", "leftClick", "moveTo", "moveRel", "move"}
    | {"dragTo", "dragRel", "drag", "mouseDown", "mouseUp"}
)
SCROLL_FUNCTIONS = frozenset({"scroll", "hscroll", "vscroll"})  # (clicks, x, y)
MAX_COORDINATE = 32767  # X11 carries pointer coordinates as signed 16-bit numbers; larger ones cannot be sent
MAX_SCROLL_CLICKS = 1000  # pyautogui sends one X event per click: more floods the display for the next steps too


class ActionParseError(ValueError):
    """The action is not something the action space can run; nothing was executed."""


@dataclass(frozen=True)
class ParsedAction:
    kind: str  # "code" (run `code` with pyautogui) or "special" (WAIT / DONE / FAIL)
    code: str = ""
    special: str = ""
    space: str = ""  # "pyautogui" | "computer_13" | "special"


def parse_action(action: str | dict[str, Any], action_space: str = "any") -> ParsedAction:
    """Parse an agent action; raise ActionParseError with a message the agent can act on."""
    if action_space not in ACTION_SPACES:
        raise ValueError(f"unknown action space {action_space!r}; known: {', '.join(ACTION_SPACES)}")
    if isinstance(action, dict):
        return _parse_dict(action, action_space)
    if not isinstance(action, str):
        raise ActionParseError(f"an action is text or a dict, got {type(action).__name__}")
    text = strip_fences(action).strip()
    if not text:
        raise ActionParseError(
            "the action is empty: write pyautogui code (e.g. pyautogui.click(100, 200)) or WAIT/DONE/FAIL"
        )
    if text.upper() in SPECIAL_ACTIONS and text == text.upper():
        return ParsedAction("special", special=text.upper(), space="special")
    if text.startswith("{"):
        try:
            obj = loads_json(text)
        except json.JSONDecodeError as exc:
            raise ActionParseError(
                f"the action looks like JSON but is not valid JSON: {exc.msg} at column {exc.colno}"
            ) from None
        except ValueError as exc:
            raise ActionParseError(f"the action looks like JSON but cannot be read: {exc}") from None
        if not isinstance(obj, dict):
            raise ActionParseError("a computer_13 action is a JSON object with an action_type")
        return _parse_dict(obj, action_space)
    if action_space == "computer_13":
        raise ActionParseError(
            'this env takes computer_13 actions: {"action_type": "CLICK", "parameters": {"x": 10, "y": 20}}'
        )
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if lines and lines[-1].strip() in SPECIAL_ACTIONS and len(lines) > 1:
        raise ActionParseError(f"send {lines[-1].strip()} as its own action, not after code")
    check_pyautogui_code(text)
    return ParsedAction("code", code=text, space="pyautogui")


_FENCE = re.compile(r"```(?:[a-zA-Z0-9_+-]*)\n?(.*?)```", re.DOTALL)


def strip_fences(text: str) -> str:
    """The content of markdown code fences when there are any (all blocks, joined), else the text itself."""
    blocks = _FENCE.findall(text)
    return "\n".join(b.strip("\n") for b in blocks) if blocks else text


def _parse_dict(obj: dict[str, Any], action_space: str) -> ParsedAction:
    kind = obj.get("action_type")
    if not isinstance(kind, str):
        raise ActionParseError(f"a computer_13 action needs an 'action_type' (one of {', '.join(COMPUTER_13)})")
    kind = kind.upper()
    if kind in SPECIAL_ACTIONS:
        return ParsedAction("special", special=kind, space="special")
    if action_space == "pyautogui":
        raise ActionParseError("this env takes pyautogui code, e.g. pyautogui.click(100, 200), not computer_13 actions")
    params = obj.get("parameters")
    if params is None:
        params = {k: v for k, v in obj.items() if k != "action_type"}
    if not isinstance(params, dict):
        raise ActionParseError("'parameters' must be an object")
    if kind not in COMPUTER_13:
        raise ActionParseError(f"unknown action_type {kind!r}; known: {', '.join(COMPUTER_13 + SPECIAL_ACTIONS)}")
    return ParsedAction("code", code=COMPUTER_13_BUILDERS[kind](params), space="computer_13")


# ----- computer_13 -> pyautogui -----
COMPUTER_13 = (
    "MOVE_TO",
    "CLICK",
    "MOUSE_DOWN",
    "MOUSE_UP",
    "RIGHT_CLICK",
    "DOUBLE_CLICK",
    "DRAG_TO",
    "SCROLL",
    "TYPING",
    "PRESS",
    "KEY_DOWN",
    "KEY_UP",
    "HOTKEY",
)


def _num(params: dict[str, Any], key: str) -> float:
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ActionParseError(f"parameter {key!r} must be a number, got {_short(v)}")
    if isinstance(v, int):
        return v
    if not math.isfinite(v):
        raise ActionParseError(f"parameter {key!r} must be a finite number, got {v!r}")
    return int(v) if v.is_integer() else v


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)  # an int of over 4300 digits has no repr
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_coordinate(name: str, value: float) -> None:
    if not -MAX_COORDINATE - 1 <= value <= MAX_COORDINATE:
        raise ActionParseError(
            f"{name}={_short(value)} is not a screen coordinate (X11 takes {-MAX_COORDINATE - 1}..{MAX_COORDINATE})"
        )


def check_scroll(value: float) -> None:
    if abs(value) > MAX_SCROLL_CLICKS:
        raise ActionParseError(f"a scroll of {_short(value)} clicks is too far: scroll at most {MAX_SCROLL_CLICKS}")


def check_typable(text: str) -> None:
    """pyautogui types printable ASCII, newline and tab; it silently drops anything else (it would not be typed)."""
    for i, c in enumerate(text):
        if c not in KEYBOARD_KEYS:
            raise ActionParseError(
                f"pyautogui cannot type {c!r} (U+{ord(c):04X}, character {i} of the text): it types printable ASCII, "
                "newlines and tabs only"
            )


def _xy(params: dict[str, Any], required: bool) -> str:
    has = "x" in params or "y" in params
    if not has:
        if required:
            raise ActionParseError("this action needs 'x' and 'y'")
        return ""
    x, y = _num(params, "x"), _num(params, "y")
    check_coordinate("x", x)
    check_coordinate("y", y)
    return f"x={x!r}, y={y!r}"


def _button(params: dict[str, Any]) -> str:
    b = params.get("button", "left")
    if b not in ("left", "right", "middle"):
        raise ActionParseError(f"button must be left, right or middle, got {b!r}")
    return f"button={b!r}"


def _key(params: dict[str, Any]) -> str:
    k = params.get("key")
    if not isinstance(k, str) or k.lower() not in KEYBOARD_KEYS:
        raise ActionParseError(f"unknown key {k!r} (pyautogui key names: enter, tab, ctrl, a, ...)")
    return repr(k)


def _click(params: dict[str, Any]) -> str:
    args = [a for a in (_button(params), _xy(params, False)) if a]
    if "num_clicks" in params:
        n = _num(params, "num_clicks")
        if n not in (1, 2, 3):
            raise ActionParseError("num_clicks must be 1, 2 or 3")
        args.append(f"clicks={n}")
    return f"pyautogui.click({', '.join(args)})"


def _scroll(params: dict[str, Any]) -> str:
    parts = []
    for key, function in (("dx", "hscroll"), ("dy", "vscroll")):
        if key in params:
            clicks = _num(params, key)
            check_scroll(clicks)
            parts.append(f"pyautogui.{function}({clicks!r})")
    if not parts:
        raise ActionParseError("SCROLL needs 'dx' and/or 'dy'")
    return "; ".join(parts)


def _typing(params: dict[str, Any]) -> str:
    text = params.get("text")
    if not isinstance(text, str):
        raise ActionParseError("TYPING needs a 'text' string")
    check_typable(text)
    return f"pyautogui.typewrite({text!r})"


def _hotkey(params: dict[str, Any]) -> str:
    keys = params.get("keys")
    if not isinstance(keys, list) or not keys:
        raise ActionParseError("HOTKEY needs 'keys', a list of key names")
    return f"pyautogui.hotkey({', '.join(_key({'key': k}) for k in keys)})"


COMPUTER_13_BUILDERS = {
    "MOVE_TO": lambda p: f"pyautogui.moveTo({_xy(p, True)})",
    "CLICK": _click,
    "MOUSE_DOWN": lambda p: f"pyautogui.mouseDown({_button(p)})",
    "MOUSE_UP": lambda p: f"pyautogui.mouseUp({_button(p)})",
    "RIGHT_CLICK": lambda p: f"pyautogui.rightClick({_xy(p, False)})",
    "DOUBLE_CLICK": lambda p: f"pyautogui.doubleClick({_xy(p, False)})",
    "DRAG_TO": lambda p: f"pyautogui.dragTo({_xy(p, True)}, duration=0.3, button='left', mouseDownUp=True)",
    "SCROLL": _scroll,
    "TYPING": _typing,
    "PRESS": lambda p: f"pyautogui.press({_key(p)})",
    "KEY_DOWN": lambda p: f"pyautogui.keyDown({_key(p)})",
    "KEY_UP": lambda p: f"pyautogui.keyUp({_key(p)})",
    "HOTKEY": _hotkey,
}


# ----- pyautogui code checking -----
_ALLOWED_EXPR = (
    ast.Constant,
    ast.Name,
    ast.Attribute,
    ast.Call,
    ast.keyword,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.IfExp,
    ast.List,
    ast.Tuple,
    ast.Dict,
    ast.Set,
    ast.Subscript,
    ast.Slice,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
    ast.expr_context,
)
_ALLOWED_STMT = (ast.Expr, ast.Assign, ast.AugAssign, ast.For, ast.If, ast.Pass, ast.Import, ast.ImportFrom)


def check_pyautogui_code(code: str) -> None:
    """Raise ActionParseError unless `code` only uses pyautogui's input functions, `time` and harmless Python."""
    if len(code) > MAX_CODE_CHARS:
        raise ActionParseError(f"the action is {len(code)} characters; the limit is {MAX_CODE_CHARS}")
    too_deep = "the action nests expressions too deeply to check; write plain pyautogui calls"
    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise ActionParseError(f"could not parse the action as Python: {exc.msg}{where}") from None
    except ValueError as exc:  # older Pythons raise ValueError, not SyntaxError, on a NUL byte
        raise ActionParseError(f"could not parse the action as Python: {exc}") from None
    except RecursionError:
        raise ActionParseError(too_deep) from None
    try:
        _CodeChecker().check(tree)
    except RecursionError:
        raise ActionParseError(too_deep) from None


class _CodeChecker:
    def __init__(self) -> None:
        self.modules: dict[str, str] = {"pyautogui": "pyautogui", "time": "time"}  # local name -> module
        self.functions: set[str] = set()  # names bound by `from pyautogui import click`
        self.locals: set[str] = set()

    def check(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):  # every name the code binds may be read later
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                self.locals.add(node.id)
        for stmt in tree.body:
            self.stmt(stmt)

    def stmt(self, node: ast.stmt) -> None:
        if not isinstance(node, _ALLOWED_STMT):
            raise ActionParseError(
                f"'{type(node).__name__}' statements are not allowed in an action; use pyautogui calls"
            )
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name not in MODULES:
                    raise ActionParseError(f"only pyautogui and time can be imported (got {alias.name!r})")
                self.modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.module not in MODULES or node.level:
                raise ActionParseError(f"only pyautogui and time can be imported (got {node.module!r})")
            for alias in node.names:
                if alias.name not in MODULES[node.module]:
                    raise ActionParseError(f"{node.module}.{alias.name} is not available in an action")
                self.functions.add(alias.asname or alias.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                self.target(t)
            self.expr(node.value)
        elif isinstance(node, ast.AugAssign):
            self.target(node.target)
            self.expr(node.value)
        elif isinstance(node, ast.For):
            self.target(node.target)
            self.expr(node.iter)
            for s in node.body + node.orelse:
                self.stmt(s)
        elif isinstance(node, ast.If):
            self.expr(node.test)
            for s in node.body + node.orelse:
                self.stmt(s)
        elif isinstance(node, ast.Expr):
            self.expr(node.value)

    def pyautogui_function(self, call: ast.Call) -> str | None:
        """The pyautogui function `call` calls by name (pyautogui.click or an imported click), else None."""
        f = call.func
        if (
            isinstance(f, ast.Attribute)
            and isinstance(f.value, ast.Name)
            and self.modules.get(f.value.id) == "pyautogui"
        ):
            return f.attr
        if isinstance(f, ast.Name) and f.id in self.functions and f.id in PYAUTOGUI_ALLOWED:
            return f.id
        return None

    def literal_args(self, call: ast.Call) -> None:
        """Values pyautogui cannot use, written as literals, are parse errors: keys it would ignore silently, text it
        would not type, coordinates X11 cannot carry, scrolls that flood the display."""
        name = self.pyautogui_function(call)
        if name in KEY_FUNCTIONS:
            self.key_args(call, name)
        elif name in TYPE_FUNCTIONS:
            text = _argument(call, 0, "message")
            if isinstance(text, ast.Constant) and isinstance(text.value, str):
                check_typable(text.value)
        elif name in POINTER_FUNCTIONS:
            for i, key in ((0, "x"), (1, "y")):
                for arg in (_argument(call, i, key), _argument(call, None, key[0] + "Offset")):
                    value = _literal_number(arg)
                    if value is not None:
                        check_coordinate(key, value)
        elif name in SCROLL_FUNCTIONS:
            clicks = _literal_number(_argument(call, 0, "clicks"))
            if clicks is not None:
                check_scroll(clicks)
            for i, key in ((1, "x"), (2, "y")):
                value = _literal_number(_argument(call, i, key))
                if value is not None:
                    check_coordinate(key, value)

    def key_args(self, call: ast.Call, name: str) -> None:
        """pyautogui ignores unknown key names silently; a literal unknown key is a parse error instead."""
        literals: list[ast.expr] = []
        for a in call.args[: None if name == "hotkey" else 1]:
            literals.extend(a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])
        for a in literals:
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.lower() not in KEYBOARD_KEYS:
                raise ActionParseError(
                    f"unknown key {a.value!r} in pyautogui.{name} (key names: enter, tab, ctrl, a, ...)"
                )

    def target(self, node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            if node.id in self.modules or node.id in SAFE_BUILTINS:
                raise ActionParseError(f"an action may not rebind {node.id!r}")
            return
        if isinstance(node, (ast.Tuple, ast.List)):
            for e in node.elts:
                self.target(e)
            return
        raise ActionParseError("an action may only assign to plain variable names")

    def expr(self, node: ast.AST) -> None:
        if not isinstance(node, _ALLOWED_EXPR):
            raise ActionParseError(f"'{type(node).__name__}' is not allowed in an action")
        if isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id in self.modules):
                raise ActionParseError("attributes may only be read from pyautogui or time (e.g. pyautogui.click)")
            module = self.modules[node.value.id]
            if node.attr not in MODULES[module]:
                raise ActionParseError(f"{module}.{node.attr} is not available in an action")
            return
        if isinstance(node, ast.Call):
            self.literal_args(node)
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and not (
                node.id in self.modules
                or node.id in self.functions
                or node.id in self.locals
                or node.id in SAFE_BUILTINS
                or node.id in ("True", "False", "None")
            ):
                raise ActionParseError(f"name {node.id!r} is not defined in an action (only pyautogui and time are)")
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr_context):
                continue
            self.expr(child)


def _argument(call: ast.Call, position: int | None, keyword: str) -> ast.expr | None:
    """The expression passed as positional argument `position` or as `keyword=`, if any."""
    if (
        position is not None
        and position < len(call.args)
        and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1])
    ):
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _literal_number(node: ast.expr | None) -> float | None:
    """The value of a number literal (`5`, `-40000`, `1e999`), else None."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        sign = -1 if isinstance(node.op, ast.USub) else 1
        node = node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return sign * node.value
    return None
