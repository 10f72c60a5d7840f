"""The app state an OSWorld VM snapshot starts with, written into the desktop's HOME before a task's setup runs.

OSWorld's tasks assume apps that have been started before on that VM: VLC with its web interface on (port 8080,
password "password": the `vlc_playing_info` getter reads its status.xml) and its privacy question answered,
LibreOffice past its first start (no "Tip of the Day" dialog, no "running this version for the first time" bar),
and a Chrome profile (`~/.config/google-chrome/Default/Preferences`, which some tasks' setups edit with jq before
Chrome starts). A fresh desktop HOME has none of it, so each episode gets these files, each only where the file is
absent: a desktop whose snapshot has its own (a real OSWorld VM) keeps them. What an episode's apps write afterwards
lives in the episode's HOME, in the sandbox's throwaway root, and is gone with it.
"""

from __future__ import annotations

import shlex
from typing import Protocol

from envs.runtime import ExecResult

#: VLC 3's vlcrc: the web (lua http) interface next to the Qt one, its password, no first-run privacy dialog
VLCRC = """\
[qt]
qt-privacy-ask=0

[core]
extraintf=http

[lua]
http-password=password
"""

#: LibreOffice's user settings: no tip dialog at start; `@LO_VERSION@` (the installed major.minor, filled in on the
#: desktop) as the last version run, so no "first time" info bar
LIBREOFFICE_XCU = """\
<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema" \
xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse">\
<value>false</value></prop></item>
<item oor:path="/org.openoffice.Setup/Product"><prop oor:name="ooSetupLastVersion" oor:op="fuse">\
<value>@LO_VERSION@</value></prop></item>
</oor:items>
"""

CHROME_DIR = ".config/google-chrome"  # OSWorld's Chrome profile, which the google-chrome stand-in uses too

#: HOME-relative path -> content
PROFILE_FILES: dict[str, str] = {
    ".config/vlc/vlcrc": VLCRC,
    ".config/libreoffice/4/user/registrymodifications.xcu": LIBREOFFICE_XCU,
    f"{CHROME_DIR}/First Run": "",  # Chrome's first-run sentinel: no welcome page
    f"{CHROME_DIR}/Default/Preferences": "{}",
}

# the installed LibreOffice's major.minor (Debian's version "4:7.4.7-1" -> 7.4), where LibreOffice is installed
_LO_VERSION = ("lo=$(dpkg-query -W -f='${Version}' libreoffice-core 2>/dev/null | "
               "sed -E 's/^[0-9]+://; s/^([0-9]+\\.[0-9]+).*/\\1/')")


class _Executes(Protocol):
    def execute(self, command: str, shell: bool = False, timeout: float | None = None) -> ExecResult: ...


def profile_script(files: dict[str, str] | None = None) -> str:
    """One shell script that writes each file under $HOME that is not there yet."""
    lines = [_LO_VERSION]
    for rel, content in (PROFILE_FILES if files is None else files).items():
        path = shlex.quote(rel)
        if "@LO_VERSION@" in content:
            head, tail = content.split("@LO_VERSION@", 1)
            body = f'printf "%s%s%s" {shlex.quote(head)} "${{lo:-0.0}}" {shlex.quote(tail)}'
        else:
            body = f"printf %s {shlex.quote(content)}"
        lines.append(f'[ -e "$HOME"/{path} ] || {{ mkdir -p "$(dirname "$HOME"/{path})" && {body} > "$HOME"/{path}; }}')
    return "\n".join(lines)


def write_profiles(desktop: _Executes) -> ExecResult:
    """Write the snapshot's app files into the desktop's HOME (where absent); one command on the desktop."""
    return desktop.execute(profile_script(), shell=True, timeout=30)


__all__ = ["CHROME_DIR", "PROFILE_FILES", "profile_script", "write_profiles"]
