"""Saved scripts: standalone Playwright scripts a person keeps, and everything done to them.

- `export/`: a browser run compiled into a script, built as syntax (`exporter`, `steps`, `assertions`,
  checked by `gate` before it is written).
- `write/`: the model writing a script for a task (`writer`), with a lint that is advice for the model,
  never a wall (`policy`, its tables in `policy_rules`).
- `replay.py`: running a saved script again, inside the sandbox, with the origins its header names.
- `heal/`: a replay whose page changed, repaired by the model: `service` answers outside the sandbox,
  `hook_in_sandbox.py` runs inside it, `rewrite` writes the healed script.
- `header.py` (the first lines every saved script carries: its origins), `intent.py` (each step's intent
  comment) and `literals.py` (every value as a Python literal) are shared by the parts above.

Every run of a script goes through `qvl_agent.sandbox`. This package never imports Qt, the tray, the
agent loop or the commands; the exporter and replay need no model (only `write` and `heal` ask one).
"""
