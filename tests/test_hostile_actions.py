"""No action string makes an env raise (docs/architecture.md, Contracts: "A malformed action is not an exception").

Property tests (hypothesis) for every built-in family and for a minimal plugin, over generated strings and over each
family's action grammar: near-valid actions (a ```bash block, a tool call, pyautogui code, a computer_13 JSON action)
built with absurd values and then corrupted (characters inserted, deleted, replaced). Every step must return a valid,
UTF-8-encodable observation; the classes of input we know to be unusable (NUL bytes where a process gets them, lone
surrogates, actions past `max_action_chars`, JSON past Python's limits, numbers X11 cannot carry, text pyautogui cannot
type) must be parse errors whose message names the problem.

The envs are real (bubblewrap sandboxes, the SWE checkout, an Xvfb desktop); one env per family serves all examples and
is reset when an episode ends. The example database is off: no run reads what an earlier run left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from envs.base import ERROR, PARSE_ERROR, AgentEnv, Transition
from tests.sandbox_support import bwrap_or_skip

def hostile(max_examples: int) -> settings:
    """Moderate example counts (real sandboxes and desktops are slow), no deadline, and no example database."""
    return settings(
        database=None,
        deadline=None,
        max_examples=max_examples,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    )


# ----- strategies: text -----
ODD = [
    "\x00",
    "\ud800",
    "\udfff",
    "\x1b",
    "\x07",
    "\r",
    "\x7f",
    "\x85",
    "\u2028",
    "\u202e",
    "\ufeff",
    "\U0010ffff",
    "é",
    "中",
    "`",
    "'",
    '"',
    "\\",
    "{",
    "}",
    "\n",
]
any_char = st.one_of(st.characters(exclude_categories=()), st.sampled_from(ODD))  # surrogates and NUL included
any_text = st.text(any_char, max_size=120)


@st.composite
def corrupted(draw, base: st.SearchStrategy[str]) -> str:
    """`base`, then up to 3 edits: insert a few characters, delete a span, or replace one character."""
    text = draw(base)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            text = text[:i] + draw(st.text(any_char, min_size=1, max_size=4)) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 6)) :]
        else:
            text = text[:i] + draw(any_char) + text[i + 1 :]
    return text


def huge(limit: int) -> st.SearchStrategy[str]:
    """Actions around and far past the env's `max_action_chars` (built by repetition: hypothesis draws small data)."""
    unit = st.sampled_from(["x", "\x00", "é", "```bash\n", "[", "{", "pyautogui.click(1, 1)\n"])
    size = st.one_of(st.integers(limit - 2, limit + 2), st.just(300_000))
    return st.builds(lambda u, n: (u * (n // len(u) + 1))[:n], unit, size)


# ----- strategies: JSON text with absurd values (written by hand: json.dumps refuses some of them) -----
absurd_number = st.one_of(
    st.sampled_from(["1e308", "-1e308", "1e999", "NaN", "Infinity", "-Infinity", "-0", "4.9e-324", "9" * 400]),
    st.sampled_from(["9" * 5000, "-" + "9" * 4301, "1" + "0" * 40, "32768", "-32769", "1e5"]),
    st.integers().map(str),
    st.floats().map(json.dumps),  # NaN and Infinity too
)
json_string = any_text.map(json.dumps)  # with ensure_ascii, so "\ud800" and "\u0000" arrive as escapes
json_scalar = st.one_of(absurd_number, json_string, st.sampled_from(["true", "false", "null"]))
json_value = st.recursive(
    json_scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.dictionaries(st.text(max_size=6).map(json.dumps), inner, max_size=3).map(
            lambda d: "{" + ",".join(f"{k}:{v}" for k, v in d.items()) + "}"
        ),
    ),
    max_leaves=8,
)
deep_json = st.integers(500, 7000).map(lambda n: "[" * n + "]" * n)


def json_object(fields: dict[str, st.SearchStrategy[str]]) -> st.SearchStrategy[str]:
    """A JSON object text with these keys, each value drawn from its strategy (JSON text)."""
    return st.fixed_dictionaries(fields).map(
        lambda d: "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in d.items()) + "}"
    )


def tool_call(name: st.SearchStrategy[str], arguments: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """<tool_call>{"name": ..., "arguments": ...}</tool_call>, the arguments an object or a JSON string holding one."""
    args = st.one_of(arguments, arguments.map(json.dumps))
    body = json_object({"name": name.map(json.dumps), "arguments": args})
    return st.builds(lambda b, nl: f"<tool_call>{nl}{b}{nl}</tool_call>", body, st.sampled_from(["", "\n"]))


# ----- what every step must satisfy -----
def step(
    env: AgentEnv, action: Any, reset_options: dict[str, Any] | None = None, *, count: bool = True
) -> tuple[str, dict[str, Any]]:
    """One step that must not raise; checks the observation; resets the env when the episode ended."""
    obs, reward, terminated, truncated, info = env.step(action)
    assert env.observation_space.contains(obs), {k: type(v) for k, v in obs.items()}
    content = obs["content"]
    assert isinstance(content, str) and content == info["next_state"]["content"]
    content.encode("utf-8")  # an observation can always be written out (records, judges)
    assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
    signals = info["signals"]
    assert isinstance(signals.get(PARSE_ERROR, False), bool) and isinstance(signals.get(ERROR, False), bool)
    if signals.get(PARSE_ERROR):
        assert "could not parse" in content.lower()
    if count and currently_in_test_context():  # the statistics (--hypothesis-show-statistics) say how many actions ran
        event("parse error" if signals.get(PARSE_ERROR) else "ran, failed" if signals.get(ERROR) else "ran")
    if terminated or truncated:
        env.reset(options=reset_options)
    return content, signals


def rejected(env: AgentEnv, action: str, *fragments: str, reset_options: dict[str, Any] | None = None) -> str:
    """The step of `action` is a parse error whose observation contains every fragment."""
    content, signals = step(env, action, reset_options, count=False)
    assert signals.get(PARSE_ERROR), content
    for fragment in fragments:
        assert fragment in content, (fragment, content)
    return content


def with_surrogate(text: str, position: int) -> str:
    i = position % (len(text) + 1)
    return text[:i] + "\udc80" + text[i:]


# ----- a minimal plugin: only what AgentEnv asks for -----
class EchoEnv(AgentEnv):
    """A plugin env that trusts its input: it echoes the action's UTF-8 length. The base class must shield it."""

    acted: ClassVar[list[str]] = []

    @classmethod
    def tasks(cls, split: str = "train"):
        return [{"id": "echo"}]

    def begin(self, task):
        return Transition("say anything", role="user")

    def act(self, action):
        self.acted.append(action)
        return Transition(f"{len(action.encode('utf-8'))} bytes")

    def verify(self) -> float:
        return 0.0


@pytest.fixture(scope="module")
def echo_env():
    env = EchoEnv(max_steps=10**9, max_action_chars=1000)
    env.reset()
    yield env
    env.close()


@hostile(300)
@given(action=st.one_of(any_text, huge(1000), st.integers(), st.none(), st.binary(max_size=10)))
def test_plugin_inherits_the_guards(echo_env, action):
    EchoEnv.acted.clear()
    content, signals = step(echo_env, action)
    usable = isinstance(action, str) and len(action) <= 1000 and not any("\ud800" <= c <= "\udfff" for c in action)
    assert bool(signals.get(PARSE_ERROR)) != usable, content
    assert EchoEnv.acted == ([action] if usable else [])  # a rejected action never reaches act()
    if not isinstance(action, str):
        assert "expected text" in content
    elif len(action) > 1000:
        assert f"{len(action)} characters long; the limit is 1000" in content
    elif not usable:
        assert "lone surrogate" in content


# ----- terminal and swe: one ```bash block or one shell_exec call -----
SAFE_COMMANDS = ["ls", "echo hi", "pwd", "true", "false", "exit 3", "cat README.md", "printf '\\x00\\xff\\xfe'", ":"]
command = corrupted(st.sampled_from(SAFE_COMMANDS))


def shell_actions(limit: int) -> st.SearchStrategy[str]:
    """Mostly near-valid actions (so that many run), then broken ones, random text and huge actions."""
    block = st.builds(lambda lang, c: f"```{lang}\n{c}\n```", st.sampled_from(["bash", "sh", "shell"]), command)
    call = tool_call(st.just("shell_exec"), json_object({"command": command.map(json.dumps)}))
    near = st.one_of(
        st.builds(lambda lang, c: f"```{lang}\n{c}\n```", st.sampled_from(["python", "", "BASH"]), command),
        tool_call(st.sampled_from(["python", ""]) | any_text, json_object({"command": json_value}) | json_value),
        st.builds(lambda v: f"<tool_call>{v}</tool_call>", st.one_of(json_value, deep_json, any_text)),
    )
    valid = st.one_of(block, call)
    return st.one_of(valid, valid, corrupted(valid), near, corrupted(near), any_text, huge(limit))


def check_shell_env(env: AgentEnv, data, reset: dict[str, Any] | None) -> None:
    """The shell families' properties: any action is a step; the unusable classes are named parse errors."""
    limit = env.action_space.max_length
    action = data.draw(shell_actions(limit), label="action")
    step(env, action, reset)
    # a NUL byte in the command, in either form
    head, tail = data.draw(st.sampled_from(SAFE_COMMANDS)), data.draw(st.sampled_from(SAFE_COMMANDS))
    rejected(env, f"```bash\n{head}\x00{tail}\n```", "NUL byte", reset_options=reset)
    nul_call = {"name": "shell_exec", "arguments": {"command": f"{head}\x00{tail}"}}
    rejected(env, f"<tool_call>{json.dumps(nul_call)}</tool_call>", "NUL byte", reset_options=reset)
    # a lone surrogate, raw in the text or as a JSON escape
    rejected(env, with_surrogate(action[:200], data.draw(st.integers(0, 200))), "lone surrogate", reset_options=reset)
    sur_call = {"name": "shell_exec", "arguments": {"command": f"echo \ud800{tail}"}}
    rejected(env, f"<tool_call>{json.dumps(sur_call)}</tool_call>", "lone surrogate", reset_options=reset)
    # past the action limit, and JSON past Python's limits
    n = data.draw(st.integers(limit + 1, 3 * limit))
    rejected(env, "```bash\n" + "x" * n + "\n```", f"the limit is {limit}", reset_options=reset)
    depth = data.draw(st.integers(1, limit // 2 - 20))  # (how deep JSON may nest depends on the stack left)
    rejected(env, "<tool_call>" + "[" * depth + "]" * depth + "</tool_call>", reset_options=reset)
    rejected(
        env,
        '<tool_call>{"name": "shell_exec", "x": ' + "7" * 4400 + "}</tool_call>",
        "4300 digits",
        reset_options=reset,
    )


@pytest.fixture(scope="module")
def terminal_env():
    bwrap_or_skip()
    from envs.terminal.env import TerminalEnv

    env = TerminalEnv(max_steps=10**6, command_timeout=5)
    env.reset(options={"task": "text-count-errors"})
    yield env
    env.close()


@hostile(300)
@given(data=st.data())
def test_terminal_turns_any_action_into_a_step(terminal_env, data):
    check_shell_env(terminal_env, data, {"task": "text-count-errors"})


def test_terminal_runs_commands_longer_than_one_argv_string(terminal_env):
    """A command past MAX_ARG_STRLEN (128 KiB) runs when the env allows it: the sandbox gets it through an fd."""
    from envs.terminal.env import TerminalEnv

    env = TerminalEnv(max_action_chars=400_000, command_timeout=10, progress_from_tests=False)
    try:
        env.reset(options={"task": "text-count-errors"})
        payload = "x" * 300_000
        content, signals = step(env, f"```bash\nprintf %s {payload} | wc -c\n```")
        assert not signals.get(PARSE_ERROR) and signals["exit_code"] == 0 and "300000" in content, content
    finally:
        env.close()


@pytest.fixture(scope="module")
def swe_env():
    bwrap_or_skip()
    import swebench  # noqa: F401 (the swe extra, always installed: a broken one fails)
    from envs.swe.env import SWEEnv

    # a fresh cache the sandbox uid can reach (tmp_path's parents are private to root)
    cache = tempfile.mkdtemp(prefix="nextstate-hostile-swe-")
    os.chmod(cache, 0o755)
    env = SWEEnv(cache_dir=cache, repos_dir=os.path.join(cache, "repos"), max_steps=10**6, command_timeout=5)
    task = env.task_pool()[0]["id"]
    env.reset(options={"task": task})
    yield env, {"task": task}
    env.close()
    shutil.rmtree(cache, ignore_errors=True)


@hostile(100)
@given(data=st.data())
def test_swe_turns_any_action_into_a_step(swe_env, data):
    env, reset = swe_env
    check_shell_env(env, data, reset)


# ----- toolcall: one tool call or a \boxed{} answer -----
@pytest.fixture(scope="module")
def toolcall_env():
    from envs.toolcall.env import ToolCallEnv

    env = ToolCallEnv(tools=("python", "calculator"), max_steps=10**6, timeout_s=3)
    env.reset(options={"task": env.task_pool()[0]["id"]})
    yield env
    env.close()


SAFE_CODE = ["print(1 + 2)", "print('é' * 3)", "x = 2 ** 10\nprint(x)", "import sys; sys.exit(3)", "1/0"]
EXPRESSIONS = ["1 + 2", "(12 + 7) * 3", "2 ** 1000", "sqrt(2)", "9 ** 999 ** 999", "((9**999)**999)**999", "1e308*10"]


def toolcall_actions(limit: int) -> st.SearchStrategy[str]:
    code = corrupted(st.sampled_from(SAFE_CODE))
    expression = st.one_of(corrupted(st.sampled_from(EXPRESSIONS)), absurd_number)
    valid = st.one_of(
        tool_call(st.just("python"), json_object({"code": code.map(json.dumps)})),
        tool_call(st.just("calculator"), json_object({"expression": expression.map(json.dumps)})),
        st.builds(lambda a: f"The answer is \\boxed{{{a}}}", st.one_of(absurd_number, any_text)),
    )
    near = st.one_of(
        tool_call(st.just("python"), json_object({"code": json_value})),
        tool_call(st.sampled_from(["python", "calculator", "shell_exec"]) | any_text, json_value),
        st.builds(lambda v: f"<tool_call>{v}</tool_call>", st.one_of(json_value, deep_json, any_text)),
    )
    return st.one_of(valid, valid, corrupted(valid), near, corrupted(near), any_text, huge(limit))


@hostile(300)
@given(data=st.data())
def test_toolcall_turns_any_action_into_a_step(toolcall_env, data):
    env = toolcall_env
    reset = {"task": env.task_pool()[0]["id"]}
    limit = env.action_space.max_length
    _, signals = step(env, data.draw(toolcall_actions(limit), label="action"), reset)
    assert set(signals) >= {PARSE_ERROR, ERROR, "tool_name"}  # one signal schema for every step, rejected ones too
    escape = data.draw(st.sampled_from(["\ud800", "\u0000"]))
    rejected(env, tool_call_text("python", {"code": f"print(1){escape}"}), "argument 'code'", reset_options=reset)
    rejected(env, with_surrogate("\\boxed{42}", data.draw(st.integers(0, 10))), "lone surrogate", reset_options=reset)
    depth = data.draw(st.integers(1, limit // 2 - 20))
    rejected(env, "<tool_call>" + "[" * depth + "]" * depth + "</tool_call>", reset_options=reset)
    rejected(env, "<tool_call>" + "7" * 4400 + "</tool_call>", "4300 digits", reset_options=reset)
    rejected(env, "x" * (limit + 1), f"the limit is {limit}", reset_options=reset)


def test_json_nested_past_the_stack_is_named(terminal_env, toolcall_env, gui_env):
    """Outside hypothesis (which raises the recursion limit while it runs), as an env in a farm worker sees it."""
    deep = "[" * 1900 + "]" * 1900
    rejected(terminal_env, f'<tool_call>{{"name": "shell_exec", "arguments": {deep}}}</tool_call>', "too deeply")
    rejected(toolcall_env, f'<tool_call>{{"name": "python", "arguments": {deep}}}</tool_call>', "too deeply")
    rejected(gui_env, f'{{"action_type": "CLICK", "parameters": {deep}}}', "too deeply", reset_options=GUI_RESET)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_calculator_refuses_results_too_big_to_show(toolcall_env):
    """((9**999)**999)**999 is a short, valid expression whose value would take minutes and gigabytes to compute."""
    for expression, fragment in [("((9**999)**999)**999", "digits"), ("9**999*9**999*9**999*9**999*9**999", "digits")]:
        content, signals = step(toolcall_env, tool_call_text("calculator", {"expression": expression}))
        assert signals[ERROR] and fragment in content, content


# ----- gui: pyautogui code or computer_13 JSON -----
@pytest.fixture(scope="module")
def gui_env():
    from tests.gui_support import require_desktop_tools

    require_desktop_tools()
    from envs.gui.env import GUIEnv

    env = GUIEnv(
        split="all",
        screen_width=640,
        screen_height=480,
        max_steps=10**6,
        action_timeout_s=2.0,
        settle_max_s=0.3,
        progress_checks=False,
    )
    env.reset(options={"task": "ns-settings-dark-mode"})
    yield env
    env.close()


GUI_RESET = {"task": "ns-settings-dark-mode"}
on_screen = st.integers(-5, 700).map(str)
coordinate = st.one_of(on_screen, on_screen, absurd_number, st.sampled_from(["-40000", "1e999", "10**30", "-0.5"]))
ascii_text = st.text(st.characters(codec="ascii"), max_size=30)
typed = st.one_of(ascii_text, ascii_text, any_text)
POINTER = ["click", "doubleClick", "rightClick", "moveTo", "dragTo", "mouseDown", "moveRel"]


def pyautogui_code() -> st.SearchStrategy[str]:
    pointer = st.builds(lambda f, x, y: f"pyautogui.{f}({x}, {y})", st.sampled_from(POINTER), coordinate, coordinate)
    keyword = st.builds(lambda x, y: f"pyautogui.click(x={x}, y={y}, clicks=2)", coordinate, coordinate)
    scroll = st.builds(
        lambda f, n: f"pyautogui.{f}({n})",
        st.sampled_from(["scroll", "hscroll", "vscroll"]),
        st.one_of(st.integers(-20, 20).map(str), absurd_number),
    )
    write = st.builds(lambda f, t: f"pyautogui.{f}({t!r})", st.sampled_from(["write", "typewrite"]), typed)
    keys = st.builds(
        lambda f, k: f"pyautogui.{f}({k!r})",
        st.sampled_from(["press", "keyDown", "keyUp", "hotkey"]),
        st.one_of(st.sampled_from(["enter", "ctrl", "a", "tab"]), typed),
    )
    other = st.sampled_from(
        [
            "WAIT",
            "DONE",
            "FAIL",
            "import os",
            "pyautogui.os.system('id')",
            "time.sleep(0.01)",
            "pyautogui.sleep(-1)",
            "(" * 300 + ")" * 300,
            "-" * 3000 + "1",
            "1+" * 1900 + "1",
        ]
    )
    line = st.one_of(pointer, keyword, scroll, write, keys)
    return st.one_of(
        line, st.lists(line, min_size=2, max_size=3).map("\n".join), other, line.map(lambda c: f"```python\n{c}\n```")
    )


def computer_13() -> st.SearchStrategy[str]:
    kinds = st.sampled_from(
        [
            "MOVE_TO",
            "CLICK",
            "RIGHT_CLICK",
            "DOUBLE_CLICK",
            "DRAG_TO",
            "SCROLL",
            "TYPING",
            "PRESS",
            "KEY_DOWN",
            "HOTKEY",
            "MOUSE_DOWN",
            "WAIT",
            "DONE",
            "NOPE",
        ]
    )
    params = st.one_of(
        json_object({"x": coordinate, "y": coordinate}),
        json_object({"x": coordinate, "y": coordinate, "button": json_scalar, "num_clicks": absurd_number}),
        json_object({"dx": absurd_number, "dy": absurd_number}),
        json_object({"text": typed.map(json.dumps)}),
        json_object({"key": st.one_of(typed.map(json.dumps), json_value)}),
        json_object({"keys": json_value}),
        json_value,
    )
    return json_object({"action_type": kinds.map(json.dumps), "parameters": params})


@hostile(200)
@given(data=st.data())
def test_gui_turns_any_action_into_a_step(gui_env, data):
    limit = gui_env.action_space.max_length
    grammar = st.one_of(pyautogui_code(), computer_13())
    deep = deep_json.map('{{"a": {}}}'.format)
    action = data.draw(st.one_of(grammar, grammar, corrupted(grammar), any_text, huge(limit), deep), label="action")
    step(gui_env, action, GUI_RESET)  # the screenshot is checked by the observation space in step()
    # the unusable classes, named
    rejected(
        gui_env, with_surrogate(action[:200], data.draw(st.integers(0, 200))), "lone surrogate", reset_options=GUI_RESET
    )
    bad = data.draw(st.sampled_from(["1e308", "-40000", "32768", "1e999"]))
    func = data.draw(st.sampled_from(POINTER))
    rejected(gui_env, f"pyautogui.{func}({bad}, 10)", "not a screen coordinate", reset_options=GUI_RESET)
    rejected(
        gui_env,
        '{"action_type": "CLICK", "parameters": {"x": 10, "y": ' + bad + "}}",
        "finite number" if bad == "1e999" else "not a screen coordinate",
        reset_options=GUI_RESET,
    )
    nan = data.draw(st.sampled_from(["NaN", "Infinity", "-Infinity"]))
    rejected(
        gui_env,
        '{"action_type": "MOVE_TO", "parameters": {"x": ' + nan + ', "y": 1}}',
        "finite number",
        reset_options=GUI_RESET,
    )
    char = data.draw(st.sampled_from(["\x00", "\x1b", "\x07", "é", "中", "\x7f"]))
    rejected(gui_env, f"pyautogui.write({'ab' + char!r})", "cannot type", reset_options=GUI_RESET)
    rejected(
        gui_env,
        json.dumps({"action_type": "TYPING", "parameters": {"text": "ab" + char}}),
        "cannot type",
        reset_options=GUI_RESET,
    )
    digits = "9" * data.draw(st.integers(20, 3900))  # (past 4300 digits the action is past its 4000 characters)
    rejected(
        gui_env,
        '{"action_type": "CLICK", "parameters": {"x": ' + digits + ', "y": 1}}',
        "not a screen coordinate",
        reset_options=GUI_RESET,
    )
    rejected(gui_env, "x" * (limit + 1), f"the limit is {limit}", reset_options=GUI_RESET)


def test_gui_guards_leave_ordinary_actions_alone(gui_env):
    """The guards reject only what cannot run: clicks at the screen's edges, ASCII text, a scroll and WAIT still run."""
    for action in [
        "pyautogui.click(0, 0)",
        "pyautogui.moveTo(639, 479)",
        "pyautogui.write('a b\\tc')",
        '{"action_type": "SCROLL", "parameters": {"dy": -3}}',
        "WAIT",
    ]:
        content, signals = step(gui_env, action, GUI_RESET)
        assert not signals.get(PARSE_ERROR) and not signals.get(ERROR), (action, content)
