"""What the bundled sign-up form and settings dialog show after each scripted step, without a desktop: the rendering
behind the multistep demonstrations (envs.gui.multistep), thousands of them in seconds.

The layout (windows, elements, their roles, names and coordinates, which depend on fonts and themes) is always
measured: a live recording of the app's first screen (`Layout`). An `AppModel` holds the app's state (texts, checked
boxes and radios, the status line, which element has the focus), changes it per scripted step as the GTK app does
(envs/gui/apps/form.py, settings.py), and gives the element list the accessibility tree would. The env's own `render`
turns it into the observation text. tests/test_gui_multistep.py plays samples on a live desktop and compares the
rendered conversations with the recorded ones byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from envs.gui.observation import Element
from envs.runtime.desktop import WindowInfo

FOCUSED, CHECKED = "focused", "checked"


class ModelError(ValueError):
    """A step the model does not know how to apply (it would render something the app does not show)."""


@dataclass(frozen=True)
class Layout:
    """An app's first screen as recorded live: its windows and elements (whose states the model then overrides)."""

    windows: tuple[WindowInfo, ...]
    elements: tuple[Element, ...]

    def find(self, name: str, role: str | None = None) -> Element:
        for e in self.elements:
            if (e.name == name or (not e.name and e.text == name)) and (role is None or e.role == role):
                return e
        raise ModelError(f"no element {name!r} ({role or 'any role'}) in the layout: "
                         f"{sorted({e.name for e in self.elements})}")


class AppModel:
    """Common part: focus and per-element texts / checked states over a recorded layout."""

    def __init__(self, layout: Layout):
        self.layout = layout
        self.focus: tuple[str, str] | None = None  # (role, name) of the focused element
        self.texts: dict[str, str] = {}  # element name -> text (text fields)
        self.checked: dict[str, bool] = {}  # element name -> checked (check boxes, radios)
        self.status = ""

    # ----- steps -----
    def apply(self, step: Any) -> None:
        """Change the state as the app does for one scripted step (envs.gui.solution's step format)."""
        if isinstance(step, str):
            if step in ("DONE", "FAIL", "WAIT"):
                return
            raise ModelError(f"the model plays scripted steps, not action text {step!r}")
        if "do" in step:
            for part in step["do"]:
                self.apply(part)
        elif "click" in step:
            el = self.layout.find(step["click"], step.get("role"))
            self.click(el, int(step.get("clicks", 1)))
        elif "write" in step:
            self.write(str(step["write"]))
        elif "press" in step:
            self.press(str(step["press"]))
        else:
            raise ModelError(f"the model does not play {step!r}")

    def click(self, el: Element, clicks: int) -> None:
        self.focus = (el.role, el.name)
        if el.role == "radio button":
            for other in self.layout.elements:
                if other.role == "radio button" and self._same_group(other, el):
                    self.checked[other.name] = other.name == el.name
        elif el.role == "check box":
            self.checked[el.name] = not self.checked.get(el.name, False)
        elif el.role == "push button":
            self.button(el.name)
        elif el.role not in ("text", "spin button"):
            raise ModelError(f"a click on {el.role} {el.name!r} is not modelled")

    def write(self, text: str) -> None:
        if self.focus is None or self.focus[0] != "text":
            raise ModelError(f"typing {text!r} with the focus on {self.focus}: not modelled")
        name = self.focus[1]
        self.texts[name] = self.texts.get(name, "") + text  # the caret is at the end of what was typed before

    def press(self, key: str) -> None:
        raise ModelError(f"key {key!r} is not modelled here")

    def button(self, name: str) -> None:
        raise ModelError(f"button {name!r} is not modelled")

    def _same_group(self, a: Element, b: Element) -> bool:
        return True  # each modelled app has one radio group

    # ----- what the accessibility tree shows -----
    def elements(self) -> list[Element]:
        out = []
        for e in self.layout.elements:
            states = set(e.states) - {FOCUSED, CHECKED}
            if self.focus == (e.role, e.name):
                states.add(FOCUSED)
            if self.checked.get(e.name, False) and e.role in ("check box", "radio button"):
                states.add(CHECKED)
            text, value = e.text, e.value
            if e.role == "text":
                text = self.texts.get(e.name, "")
            elif e.role == "label" and e.name == "Status":
                text = self.status
            out.append(replace(e, text=text, value=self.value_of(e, value), states=frozenset(states)))
        return out

    def value_of(self, e: Element, value: str | None) -> str | None:
        return value


class FormModel(AppModel):
    """ns-form: Name, Email, the Free / Pro / Team plan, a newsletter box; Submit saves, Clear empties the form."""

    def __init__(self, layout: Layout):
        super().__init__(layout)
        self.reset()
        self.saved: dict[str, Any] | None = None

    def reset(self) -> None:
        self.texts = {"Name": "", "Email": ""}
        self.checked = {"Free": True, "Pro": False, "Team": False, "Subscribe to newsletter": False}
        self.status = "Not submitted"

    def button(self, name: str) -> None:
        if name == "Submit":
            plan = next(p for p in ("Free", "Pro", "Team") if self.checked[p])
            self.saved = {"name": self.texts["Name"], "email": self.texts["Email"], "plan": plan,
                          "subscribe": self.checked["Subscribe to newsletter"]}
            self.status = "Submitted"
        elif name == "Clear":
            self.reset()
            self.status = "Form cleared"
        else:
            super().button(name)


class SettingsModel(AppModel):
    """ns-settings: three switches, a font size spin button, a language; Apply saves, Cancel restores the saved."""

    SWITCHES = {"Dark mode": "dark_mode", "Notifications": "notifications", "Automatic updates": "auto_update"}
    LANGUAGES = ("English", "German", "French")

    def __init__(self, layout: Layout, initial: Mapping[str, Any]):
        super().__init__(layout)
        self.saved = dict(initial)
        self.font = int(initial["font_size"])
        self.font_text: str | None = None  # typed into the spin button and not committed yet
        self.show(self.saved)

    def show(self, values: Mapping[str, Any]) -> None:
        for label, key in self.SWITCHES.items():
            self.checked[label] = bool(values[key])
        self.font, self.font_text = int(values["font_size"]), None
        for lang in self.LANGUAGES:
            self.checked[lang] = lang == values["language"]

    def click(self, el: Element, clicks: int) -> None:
        if self.focus == ("spin button", "Font size") and (el.role, el.name) != self.focus:
            self.commit_font()  # the spin button takes a typed value when it loses the focus
        if el.role == "spin button":
            if clicks != 3:
                raise ModelError("only a triple click (select the whole value) on the spin button is modelled")
            self.focus, self.font_text = (el.role, el.name), ""
            return
        super().click(el, clicks)

    def _same_group(self, a: Element, b: Element) -> bool:
        return a.name in self.LANGUAGES and b.name in self.LANGUAGES

    def write(self, text: str) -> None:
        if self.focus == ("spin button", "Font size") and self.font_text is not None:
            self.font_text += text
            return
        super().write(text)

    def press(self, key: str) -> None:
        if key == "enter" and self.focus == ("spin button", "Font size"):
            self.commit_font()
            return
        super().press(key)

    def commit_font(self) -> None:
        if self.font_text:
            if not self.font_text.isdigit():
                raise ModelError(f"a non-numeric font size {self.font_text!r} is not modelled")
            self.font = min(32, max(8, int(self.font_text)))
        self.font_text = None

    def button(self, name: str) -> None:
        if name == "Apply":
            self.commit_font()
            self.saved = {**{key: self.checked[label] for label, key in self.SWITCHES.items()},
                          "font_size": self.font, "language": next(x for x in self.LANGUAGES if self.checked[x])}
            self.status = "Settings saved"
        elif name == "Cancel":
            self.show(self.saved)
            self.status = "Changes discarded"
        else:
            super().button(name)

    def value_of(self, e: Element, value: str | None) -> str | None:
        return str(self.font) if e.role == "spin button" else value


def model_for(family: str, layout: Layout, params: Mapping[str, Any]) -> AppModel:
    if family == "form":
        return FormModel(layout)
    if family == "settings":
        return SettingsModel(layout, params["initial"])
    raise ModelError(f"no app model for the {family!r} family")


__all__ = ["AppModel", "FormModel", "Layout", "ModelError", "SettingsModel", "model_for"]
