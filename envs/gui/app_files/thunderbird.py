"""The thunderbird tasks' files (`out/thunderbird/`): a Thunderbird profile that opens straight to the mail window
(profiles.ini / installs.ini naming it, prefs.js with one local mail account and the first-start questions answered)
and the Inbox of its Local Folders as an mbox file of a few messages.

The tasks copy these into `~/.thunderbird/` with `download` steps (OSWorld's tasks unpack a profile tarball the same
way). The profile is Thunderbird's default for Debian's install (/usr/lib/thunderbird: installs.ini's section name is
the hash Thunderbird gives that directory), so a plain `thunderbird` opens it.
"""

from __future__ import annotations

from email.utils import format_datetime
from datetime import datetime, timezone
from pathlib import Path

PROFILE = "ns.default"  # the profile directory under ~/.thunderbird
INSTALL_HASH = "FDC34C9F024745EB"  # Thunderbird's hash of its install directory /usr/lib/thunderbird

PROFILES_INI = f"""\
[Profile0]
Name=default
IsRelative=1
Path={PROFILE}
Default=1

[General]
StartWithLastProfile=1
Version=2

[Install{INSTALL_HASH}]
Default={PROFILE}
Locked=1
"""

INSTALLS_INI = f"""\
[{INSTALL_HASH}]
Default={PROFILE}
Locked=1
"""

# the account: Local Folders plus an identity for a mail address with no server (nothing reaches the network);
# the rest answers the questions a first start asks (account hub, start page, rights notice, default client,
# telemetry, update, donation appeal)
PREFS = {
    "mail.accountmanager.accounts": "account1,account2",
    "mail.accountmanager.defaultaccount": "account2",
    "mail.accountmanager.localfoldersserver": "server1",
    "mail.account.account1.server": "server1",
    "mail.account.account2.identities": "id1",
    "mail.account.account2.server": "server2",
    "mail.identity.id1.fullName": "Robin Marsh",
    "mail.identity.id1.useremail": "robin.marsh@harbour.example",
    "mail.identity.id1.valid": True,
    "mail.server.server1.directory-rel": "[ProfD]Mail/Local Folders",
    "mail.server.server1.hostname": "Local Folders",
    "mail.server.server1.name": "Local Folders",
    "mail.server.server1.type": "none",
    "mail.server.server1.userName": "nobody",
    "mail.server.server2.directory-rel": "[ProfD]Mail/harbour.example",
    "mail.server.server2.hostname": "harbour.example",
    "mail.server.server2.name": "robin.marsh@harbour.example",
    "mail.server.server2.type": "none",
    "mail.server.server2.userName": "robin.marsh",
    "mail.provider.enabled": False,
    "mail.shell.checkDefaultClient": False,
    "mail.rights.version": 1,
    "mailnews.start_page.enabled": False,
    "mailnews.start_page_override.mstone": "ignore",
    "mail.inappnotifications.enabled": False,
    "app.donation.eoy.version.viewed": 99,
    "app.update.enabled": False,
    "app.update.auto": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "datareporting.policy.dataSubmissionPolicyBypassNotification": True,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "mail.spam.manualMark": False,
    "calendar.timezone.local": "UTC",
}

# (sender, subject, body lines): the Inbox, oldest first
MESSAGES = [
    ("Ada Lowe <ada.lowe@harbour.example>", "Reading group: next title",
     ["Hi Robin,", "", "The reading group picked 'The Lighthouse Keeper' for next month.", "", "Ada"]),
    ("Quay Street Bakery <orders@bakery.example>", "Your order #4471 is ready",
     ["Your order of two sourdough loaves is ready for pick-up until 18:00."]),
    ("Harbour Town Library <desk@library.example>", "Invoice 2026-031 for the hall booking",
     ["Dear Robin,", "", "Please find the invoice for the hall booking of 14 March below.", "Total: 45.00",
      "", "Harbour Town Library"]),
    ("Sam Okafor <sam.okafor@harbour.example>", "Boat trip on Saturday",
     ["Robin, are you still in for the boat trip on Saturday? We leave the quay at 9.", "", "Sam"]),
]
FIRST_DATE = datetime(2026, 3, 2, 9, 15, tzinfo=timezone.utc)


def _pref_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def prefs_js(prefs: dict[str, object]) -> str:
    lines = ["// Mozilla User Preferences (written by the task)", ""]
    lines += [f'user_pref("{k}", {_pref_value(v)});' for k, v in sorted(prefs.items())]
    return "\n".join(lines) + "\n"


def inbox_mbox() -> str:
    """The messages in mbox format, each with Thunderbird's status headers (unread)."""
    out = []
    for i, (sender, subject, body) in enumerate(MESSAGES):
        when = FIRST_DATE.replace(day=FIRST_DATE.day + 3 * i, hour=9 + i)
        out.append(
            f"From - {when.strftime('%a %b %d %H:%M:%S %Y')}\n"
            "X-Mozilla-Status: 0000\nX-Mozilla-Status2: 00000000\n"
            f"Message-ID: <ns-{i + 1}@harbour.example>\n"
            f"Date: {format_datetime(when)}\n"
            f"From: {sender}\n"
            "To: Robin Marsh <robin.marsh@harbour.example>\n"
            f"Subject: {subject}\n"
            "MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: 7bit\n\n"
            + "\n".join(body) + "\n\n"
        )
    return "".join(out)


def build(out: Path) -> None:
    d = out / "thunderbird"
    d.mkdir(parents=True, exist_ok=True)
    (d / "profiles.ini").write_text(PROFILES_INI)
    (d / "installs.ini").write_text(INSTALLS_INI)
    (d / "prefs.js").write_text(prefs_js(PREFS))
    (d / "Inbox").write_text(inbox_mbox())
