"""The gimp, vlc, thunderbird, chrome and vs_code app tasks (envs/gui/tasks/apps/<domain>.json) and their generated
files (envs/gui/app_files/<domain>.py).

Fast: each domain's files are what its tasks and metrics expect: the evaluators score a right answer made from the
generated inputs 1 and the inputs themselves (nothing done) 0, the Thunderbird profile parses as the metrics read it,
the web pages link each other. The replays on the real apps are tests/test_gui_app_tasks.py's slow tier; here, with
the desktop's guest root: the VS Code tasks are refused at setup in one line naming `code` (not a Debian package).
"""

from __future__ import annotations

import json
import re
import wave
from pathlib import Path

import pytest

from envs.gui import app_files
from envs.gui.app_tasks import domain_tasks
from envs.gui.env import GUIConfig, GUIEnv
from envs.gui.metrics import METRICS
from envs.gui.metrics.apps import thunderbird_filters, thunderbird_prefs
from envs.gui.setup_steps import SetupError, not_installed
from envs.runtime.app_profiles import FIRST_RUN_FILES, VLC_PROFILE

DOMAINS = ("gimp", "vlc", "thunderbird", "chrome", "vs_code")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("app-files")
    for domain in DOMAINS:
        app_files.build_domain(domain, out)
    return out


def _score(task: dict, result, expected=None) -> float:
    """The task's (single or first) metric on a result, with its rule or the given expected file."""
    ev = task["evaluator"]
    func = ev["func"][0] if isinstance(ev["func"], list) else ev["func"]
    spec = ev["expected"][0] if isinstance(ev["func"], list) else ev.get("expected")
    options = (ev.get("options") or {}) if not isinstance(ev["func"], list) else {}
    if spec and spec["type"] == "rule":
        return METRICS[func](result, spec["rules"], **options)
    return METRICS[func](result, str(expected), **options)


def _task(domain: str, slug: str) -> dict:
    return next(t for t in domain_tasks(domain) if t["id"] == f"ns-{domain}-{slug}")


def test_each_domain_has_train_and_eval_tasks_with_solutions():
    for domain in DOMAINS:
        tasks = domain_tasks(domain)
        assert 3 <= len(tasks) <= 4, domain
        assert {t["nextstate"]["split"] for t in tasks} == {"train", "eval"}, domain
        for t in tasks:
            assert t["nextstate"]["solution"][-1] == "DONE" and t["nextstate"]["files"] == "generated", t["id"]


def test_gimp_metrics_tell_the_edited_image_from_the_original(files, tmp_path):
    from PIL import Image, ImageEnhance

    harbour, lighthouse = files / "gimp" / "harbour.png", files / "gimp" / "lighthouse.png"
    flipped = tmp_path / "flipped.png"
    Image.open(harbour).transpose(Image.Transpose.FLIP_LEFT_RIGHT).save(flipped)
    flip = _task("gimp", "flip-harbour")
    assert _score(flip, str(flipped), harbour) == 1.0 and _score(flip, str(harbour), harbour) == 0.0

    small = tmp_path / "small.png"
    Image.open(harbour).resize((160, 120)).save(small)
    scale = _task("gimp", "scale-harbour")
    assert _score(scale, str(small)) == 1.0 and _score(scale, str(harbour)) == 0.0
    assert METRICS["check_structure_sim_resized"](str(small), str(harbour)) == 1.0

    indexed = tmp_path / "indexed.png"
    Image.open(lighthouse).quantize(256).save(indexed)
    palette = _task("gimp", "indexed-lighthouse")
    assert _score(palette, str(indexed), lighthouse) == 1.0 and _score(palette, str(lighthouse), lighthouse) == 0.0

    dark = tmp_path / "dark.png"
    ImageEnhance.Brightness(Image.open(lighthouse)).enhance(0.7).save(dark)
    darken = _task("gimp", "darken-lighthouse")
    assert _score(darken, str(dark), lighthouse) == 1.0 and _score(darken, str(lighthouse), lighthouse) == 0.0
    assert Image.open(harbour).transpose(Image.Transpose.FLIP_LEFT_RIGHT).tobytes() != Image.open(harbour).tobytes()


def test_vlc_files_play_long_enough_and_the_starting_vlcrc_scores_0(files, tmp_path):
    for name in ("chime.wav", "waves.wav"):
        with wave.open(str(files / "vlc" / name)) as w:
            assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
            assert w.getnframes() / w.getframerate() >= 60  # still playing when the evaluator asks
    vlcrc = tmp_path / "start-vlcrc"  # every episode's HOME starts with this one
    vlcrc.write_text(FIRST_RUN_FILES[VLC_PROFILE])
    for slug in ("minimal-view", "recordings-folder", "one-instance-from-file"):
        assert _score(_task("vlc", slug), str(vlcrc)) == 0.0, slug
    saved = tmp_path / "vlcrc"  # what VLC writes on Save: every option, the changed ones uncommented
    saved.write_text("#qt-minimal-view=0\nqt-minimal-view=1\ninput-record-path=/home/user/Music/recordings\n"
                     "one-instance-when-started-from-file=0\n")
    for slug in ("minimal-view", "recordings-folder", "one-instance-from-file"):
        assert _score(_task("vlc", slug), str(saved)) == 1.0, slug
    status = tmp_path / "status.xml"
    status.write_text("<root><state>playing</state><information><category name='meta'>"
                      "<info name='filename'>chime.wav</info></category></information></root>")
    play = _task("vlc", "play-chime")
    assert _score(play, str(status)) == 1.0
    status.write_text(status.read_text().replace("chime", "waves"))
    assert _score(play, str(status)) == 0.0


def test_thunderbird_profile_opens_one_local_account_and_the_metrics_read_it(files, tmp_path):
    d = files / "thunderbird"
    prefs = thunderbird_prefs((d / "prefs.js").read_text())
    assert prefs["mail.server.server1.type"] == "none" and prefs["mailnews.start_page.enabled"] is False
    assert "[InstallFDC34C9F024745EB]" in (d / "profiles.ini").read_text()
    assert "Default=ns.default" in (d / "installs.ini").read_text()
    inbox = (d / "Inbox").read_text()
    assert len(re.findall(r"^From - ", inbox, flags=re.M)) == 4 and "Subject: Invoice 2026-031" in inbox
    for slug in ("wide-view", "all-headers", "plain-text-body"):  # the starting prefs.js scores 0
        assert _score(_task("thunderbird", slug), str(d / "prefs.js")) == 0.0, slug
    changed = tmp_path / "prefs.js"
    changed.write_text((d / "prefs.js").read_text() + 'user_pref("mail.pane_config.dynamic", 1);\n'
                       'user_pref("mail.show_headers", 2);\nuser_pref("mailnews.display.html_as", 1);\n'
                       'user_pref("mailnews.display.prefer_plaintext", true);\n')
    for slug in ("wide-view", "all-headers", "plain-text-body"):
        assert _score(_task("thunderbird", slug), str(changed)) == 1.0, slug
    rules = tmp_path / "msgFilterRules.dat"  # as Thunderbird writes the filter the task asks for
    rules.write_text('version="9"\nlogging="no"\nname="Invoices"\nenabled="yes"\ntype="17"\naction="Mark flagged"\n'
                     'condition="AND (subject,contains,Invoice)"\n')
    assert thunderbird_filters(rules.read_text())[0]["action"] == "Mark flagged"
    star = _task("thunderbird", "star-invoices-filter")
    assert _score(star, str(rules)) == 1.0
    rules.write_text(rules.read_text().replace("Mark flagged", "Mark read"))
    assert _score(star, str(rules)) == 0.0


def test_chrome_site_pages_link_each_other(files):
    site = files / "chrome" / "site"
    pages = sorted(p.name for p in site.iterdir())
    assert pages == ["contact.html", "events.html", "hours.html", "index.html"]
    for p in pages:
        html = (site / p).read_text()
        assert all(f'href="{q}"' in html for q in pages) and "<title>" in html
    bar = {"bookmark_bar": {"children": [{"type": "url", "url": "file:///home/user/site/index.html"}]}}
    assert _score(_task("chrome", "bookmark-home"), bar) == 1.0
    assert _score(_task("chrome", "bookmark-hours"), bar) == 0.0
    tabs = [{"url": "file:///home/user/site/index.html"}, {"url": "file:///home/user/site/events.html"}]
    assert _score(_task("chrome", "events-new-tab"), tabs) == 1.0
    assert _score(_task("chrome", "events-new-tab"), tabs[:1]) == 0.0
    assert _score(_task("chrome", "dark-mode"), "dark") == 1.0 and _score(_task("chrome", "dark-mode"), "system") == 0.0


def test_vs_code_expected_file_differs_from_the_input_only_by_the_replacement(files):
    d = files / "vs_code"
    before, after = (d / "notes.txt").read_text(), (d / "notes_expected.txt").read_text()
    assert "colour" in before and "colour" not in after and before.replace("colour", "color") == after
    replace = _task("vs_code", "replace-colour")
    assert _score(replace, str(d / "notes_expected.txt"), d / "notes_expected.txt") == 1.0
    assert _score(replace, str(d / "notes.txt"), d / "notes_expected.txt") == 0.0
    settings = {"editor.fontSize": 16}
    path = d.parent / "settings.json"
    path.write_text(json.dumps(settings))
    assert _score(_task("vs_code", "font-size"), str(path)) == 1.0
    assert _score(_task("vs_code", "tab-size"), str(path)) == 0.0


def test_the_app_tasks_run_under_a_window_manager():
    assert GUIConfig(task_set="apps").window_manager == "openbox"
    assert GUIConfig().window_manager is None  # the bundled GTK tasks keep their window positions
    assert GUIConfig(task_set="apps", window_manager="openbox").window_manager == "openbox"


@pytest.mark.integration
def test_vs_code_tasks_are_refused_at_setup_where_code_is_not_in_the_guest(tmp_path, monkeypatch):
    from tests.test_gui_app_tasks import _require_sandbox_root

    _require_sandbox_root()
    monkeypatch.setenv("NEXTSTATE_CACHE", str(tmp_path))
    env = GUIEnv(split="all", task_set="apps")
    try:
        for task in domain_tasks("vs_code"):
            try:
                env.reset(options={"task": task})
            except SetupError as exc:
                assert str(exc) == not_installed("code"), task["id"]
                assert "'code' is not installed" in str(exc) and "env.guest_packages" in str(exc), task["id"]
            else:
                assert env.desktop.execute(["sh", "-c", "command -v code"]).ok, f"{task['id']} ran without code"
    finally:
        env.close()
