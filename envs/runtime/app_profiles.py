"""Files every episode's fresh HOME starts with so the guest's applications open as on OSWorld's VM, whose apps have
been started before: no first-start dialogs in front of the task's window.

LibreOffice: no "Tip of the Day" dialog (it takes the keyboard focus), no "running this version for the first time"
info bar (its last-run version is set above any real one). VLC: its first-start "Privacy and Network Access Policy"
question answered (it opens in front of the player and takes the keyboard; every other setting stays at its default,
so a vlcrc getter reads defaults until the agent saves preferences). Only first-start state is set here; the prompts
a user meets in normal work ("Keep current format" when saving xlsx/docx/pptx) stay, as on OSWorld's VM.
"""

from __future__ import annotations

LIBREOFFICE_PROFILE = "~/.config/libreoffice/4/user/registrymodifications.xcu"
VLCRC = "~/.config/vlc/vlcrc"


def _xcu(items: list[tuple[str, str, str]]) -> str:
    props = "".join(f'<item oor:path="{path}"><prop oor:name="{name}" oor:op="fuse"><value>{value}</value></prop>'
                    f"</item>\n" for path, name, value in items)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
            'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
            f"{props}</oor:items>\n")


FIRST_RUN_FILES: dict[str, str] = {
    LIBREOFFICE_PROFILE: _xcu([
        ("/org.openoffice.Office.Common/Misc", "ShowTipOfTheDay", "false"),
        ("/org.openoffice.Office.Common/Misc", "FirstRun", "false"),
        ("/org.openoffice.Setup/Product", "ooSetupLastVersion", "99.0"),
    ]),
    VLCRC: "[qt] # Qt interface\n# the first-start privacy and network question, answered\nqt-privacy-ask=0\n",
}

__all__ = ["FIRST_RUN_FILES", "LIBREOFFICE_PROFILE", "VLCRC"]
