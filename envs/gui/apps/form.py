"""Sign-up form (GTK): Name, Email, a Plan choice, a newsletter check box; Submit writes the form as JSON.

form.py [--out ~/Documents/signup.json] [--name NAME]
"""

from __future__ import annotations

import argparse
import os

from _nsapp import Gtk, named, run, window, write_json


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="~/Documents/signup.json")
    p.add_argument("--name", default="", help="pre-filled name")
    args = p.parse_args()

    w = window("Sign-up form", 420, 330)
    grid = Gtk.Grid(column_spacing=10, row_spacing=8)
    w.add(grid)

    name = named(Gtk.Entry(text=args.name), "Name")
    email = named(Gtk.Entry(), "Email")
    grid.attach(Gtk.Label(label="Name", xalign=0), 0, 0, 1, 1)
    grid.attach(name, 1, 0, 3, 1)
    grid.attach(Gtk.Label(label="Email", xalign=0), 0, 1, 1, 1)
    grid.attach(email, 1, 1, 3, 1)

    grid.attach(Gtk.Label(label="Plan", xalign=0), 0, 2, 1, 1)
    free = Gtk.RadioButton.new_with_label(None, "Free")
    plans = [free] + [Gtk.RadioButton.new_with_label_from_widget(free, label) for label in ("Pro", "Team")]
    for i, rb in enumerate(plans):
        grid.attach(rb, 1 + i, 2, 1, 1)

    subscribe = Gtk.CheckButton(label="Subscribe to newsletter")
    grid.attach(subscribe, 0, 3, 4, 1)

    status = named(Gtk.Label(label="Not submitted", xalign=0), "Status")
    submit = Gtk.Button(label="Submit")
    clear = Gtk.Button(label="Clear")
    grid.attach(submit, 0, 4, 2, 1)
    grid.attach(clear, 2, 4, 2, 1)
    grid.attach(status, 0, 5, 4, 1)

    def on_submit(_btn):
        plan = next(rb.get_label() for rb in plans if rb.get_active())
        write_json(
            os.path.expanduser(args.out),
            {
                "name": name.get_text(),
                "email": email.get_text(),
                "plan": plan,
                "subscribe": subscribe.get_active(),
            },
        )
        status.set_text("Submitted")

    def on_clear(_btn):
        name.set_text("")
        email.set_text("")
        free.set_active(True)
        subscribe.set_active(False)
        status.set_text("Form cleared")  # not the opening text: a step's checks can tell a Clear happened

    submit.connect("clicked", on_submit)
    clear.connect("clicked", on_clear)
    run(w)


if __name__ == "__main__":
    main()
