"""Files every episode's fresh HOME starts with so the guest's applications open as on OSWorld's VM, whose apps have
been started before: no first-start dialogs in front of the task's window.

LibreOffice: no "Tip of the Day" dialog (it takes the keyboard focus), no "running this version for the first time"
info bar (its last-run version is set above any real one). VLC: no privacy question at start, and its web interface
on (port 8080, password "password", as OSWorld's VM has it: the `vlc_playing_info` getter reads its status.xml).
Chrome: a profile that has been run (no welcome page), `~/.config/google-chrome/Default/Preferences`, which some of
OSWorld's tasks edit with jq before Chrome starts (Debian's Chromium stands in for it, on this profile:
envs/gui/setup_steps.py). Only first-start state is set here; the prompts a user meets in normal work ("Keep current
format" when saving xlsx/docx/pptx) stay, as on OSWorld's VM. The files live in the episode's HOME, in the sandbox's
throwaway root: what an episode's apps write to them is gone with it.
"""

from __future__ import annotations

LIBREOFFICE_PROFILE = "~/.config/libreoffice/4/user/registrymodifications.xcu"
VLC_PROFILE = "~/.config/vlc/vlcrc"
CHROME_DIR = ".config/google-chrome"  # under HOME: OSWorld's Chrome profile, which Chromium standing in for it uses


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
    # VLC 3's vlcrc: the web (lua http) interface next to the Qt one, its password, no first-run privacy dialog
    VLC_PROFILE: "[qt]\nqt-privacy-ask=0\n\n[core]\nextraintf=http\n\n[lua]\nhttp-password=password\n",
    f"~/{CHROME_DIR}/First Run": "",  # Chrome's first-run sentinel: no welcome page
    f"~/{CHROME_DIR}/Default/Preferences": "{}",
}

__all__ = ["CHROME_DIR", "FIRST_RUN_FILES", "LIBREOFFICE_PROFILE", "VLC_PROFILE"]
