"""Builders of the bundled gui tasks (OSWorld task JSON), and seeded variants of them.

`hand_written()` returns the 27 tasks of `tasks/bundled.json` (regenerate the file with
`python -m envs.gui.task_builders`; a test checks they agree). `variants(split, per_family, seed)` builds more tasks
from the same templates with other values: the train split draws names, words and numbers from one pool, the eval split
from a disjoint pool, so held-out success means the policy generalized rather than memorized a value.
Every task carries a scripted reference solution and a scripted wrong one.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

Task = dict[str, Any]
SIGNUP = "~/Documents/signup.json"
NOTES = "~/Documents/notes.txt"
SETTINGS = "~/.config/nsapp/settings.json"
CALC_STATE = "~/.local/state/nsapp/calc.txt"


# ----- evaluator / setup pieces -----
def a11y_text(name: str, text: str, role: str = "text") -> dict:
    return {
        "func": "check_accessibility_tree",
        "result": {"type": "accessibility_tree"},
        "expected": {"type": "rule", "rules": [{"xpath": f"//{role}[@name='{name}']", "text": text, "exact": True}]},
    }


def a11y_checked(name: str, role: str = "radio-button") -> dict:
    return {
        "func": "check_accessibility_tree",
        "result": {"type": "accessibility_tree"},
        "expected": {"type": "rule", "rules": [{"xpath": f"//{role}[@name='{name}'][@st:checked='true']"}]},
    }


def status(text: str) -> dict:
    return a11y_text("Status", text, role="label")


def json_rules(path: str, dest: str, expect: dict) -> dict:
    return {
        "func": "check_json",
        "result": {"type": "vm_file", "path": path, "dest": dest},
        "expected": {
            "type": "rule",
            "rules": {"expect": [{"key": [k], "method": "eq", "ref": v} for k, v in expect.items()]},
        },
    }


def cmd_exact(cmd: str, expected: str) -> dict:
    return {
        "func": "exact_match",
        "result": {"type": "vm_command_line", "command": cmd, "shell": True},
        "expected": {"type": "rule", "rules": {"expected": expected}},
    }


def cmd_incl(cmd: str, include, exclude=()) -> dict:
    return {
        "func": "check_include_exclude",
        "result": {"type": "vm_command_line", "command": cmd, "shell": True},
        "expected": {"type": "rule", "rules": {"include": list(include), "exclude": list(exclude)}},
    }


def launch(*argv: str) -> dict:
    return {"type": "launch", "parameters": {"command": list(argv)}}


def execute(cmd: str) -> dict:
    return {"type": "execute", "parameters": {"command": cmd, "shell": True}}


def task(id, split, instruction, config, evaluator, ready, solution, wrong, progress=(), a11y=True, related=()) -> Task:
    return {
        "id": id,
        "snapshot": "nextstate",
        "instruction": instruction,
        "source": "nextstate bundled",
        "config": config,
        "trajectory": "trajectories/",
        "related_apps": list(related),
        "evaluator": evaluator,
        "nextstate": {
            "split": split,
            "ready": {"window": ready, "a11y": a11y},
            "solution": solution,
            "wrong": wrong,
            "progress": list(progress),
        },
    }


# ----- families -----
def form(id, split, instruction, fields: dict, plan=None, subscribe=False, wrong=None) -> Task:
    sol, prog = [], []
    for field, value in fields.items():
        sol += [{"click": field, "role": "text"}, {"write": value}]
        prog.append(a11y_text(field, value))
    expect = {k.lower(): v for k, v in fields.items()}
    if plan:
        sol.append({"click": plan, "role": "radio button"})
        prog.append(a11y_checked(plan))
        expect["plan"] = plan
    if subscribe:
        sol.append({"click": "Subscribe to newsletter"})
        prog.append(a11y_checked("Subscribe to newsletter", "check-box"))
        expect["subscribe"] = True
    sol += [{"click": "Submit"}, "DONE"]
    prog.append(status("Submitted"))
    return task(
        id,
        split,
        instruction,
        [launch("ns-form", "--out", SIGNUP)],
        json_rules(SIGNUP, "signup.json", expect),
        "Sign-up form",
        sol,
        wrong(sol),
        prog,
        related=["ns-form"],
    )


def replace_write(old: str, new: str):
    return lambda sol: [({"write": new} if s == {"write": old} else s) for s in sol]


def drop(step):
    return lambda sol: [s for s in sol if s != step]


def swap(old, new):
    return lambda sol: [(new if s == old else s) for s in sol]


def editor_type(id, split, text, evaluator=None, wrong=None) -> Task:
    sol = [{"click": "Document"}, {"write": text}, {"click": "Save"}, "DONE"]
    return task(
        id,
        split,
        f"In the editor, type '{text}' into the document and save the file.",
        [execute("printf '' > ~/Documents/notes.txt"), launch("ns-editor", NOTES)],
        evaluator or cmd_exact("cat ~/Documents/notes.txt", text),
        "Editor - notes.txt",
        sol,
        wrong or [{"click": "Document"}, {"write": text}, "DONE"],
        [a11y_text("Document", text), cmd_exact("cat ~/Documents/notes.txt", text)],
        related=["ns-editor"],
    )


def settings(id, split, instruction, expect, sol, wrong, prog, evaluator=None) -> Task:
    ev = evaluator or json_rules(SETTINGS, "settings.json", expect)
    return task(
        id,
        split,
        instruction,
        [launch("ns-settings", "--config", SETTINGS)],
        ev,
        "Settings",
        sol,
        wrong,
        prog + [status("Settings saved")],
        related=["ns-settings"],
    )


def files(id, split, instruction, names, evaluator, sol, wrong, prog) -> Task:
    setup = execute("cd ~/Desktop && " + " && ".join(f"touch {f}" for f in names))
    return task(
        id,
        split,
        instruction,
        [setup, launch("ns-files", "~/Desktop")],
        evaluator,
        "Files - Desktop",
        sol,
        wrong,
        prog,
        related=["ns-files"],
    )


def files_delete(id, split, names, target, wrong_target) -> Task:
    keep = [n for n in names if n != target]
    return files(
        id,
        split,
        f"In the file list, delete '{target}'.",
        names,
        cmd_incl("ls ~/Desktop", keep, [target]),
        [{"click": target}, {"click": "Delete"}, "DONE"],
        [{"click": wrong_target}, {"click": "Delete"}, "DONE"],
        [status(f"Deleted {target}")],
    )


def files_rename(id, split, names, src, dst, wrong_dst) -> Task:
    return files(
        id,
        split,
        f"In the file list, rename '{src}' to '{dst}'.",
        names,
        cmd_exact(
            f"[ -f ~/Desktop/{dst} ] && [ ! -e ~/Desktop/{src} ] && echo renamed || echo not-renamed", "renamed\n"
        ),
        [{"click": src}, {"click": "New name", "role": "text"}, {"write": dst}, {"click": "Rename"}, "DONE"],
        [{"click": src}, {"click": "New name", "role": "text"}, {"write": wrong_dst}, {"click": "Rename"}, "DONE"],
        [a11y_text("New name", dst), status(f"Renamed {src} to {dst}")],
    )


def files_mkdir(id, split, names, folder, wrong) -> Task:
    return files(
        id,
        split,
        f"In the file list, create a new folder named '{folder}'.",
        names,
        cmd_exact(f"[ -d ~/Desktop/{folder} ] && echo yes || echo no", "yes\n"),
        [{"click": "New name", "role": "text"}, {"write": folder}, {"click": "New folder"}, "DONE"],
        [{"click": "New name", "role": "text"}, {"write": wrong}, {"click": "New folder"}, "DONE"],
        [a11y_text("New name", folder), status(f"Created {folder}")],
    )


def todo(id, split, item) -> Task:
    return task(
        id,
        split,
        f"Add '{item}' to the todo list.",
        [execute("printf 'water plants\\n' > ~/todo.txt"), launch("ns-todo", "~/todo.txt")],
        {
            "func": "check_list",
            "result": {"type": "vm_file", "path": "~/todo.txt", "dest": "todo.txt"},
            "expected": {"type": "rule", "rules": {"expect": ["^water plants$", f"^{item}$"], "unexpect": []}},
        },
        "Todo list",
        [{"write": item}, {"press": "enter"}, "DONE"],
        [{"write": item}, "DONE"],
        [cmd_incl("cat ~/todo.txt", [item])],
        a11y=False,
        related=["ns-todo"],
    )


# allowTitleOps off: the title stays "Terminal" (a login's .bashrc, as on Ubuntu, would set it to user@host: dir)
XTERM = launch("xterm", "-T", "Terminal", "-xrm", "XTerm*allowTitleOps: false", "-geometry", "90x24+0+0")


def terminal_file(id, split, fname, word, wrong_fname) -> Task:
    return task(
        id,
        split,
        f"A terminal window is open. Use it to create a file named {fname} in your home folder "
        f"that contains the word {word}.",
        [XTERM],
        cmd_incl(f"cat ~/{fname}", [word]),
        "Terminal",
        [{"click_window": "Terminal"}, {"write": f"echo {word} > ~/{fname}\n"}, "DONE"],
        [{"click_window": "Terminal"}, {"write": f"echo {word} > ~/{wrong_fname}\n"}, "DONE"],
        [cmd_incl(f"cat ~/{fname}", [word])],
        a11y=False,
        related=["xterm"],
    )


def terminal_mkdir(id, split, folder) -> Task:
    check = cmd_exact(f"[ -d ~/Desktop/{folder} ] && echo ok || echo missing", "ok\n")
    return task(
        id,
        split,
        f"A terminal window is open. Use it to create a folder named {folder} inside the Desktop folder of your home.",
        [XTERM],
        check,
        "Terminal",
        [{"click_window": "Terminal"}, {"write": f"mkdir ~/Desktop/{folder}\n"}, "DONE"],
        [{"click_window": "Terminal"}, {"write": f"mkdir ~/{folder}\n"}, "DONE"],
        [check],
        a11y=False,
        related=["xterm"],
    )


def calc(id, split, a, op, b, result, wrong_b) -> Task:
    def keys(bb):
        return [
            *({"click": d} for d in str(a)),
            {"click": op},
            *({"click": d} for d in str(bb)),
            {"click": "="},
            "DONE",
        ]

    return task(
        id,
        split,
        f"Use the calculator to compute {a} {op} {b}.",
        [launch("ns-calc", "--state", CALC_STATE)],
        cmd_exact(f"cat {CALC_STATE}", f"{result}\n"),
        "Calculator",
        keys(b),
        keys(wrong_b),
        [a11y_text("Display", str(result), role="label")],
        related=["ns-calc"],
    )


def infeasible(id, split, instruction, app) -> Task:
    cmd = launch("ns-settings", "--config", SETTINGS) if app == "settings" else launch("ns-form", "--out", SIGNUP)
    return task(
        id,
        split,
        instruction,
        [cmd],
        {"func": "infeasible"},
        "Settings" if app == "settings" else "Sign-up form",
        ["FAIL"],
        ["DONE"],
        related=["ns-" + app],
    )


# ----- the hand-written set (tasks/bundled.json) -----
def hand_written() -> list[Task]:
    """The 27 bundled tasks, app by app (the order of tasks/bundled.json)."""
    return [*form_tasks(), *editor_tasks(), *settings_tasks(), *file_manager_tasks(), *small_app_tasks()]


def form_tasks() -> list[Task]:
    """The sign-up form: a name; a plan with an email; the newsletter box."""
    return [
        form(
            "ns-form-name-alice",
            "train",
            "Type 'Alice Smith' in the Name field of the sign-up form and press Submit.",
            {"Name": "Alice Smith"},
            wrong=replace_write("Alice Smith", "Alice Smyth"),
        ),
        form(
            "ns-form-name-bob",
            "eval",
            "Type 'Bob Jones' in the Name field of the sign-up form and press Submit.",
            {"Name": "Bob Jones"},
            wrong=drop({"click": "Submit"}),
        ),
        form(
            "ns-form-pro-plan",
            "train",
            "Sign up 'Carol White' with the email 'carol@example.com' on the Pro plan, then press Submit.",
            {"Name": "Carol White", "Email": "carol@example.com"},
            plan="Pro",
            wrong=drop({"click": "Pro", "role": "radio button"}),
        ),
        form(
            "ns-form-team-plan",
            "eval",
            "Sign up 'Dan Brown' with the email 'dan@example.org' on the Team plan, then press Submit.",
            {"Name": "Dan Brown", "Email": "dan@example.org"},
            plan="Team",
            wrong=swap({"click": "Team", "role": "radio button"}, {"click": "Pro", "role": "radio button"}),
        ),
        form(
            "ns-form-subscribe-erin",
            "train",
            "Enter the name 'Erin Lee' in the sign-up form, tick 'Subscribe to newsletter' and submit.",
            {"Name": "Erin Lee"},
            subscribe=True,
            wrong=drop({"click": "Subscribe to newsletter"}),
        ),
        form(
            "ns-form-subscribe-frank",
            "eval",
            "Enter the name 'Frank Moore' in the sign-up form, tick 'Subscribe to newsletter' and submit.",
            {"Name": "Frank Moore"},
            subscribe=True,
            wrong=drop({"click": "Subscribe to newsletter"}),
        ),
    ]


def editor_tasks() -> list[Task]:
    """The text editor: type, fix a typo, append a line, each saved."""
    return [
        editor_type(
            "ns-editor-hello",
            "train",
            "hello world",
            evaluator={
                "func": "compare_text_file",
                "result": {"type": "vm_file", "path": NOTES, "dest": "notes.txt"},
                "expected": {"type": "cloud_file", "path": "editor/hello.txt", "dest": "hello_gold.txt"},
            },
        ),
        editor_type(
            "ns-editor-milk",
            "eval",
            "buy milk",
            wrong=[{"click": "Document"}, {"write": "buy milk"}, {"click": "Revert"}, {"click": "Save"}, "DONE"],
        ),
        task(
            "ns-editor-fix-typo",
            "train",
            "The document in the editor says 'Hello Wrold'. Correct it to 'Hello World' and save the file.",
            [
                {
                    "type": "download",
                    "parameters": {"files": [{"url": "editor/letter.txt", "path": "~/Documents/letter.txt"}]},
                },
                launch("ns-editor", "~/Documents/letter.txt"),
            ],
            cmd_exact("cat ~/Documents/letter.txt", "Hello World"),
            "Editor - letter.txt",
            [
                {"click": "Document"},
                {"hotkey": ["ctrl", "a"]},
                {"write": "Hello World"},
                {"hotkey": ["ctrl", "s"]},
                "DONE",
            ],
            [{"click": "Document"}, {"hotkey": ["ctrl", "a"]}, {"write": "Hello World"}, "DONE"],
            [a11y_text("Document", "Hello World"), cmd_exact("cat ~/Documents/letter.txt", "Hello World")],
            related=["ns-editor"],
        ),
        task(
            "ns-editor-append-line",
            "eval",
            "Add a second line 'line two' at the end of the document in the editor and save it.",
            [
                {
                    "type": "download",
                    "parameters": {"files": [{"url": "editor/plan.txt", "path": "~/Documents/plan.txt"}]},
                },
                {"type": "open", "parameters": {"path": "~/Documents/plan.txt"}},
            ],
            {
                "func": "check_list",
                "result": {"type": "vm_file", "path": "~/Documents/plan.txt", "dest": "plan.txt"},
                "expected": {"type": "rule", "rules": {"expect": ["^line one$", "^line two$"], "unexpect": []}},
            },
            "Editor - plan.txt",
            [{"click": "Document"}, {"hotkey": ["ctrl", "end"]}, {"write": "line two"}, {"click": "Save"}, "DONE"],
            [{"click": "Document"}, {"hotkey": ["ctrl", "end"]}, {"write": "line two"}, "DONE"],
            [a11y_text("Document", "line one\nline two"), cmd_incl("cat ~/Documents/plan.txt", ["line two"])],
            related=["ns-editor"],
        ),
    ]


def settings_tasks() -> list[Task]:
    """The settings window: toggles, the font size, the language, two changes at once."""
    return [
        settings(
            "ns-settings-dark-mode",
            "train",
            "Turn on Dark mode in the Settings window and apply the change.",
            {"dark_mode": True},
            [{"click": "Dark mode"}, {"click": "Apply"}, "DONE"],
            [{"click": "Dark mode"}, {"click": "Cancel"}, "DONE"],
            [a11y_checked("Dark mode", "check-box")],
        ),
        settings(
            "ns-settings-notifications-off",
            "eval",
            "Turn off Notifications in the Settings window and apply the change.",
            {"notifications": False},
            [{"click": "Notifications"}, {"click": "Apply"}, "DONE"],
            [{"click": "Dark mode"}, {"click": "Apply"}, "DONE"],
            [
                {
                    "func": "check_accessibility_tree",
                    "result": {"type": "accessibility_tree"},
                    "expected": {
                        "type": "rule",
                        "rules": [{"xpath": "//check-box[@name='Notifications'][not(@st:checked)]"}],
                    },
                }
            ],
        ),
        font_size("ns-settings-font-size", "train", 14, 13),
        settings(
            "ns-settings-language",
            "eval",
            "Switch the language to German in the Settings window and apply it.",
            {"language": "German"},
            [{"click": "German"}, {"click": "Apply"}, "DONE"],
            [{"click": "French"}, {"click": "Apply"}, "DONE"],
            [a11y_checked("German")],
        ),
        settings(
            "ns-settings-updates-quiet",
            "train",
            "In the Settings window, turn on Automatic updates and turn off Notifications, then apply.",
            None,
            [{"click": "Automatic updates"}, {"click": "Notifications"}, {"click": "Apply"}, "DONE"],
            [{"click": "Automatic updates"}, {"click": "Apply"}, "DONE"],
            [a11y_checked("Automatic updates", "check-box")],
            evaluator={
                "func": ["check_json", "check_json"],
                "conj": "and",
                "result": [
                    {"type": "vm_file", "path": SETTINGS, "dest": "settings_a.json"},
                    {"type": "vm_file", "path": SETTINGS, "dest": "settings_b.json"},
                ],
                "expected": [
                    {"type": "rule", "rules": {"expect": [{"key": ["auto_update"], "method": "eq", "ref": True}]}},
                    {"type": "rule", "rules": {"expect": [{"key": ["notifications"], "method": "eq", "ref": False}]}},
                ],
                "options": [{}, {}],
            },
        ),
    ]


def file_manager_tasks() -> list[Task]:
    """The file manager: delete, rename, a new folder."""
    return [
        files_delete(
            "ns-files-delete-report", "train", ["a.txt", "old_report.txt", "budget.csv"], "old_report.txt", "a.txt"
        ),
        files_delete("ns-files-delete-draft", "eval", ["draft.tmp", "notes.md", "photo.png"], "draft.tmp", "notes.md"),
        files_rename("ns-files-rename", "train", ["notes.txt", "readme.md"], "notes.txt", "todo.txt", "todo.text"),
        files_mkdir("ns-files-new-folder", "eval", ["index.html"], "projects", "project"),
    ]


def small_app_tasks() -> list[Task]:
    """The to-do list, the terminal, the calculator, and two infeasible requests."""
    return [
        todo("ns-todo-milk", "train", "buy milk"),
        todo("ns-todo-call", "eval", "call mom"),
        terminal_file("ns-terminal-hello-file", "train", "hello.txt", "hello", "hi.txt"),
        terminal_mkdir("ns-terminal-mkdir", "eval", "reports"),
        calc("ns-calc-add", "train", 7, "+", 8, 15, 9),
        calc("ns-calc-multiply", "eval", 6, "*", 7, 42, 8),
        infeasible(
            "ns-infeasible-resolution",
            "train",
            "In the Settings window, set the screen resolution to 3840x2160.",
            "settings",
        ),
        infeasible(
            "ns-infeasible-button-colour",
            "eval",
            "Change the colour of the Submit button in the sign-up form to red.",
            "form",
        ),
    ]


def font_size(id, split, size, wrong) -> Task:
    return settings(
        id,
        split,
        f"Set the font size to {size} in the Settings window and apply it.",
        {"font_size": size},
        [{"click": "Font size", "role": "spin button", "clicks": 3}, {"write": str(size)}, {"click": "Apply"}, "DONE"],
        [{"click": "Font size", "role": "spin button", "clicks": 3}, {"write": str(wrong)}, {"click": "Apply"}, "DONE"],
        [a11y_text("Font size", str(size), role="spin-button")],
    )


# ----- seeded variants -----
#: value pools: the train split draws from the first, the eval split from the second (disjoint)
FIRST = (
    ["Alice", "Carol", "Erin", "Grace", "Ivan", "Kim", "Mona", "Oscar", "Quinn", "Sara", "Uma", "Wes"],
    ["Bob", "Dan", "Frank", "Hana", "Jon", "Lena", "Nils", "Paula", "Rita", "Tom", "Vera", "Yuri"],
)
LAST = (
    ["Smith", "White", "Lee", "Hall", "Young", "King", "Wright", "Green"],
    ["Jones", "Brown", "Moore", "Clark", "Lewis", "Walker", "Scott", "Adams"],
)
WORDS = (
    ["hello world", "buy bread", "meeting at noon", "call the bank", "pay rent", "water the lawn", "book flights"],
    ["buy milk", "send invoice", "walk the dog", "fix the sink", "read a book", "plan the trip", "clean the desk"],
)
FILES = (
    ["old_report.txt", "a.txt", "budget.csv", "summary.doc", "photo1.jpg", "notes.txt", "draft_v1.md", "log.txt"],
    ["draft.tmp", "notes.md", "photo.png", "cache.bin", "old.zip", "scan.pdf", "list.csv", "memo.txt"],
)
FOLDERS = (["drafts", "archive", "music", "backup", "invoices"], ["reports", "photos", "letters", "scripts", "games"])
ITEMS = (
    ["buy milk", "pay bills", "book dentist", "fix bike", "call grandma"],
    ["call mom", "buy stamps", "return books", "water plants today", "email boss"],
)
TOGGLES = [
    ("Dark mode", "dark_mode", True),
    ("Notifications", "notifications", False),
    ("Automatic updates", "auto_update", True),
]
LANGS = ["English", "German", "French"]


def variants(split: str, per_family: int = 5, seed: int = 0) -> list[Task]:
    """`per_family` tasks of each family for `split` ("train" or "eval"), values from that split's pools."""
    if split not in ("train", "eval"):
        raise ValueError(f"variants exist for train and eval, not {split!r}")
    pool = 0 if split == "train" else 1
    rng = random.Random(f"{seed}-{split}")
    out: list[Task] = []
    for i in range(per_family):
        # one task per family, drawn in this order from the one generator (the order fixes every value)
        tag = f"{split}-{i}"
        out.append(form_variant(rng, pool, split, tag, i))
        out.append(editor_type(f"ns-gen-editor-{tag}", split, rng.choice(WORDS[pool])))
        out.append(toggle_variant(split, tag, i))
        out.append(font_or_language_variant(rng, pool, split, tag, i))
        out.append(files_variant(rng, pool, split, tag, i))
        out.append(todo(f"ns-gen-todo-{tag}", split, rng.choice(ITEMS[pool])))
        out.append(terminal_variant(rng, pool, split, tag, i))
        out.append(calc_variant(rng, pool, split, tag))
    return out


def form_variant(rng: random.Random, pool: int, split: str, tag: str, i: int) -> Task:
    """The sign-up form, by turns: a name; a plan with an email; the newsletter box."""
    n = f"{rng.choice(FIRST[pool])} {rng.choice(LAST[pool])}"
    email = f"{n.split()[0].lower()}.{n.split()[1].lower()}@example.com"
    plan = rng.choice(["Pro", "Team"])
    other = "Free" if i % 2 else ("Team" if plan == "Pro" else "Pro")
    kind = i % 3
    if kind == 0:
        return form(
            f"ns-gen-form-name-{tag}",
            split,
            f"Type '{n}' in the Name field of the sign-up form and press Submit.",
            {"Name": n},
            wrong=replace_write(n, n.split()[0]),
        )
    if kind == 1:
        return form(
            f"ns-gen-form-plan-{tag}",
            split,
            f"Sign up '{n}' with the email '{email}' on the {plan} plan, then press Submit.",
            {"Name": n, "Email": email},
            plan=plan,
            wrong=swap({"click": plan, "role": "radio button"}, {"click": other, "role": "radio button"}),
        )
    return form(
        f"ns-gen-form-subscribe-{tag}",
        split,
        f"Enter the name '{n}' in the sign-up form, tick 'Subscribe to newsletter' and submit.",
        {"Name": n},
        subscribe=True,
        wrong=drop({"click": "Subscribe to newsletter"}),
    )


def toggle_variant(split: str, tag: str, i: int) -> Task:
    """One of the settings' toggles, in turn (the wrong solution clicks the next one)."""
    label, key, value = TOGGLES[i % len(TOGGLES)]
    verb = "Turn on" if value else "Turn off"
    other_label = TOGGLES[(i + 1) % len(TOGGLES)][0]
    return settings(
        f"ns-gen-settings-toggle-{tag}",
        split,
        f"{verb} {label} in the Settings window and apply the change.",
        {key: value},
        [{"click": label}, {"click": "Apply"}, "DONE"],
        [{"click": other_label}, {"click": "Apply"}, "DONE"],
        [],
    )


def font_or_language_variant(rng: random.Random, pool: int, split: str, tag: str, i: int) -> Task:
    """The settings' font size (even turns; the split's own range of sizes) or language (odd turns)."""
    if i % 2 == 0:
        size = rng.choice(range(12, 21) if pool == 0 else range(22, 31))
        return font_size(f"ns-gen-settings-font-{tag}", split, size, size + 1)
    lang = rng.choice(LANGS[1:])
    wrong_lang = next(x for x in LANGS[1:] if x != lang)
    return settings(
        f"ns-gen-settings-language-{tag}",
        split,
        f"Switch the language to {lang} in the Settings window and apply it.",
        {"language": lang},
        [{"click": lang}, {"click": "Apply"}, "DONE"],
        [{"click": wrong_lang}, {"click": "Apply"}, "DONE"],
        [a11y_checked(lang)],
    )


def files_variant(rng: random.Random, pool: int, split: str, tag: str, i: int) -> Task:
    """The file manager over three of the split's file names, by turns: delete, rename, a new folder."""
    names = rng.sample(FILES[pool], 3)
    if i % 3 == 0:
        return files_delete(f"ns-gen-files-delete-{tag}", split, names, names[1], names[0])
    if i % 3 == 1:
        dst = "renamed_" + names[0]
        return files_rename(f"ns-gen-files-rename-{tag}", split, names, names[0], dst, dst + ".bak")
    folder = rng.choice(FOLDERS[pool])
    return files_mkdir(f"ns-gen-files-mkdir-{tag}", split, names, folder, folder + "2")


def terminal_variant(rng: random.Random, pool: int, split: str, tag: str, i: int) -> Task:
    """The terminal, by turns: a file holding a word; a new folder."""
    if i % 2 == 0:
        word = rng.choice(["hello", "alpha", "omega", "delta", "kappa"] if pool == 0 else ["gamma", "sigma", "zeta"])
        return terminal_file(f"ns-gen-terminal-file-{tag}", split, f"{word}.txt", word, f"{word}.txt.bak")
    return terminal_mkdir(f"ns-gen-terminal-mkdir-{tag}", split, rng.choice(FOLDERS[pool]))


def calc_variant(rng: random.Random, pool: int, split: str, tag: str) -> Task:
    """The calculator on two digits (train: + and *; eval: - and +); the wrong solution changes the second."""
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    op = rng.choice(["+", "*"] if pool == 0 else ["-", "+"])
    result = {"+": a + b, "*": a * b, "-": a - b}[op]
    return calc(f"ns-gen-calc-{tag}", split, a, op, b, result, b + 1 if b < 9 else b - 1)


def main() -> int:
    path = Path(__file__).resolve().parent / "tasks" / "bundled.json"
    path.write_text(json.dumps(hand_written(), indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
